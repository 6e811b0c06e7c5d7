"""The service's routes, one APIRouter per concern, included by service.app.create_app.

- plans: POST /v1/plan, GET /v1/plans/{plan_id}
- executions: POST /v1/execute, POST /v1/plans/{plan_id}/execute
- operations: GET /metrics, /healthz, /readyz, /
- dashboard: GET /dashboard
- docs: GET /docs (the OpenAPI document itself is service.openapi's)

A route reaches the service's state (service.core.Service) through the ``ServiceDep``
dependency (routes.dependencies), never through a closure.
"""
