"""The SDK's PlanView: a read-only view of a plan's JSON, the same whether it was made in-process
or by the service (the optimizer's Plan is ``optimizer.plan.plan.Plan``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fusecut.optimizer.plan.render import human_bytes, to_dot, to_svg


@dataclass(frozen=True)
class SegmentView:
    data: dict[str, Any]

    @property
    def index(self) -> int:
        return self.data["index"]

    @property
    def kind(self) -> str:
        return self.data["kind"]

    @property
    def ops(self) -> list[int]:
        return self.data["ops"]

    @property
    def inputs(self) -> list[str]:
        return [t["tensor"] for t in self.data["inputs"]]

    @property
    def outputs(self) -> list[str]:
        return [t["tensor"] for t in self.data["outputs"]]

    @property
    def definition_py(self) -> str:
        return self.data["definition_py"]

    @property
    def input_map(self) -> dict[str, str]:
        return self.data["input_map"]

    @property
    def output_map(self) -> dict[str, str]:
        return self.data["output_map"]


class PlanView:
    """A fusion's plan: ``segments``, ``boundaries``, ``totals``, ``baseline``; ``json`` holds
    everything (the wire form).

    ``plan``: the optimizer's Plan, when made in this process (its JSON is rendered on first
    read: most in-process plans are run, never read, and rendering took a fifth of a greedy
    plan's time). ``source``: the definition a service planned, when this client sent it."""

    def __init__(self, data: dict[str, Any] | None = None, plan: Any = None,
                 source: Any = None):
        if data is None and plan is None:
            raise ValueError("a PlanView needs the plan's JSON or the plan")
        self._json = data
        self.plan = plan
        self.source = source

    @property
    def json(self) -> dict[str, Any]:
        if self._json is None:
            self._json = self.plan.to_json()
        return self._json

    @property
    def plan_id(self) -> str:
        return self.json["plan_id"]

    @property
    def fusion_id(self) -> str:
        return self.json["fusion_id"]

    @property
    def segments(self) -> list[SegmentView]:
        return [SegmentView(s) for s in self.json["segments"]]

    @property
    def boundaries(self) -> list[dict[str, Any]]:
        return self.json["boundaries"]

    @property
    def totals(self) -> dict[str, Any]:
        return self.json["totals"]

    @property
    def baseline(self) -> dict[str, Any]:
        return self.json["baseline"]

    @property
    def io_bytes(self) -> int:
        return self.totals["io_bytes"]

    @property
    def io_ratio(self) -> float:
        return self.totals["io_ratio"]

    def to_json(self) -> dict[str, Any]:
        return self.json

    def svg(self) -> str:
        return to_svg(self.json)

    def dot(self) -> str:
        return to_dot(self.json)

    def __repr__(self) -> str:
        kinds = ", ".join(s.kind for s in self.segments)
        return (f"PlanView({self.plan_id}: {len(self.segments)} segment(s) [{kinds}], "
                f"{human_bytes(self.io_bytes)} moved, io_ratio {self.io_ratio:.3f}, greedy "
                f"{human_bytes(self.baseline['io_bytes'])})")

