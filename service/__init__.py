"""The fusecut HTTP service: FastAPI routes, limits and admission, the plan cache, metrics and
the dashboard, and the planner and worker processes it owns."""
