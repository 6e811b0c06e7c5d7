"""Talk to a fusecut service: ``Client`` (sync) and ``AsyncClient`` (asyncio), httpx underneath.

    with fusecut.Client("http://127.0.0.1:8000") as client:
        plan = client.plan(text)                       # a repro with an inputs = [...] list
        plan = client.plan(fd, [x, y])                 # a FusionDefinition and its inputs
        result = client.execute(fd, [x, y])            # result.outputs, result.timings

Plans come back as the same ``fusecut.PlanView`` that local planning returns. Tensors travel as
safetensors (``wire="safetensors"``, the default) or as KServe-v2 JSON (``wire="json"``). A
refusal raises ``ServiceError`` carrying the service's problem+json (status, title, detail); a
service that cannot be reached (not running, a wrong URL, no answer in time) raises
``ServiceUnreachable`` naming the URL.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch

from fusecut.engine import as_metadata
from fusecut.optimizer.errors import FusecutError, counted
from fusecut.optimizer.ir.fusion import Fusion
from fusecut.optimizer.ir.nvtext import ParsedDefinition, parse_text
from fusecut.optimizer.ir.wire import fusion_from_json, fusion_to_json, meta_to_json
from fusecut.plan import PlanView
from fusecut.runtime.executor import Execution, SegmentTiming
from fusecut.wire.safetensors import metadata as safetensors_metadata
from fusecut.wire.tensors import dump_safetensors, from_json, load_safetensors, to_json

DEFAULT_URL = "http://127.0.0.1:8000"
Definition = Any  # FusionDefinition, Fusion, ParsedDefinition, nvFuser text or a path to it


class ServiceError(FusecutError):
    """The service refused a request; ``problem`` is its problem+json body."""

    def __init__(self, status: int, problem: dict[str, Any]):
        self.status = status
        self.problem = problem
        self.title = problem.get("title", "error")
        self.detail = problem.get("detail", "")
        super().__init__(f"{status} {self.title}: {self.detail}")


class ServiceUnreachable(FusecutError):
    """The service could not be reached, or did not answer: ``url`` is what was asked. (httpx's
    own error, which named no URL, is its ``__cause__``.)"""

    def __init__(self, url: str, error: httpx.TransportError):
        self.url = url
        if isinstance(error, httpx.TimeoutException):
            what = f"the fusecut service at {url} did not answer in time ({type(error).__name__})"
        elif isinstance(error, httpx.ConnectError):
            what = (f"cannot connect to the fusecut service at {url}: is it running? "
                    f"(`fusecut serve` starts one; {error or 'connection refused'})")
        else:
            what = f"the connection to the fusecut service at {url} failed: {error!r}"
        super().__init__(what)


def _unreachable(http: httpx.Client | httpx.AsyncClient, path: str,
                 error: httpx.TransportError) -> ServiceUnreachable:
    return ServiceUnreachable(str(http.base_url.join(path)), error)


@dataclass
class RemoteExecution(Execution):
    """An execution on the service: outputs, per-segment timings, and which plan ran where."""

    plan_id: str = ""


# ---- request building (shared by both clients) -----------------------------------------------

def _wire_definition(definition: Definition) -> tuple[str | dict[str, Any], Fusion | None]:
    """(what to send, the fusion when it is known here)."""
    if isinstance(definition, Path):
        definition = definition.read_text()
    if isinstance(definition, str):
        return definition, None
    if isinstance(definition, ParsedDefinition):
        definition = definition.fusion
    fusion = getattr(definition, "fusion", definition)  # a FusionDefinition holds one
    if not isinstance(fusion, Fusion):
        raise TypeError(f"a definition is a FusionDefinition, Fusion, text or path, not "
                        f"{type(definition).__name__}")
    return fusion_to_json(fusion), fusion


def plan_body(definition: Definition, inputs: list[Any] | None,
              options: dict[str, Any]) -> dict[str, Any]:
    wire, _ = _wire_definition(definition)
    body: dict[str, Any] = {"definition": wire, "options": options}
    if inputs is not None:
        # metadata with a -1 extent (any size of it: service.symbolic) goes as given
        body["inputs"] = [dict(m) if isinstance(m, dict) and -1 in (m.get("shape") or ())
                          else meta_to_json(as_metadata([m])[0]) for m in inputs]
    return body


def _named_tensors(fusion: Fusion, tensors: list[Any] | dict[str, Any]) -> dict[str, Any]:
    if isinstance(tensors, dict):
        named = dict(tensors)
    else:
        if len(tensors) != len(fusion.inputs):
            raise ValueError(f"the fusion has {counted(len(fusion.inputs), 'input')} "
                             f"({', '.join(fusion.inputs)}), got "
                             f"{counted(len(tensors), 'value')}")
        named = dict(zip(fusion.inputs, tensors))
    for name, value in named.items():
        if not isinstance(value, torch.Tensor):  # a scalar input: a one-element tensor
            dtype = torch.bool if isinstance(value, bool) else \
                torch.int64 if isinstance(value, int) else torch.float64
            named[name] = torch.tensor(value, dtype=dtype)
    return named


def execute_request(definition: Definition | None, tensors: list[Any] | dict[str, Any],
                    options: dict[str, Any], wire: str, plan_id: str | None = None,
                    fusion: Fusion | None = None) -> tuple[dict[str, Any], Fusion]:
    """The keyword arguments of the httpx request, and the fusion whose outputs come back."""
    if fusion is None:
        fusion = fusion_of(definition)
    named = _named_tensors(fusion, tensors)
    sent_definition = None if plan_id else fusion_to_json(fusion)
    if wire == "json":
        body = {"inputs": [to_json(n, t) for n, t in named.items()], "options": options}
        body.update({"plan_id": plan_id} if plan_id else {"definition": sent_definition})
        return {"json": body}, fusion
    if wire != "safetensors":
        raise ValueError(f"wire is 'safetensors' or 'json', not {wire!r}")
    data = {"options": json.dumps(options)}
    data.update({"plan_id": plan_id} if plan_id else {"definition": json.dumps(sent_definition)})
    files = {"tensors": ("tensors.safetensors", dump_safetensors(named),
                         "application/octet-stream")}
    return {"data": data, "files": files}, fusion


def _checked(response: httpx.Response) -> httpx.Response:
    if response.status_code < 400:
        return response
    try:
        problem = response.json()
    except ValueError:
        problem = {"title": response.reason_phrase, "detail": response.text[:500]}
    raise ServiceError(response.status_code, problem)


def plan_of(response: httpx.Response, source: Definition | None = None) -> PlanView:
    # the source, so that the plan can be executed without naming its fusion again
    return PlanView(_checked(response).json(), source=source)


def execution_of(response: httpx.Response, fusion: Fusion) -> RemoteExecution:
    _checked(response)
    if response.headers.get("content-type", "").startswith("application/json"):
        body = response.json()
        outputs = [from_json(t, 1 << 62) for t in body["outputs"]]
        plan_id, backend, segments = body["plan_id"], body["backend"], body["segments"]
    else:
        by_name = load_safetensors(response.content)
        outputs = [by_name[n] for n in fusion.outputs]
        plan_id = response.headers["x-fusecut-plan-id"]
        backend = response.headers["x-fusecut-backend"]
        # the timings are in the body's metadata (a header, only while they are few)
        found = safetensors_metadata(response.content).get("fusecut.segments")
        segments = json.loads(found if found is not None
                              else response.headers.get("x-fusecut-segments", "[]"))
    return RemoteExecution(outputs, [SegmentTiming(**s) for s in segments], backend, plan_id)


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


# ---- the clients -------------------------------------------------------------------------------

class Client:
    """A synchronous client of a fusecut service."""

    def __init__(self, base_url: str = DEFAULT_URL, *, api_key: str | None = None,
                 timeout: float = 120.0, transport: httpx.BaseTransport | None = None):
        self._http = httpx.Client(base_url=base_url, headers=_headers(api_key), timeout=timeout,
                                  transport=transport)

    def plan(self, definition: Definition, inputs: list[Any] | None = None,
             **options: Any) -> PlanView:
        """Plan a definition for inputs (tensors, numbers or metadata); no tensors are sent."""
        response = self._send("POST", "/v1/plan", json=plan_body(definition, inputs, options))
        return plan_of(response, definition)

    def get_plan(self, plan_id: str) -> PlanView:
        return plan_of(self._send("GET", f"/v1/plans/{plan_id}"))

    def execute(self, definition: Definition | PlanView, tensors: list[Any] | dict[str, Any],
                *, wire: str = "safetensors", fusion: Fusion | None = None,
                **options: Any) -> RemoteExecution:
        """Run a definition (or a plan made before, with its ``fusion``) on tensors."""
        plan_id = definition.plan_id if isinstance(definition, PlanView) else None
        kwargs, fusion = execute_request(None if plan_id else definition, tensors, options, wire,
                                         plan_id, fusion or _fusion_of_plan(definition))
        return execution_of(self._send("POST", "/v1/execute", **kwargs), fusion)

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise _unreachable(self._http, path, e) from e

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncClient:
    """The asyncio twin of ``Client``."""

    def __init__(self, base_url: str = DEFAULT_URL, *, api_key: str | None = None,
                 timeout: float = 120.0, transport: httpx.AsyncBaseTransport | None = None):
        self._http = httpx.AsyncClient(base_url=base_url, headers=_headers(api_key),
                                       timeout=timeout, transport=transport)

    async def plan(self, definition: Definition, inputs: list[Any] | None = None,
                   **options: Any) -> PlanView:
        body = plan_body(definition, inputs, options)
        return plan_of(await self._send("POST", "/v1/plan", json=body), definition)

    async def get_plan(self, plan_id: str) -> PlanView:
        return plan_of(await self._send("GET", f"/v1/plans/{plan_id}"))

    async def execute(self, definition: Definition | PlanView, tensors: list[Any] | dict[str, Any],
                      *, wire: str = "safetensors", fusion: Fusion | None = None,
                      **options: Any) -> RemoteExecution:
        plan_id = definition.plan_id if isinstance(definition, PlanView) else None
        kwargs, fusion = execute_request(None if plan_id else definition, tensors, options, wire,
                                         plan_id, fusion or _fusion_of_plan(definition))
        return execution_of(await self._send("POST", "/v1/execute", **kwargs), fusion)

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self._http.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise _unreachable(self._http, path, e) from e

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


def fusion_of(definition: Definition | dict[str, Any]) -> Fusion:
    """The fusion of a definition in any form a client accepts (parsed here, never run)."""
    if isinstance(definition, Path):
        definition = definition.read_text()
    if isinstance(definition, str):
        if not definition.lstrip().startswith("{"):
            return parse_text(definition).fusion
        definition = json.loads(definition)
    if isinstance(definition, dict):
        return fusion_from_json(definition)
    return _wire_definition(definition)[1]


def _fusion_of_plan(definition: Any) -> Fusion | None:
    """A plan carries its ops, not its definition: the fusion comes from where it was made."""
    if not isinstance(definition, PlanView):
        return None
    if definition.plan is not None:
        return definition.plan.fusion
    if definition.source is not None:
        return fusion_of(definition.source)
    raise ValueError("this plan came from get_plan(): pass fusion=<its Fusion> to execute it "
                     "(or execute the definition itself)")
