"""``fusecut.FusionDefinition``: nvFuser's frontend API, backed by fusecut.

An existing ``def nvfuser_fusion_idN(fd: FusionDefinition)`` runs unchanged with
``from fusecut import FusionDefinition, DataType``; ``fd.execute(inputs)`` runs the fusion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fusecut.optimizer.ir.builder import FusionBuilder, ScalarHandle, TensorHandle, VectorHandle
from fusecut.optimizer.ir.dtypes import NVFUSER_DTYPES
from fusecut.optimizer.ir.fusion import Fusion
from fusecut.optimizer.ir.opspec import all_specs
from fusecut.optimizer.ir.printer import print_fusion
from fusecut.plan import PlanView


class _DataTypeMeta(type):
    def __getattr__(cls, name: str):
        raise AttributeError(f"DataType has no member {name!r}")


class DataType(metaclass=_DataTypeMeta):
    """nvFuser's DataType names, mapped to fusecut's dtypes (``Null`` is None)."""

    Bool = NVFUSER_DTYPES["Bool"]
    Int32 = NVFUSER_DTYPES["Int32"]
    Int = NVFUSER_DTYPES["Int"]
    Index = NVFUSER_DTYPES["Index"]
    Half = NVFUSER_DTYPES["Half"]
    BFloat16 = NVFUSER_DTYPES["BFloat16"]
    Float = NVFUSER_DTYPES["Float"]
    Double = NVFUSER_DTYPES["Double"]
    Null = None


class ParallelType:
    stream = "stream"


class _Ops:
    def __init__(self, fd: FusionDefinition):
        self._fd = fd

    def __getattr__(self, name: str):
        specs = all_specs()
        if name not in specs:
            raise AttributeError(f"fusecut has no op {name!r}")

        def call(*args: Any, **kwargs: Any):
            outs = self._fd._live().op(name, list(args), kwargs)
            return outs[0] if len(outs) == 1 else tuple(outs)

        call.__name__ = name
        return call


class _Sched:
    def __init__(self, fd: FusionDefinition):
        self._fd = fd

    def parallelize(self, tensor: TensorHandle, axis: int, parallel_type: str) -> None:
        self._fd._live().parallelize(tensor, axis, parallel_type)


class FusionDefinition:
    """Build a fusion with nvFuser's API inside ``with FusionDefinition() as fd:``."""

    def __init__(self, id: int | None = None, max_length: int = 100_000):
        self._builder = FusionBuilder(max_length)
        self._finished = False
        self.ops = _Ops(self)
        self.sched = _Sched(self)
        self._local = None  # fusecut.local.Local: plans and compiled programs, made on use
        self._warm = None  # the last compiled program's warm call

    # ---- definition -------------------------------------------------------------------------

    def __enter__(self) -> FusionDefinition:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._finished = True

    def _live(self) -> FusionBuilder:
        if self._finished:
            raise RuntimeError("this FusionDefinition is complete; define ops inside its "
                               "with block")
        return self._builder

    def define_tensor(self, *args: Any, **kwargs: Any) -> TensorHandle:
        return self._live().define_tensor(*args, **kwargs)

    def define_scalar(self, *args: Any, **kwargs: Any) -> ScalarHandle:
        return self._live().define_scalar(*args, **kwargs)

    define_constant = define_scalar

    def define_vector(self, *args: Any, **kwargs: Any) -> VectorHandle:
        return self._live().define_vector(*args, **kwargs)

    def add_output(self, tensor: TensorHandle, alias_input: TensorHandle | None = None) -> None:
        self._live().add_output(tensor, alias_input)

    @property
    def fusion(self) -> Fusion:
        return self._builder.fusion

    def __repr__(self) -> str:
        return print_fusion(self.fusion)

    # ---- running ----------------------------------------------------------------------------

    @classmethod
    def from_fusion(cls, fusion: Fusion) -> FusionDefinition:
        """A completed definition holding an existing fusion (e.g. one segment of a plan)."""
        fd = cls()
        fd._builder.fusion = fusion
        fd._finished = True
        return fd

    def plan(self, inputs: list[Any], **options: Any) -> PlanView:
        """Plan the fusion for these inputs (tensors, numbers or metadata); no tensors needed.

        Options are the plan options, each declared with its default and range in
        ``fusecut.optimizer.options`` (segmenter, time_limit_s, device, ...); a bad one is
        refused, named. ``remote=URL`` plans with a fusecut service instead.
        """
        remote = options.pop("remote", None)
        if remote is not None:
            from fusecut.client import Client

            with Client(remote) as client:
                return client.plan(self.fusion, inputs, **options)
        return self._local_state().plan(inputs, **options)

    def segment(self, inputs: list[Any], **options: Any) -> list[SegmentDefinition]:
        """The plan's segments as standalone definitions with maps to this one."""
        planned = self.plan(inputs, **options)
        internal = planned._internal
        if internal is None:  # planned by a service: rebuild it here from its JSON
            from fusecut.local import as_metadata
            from fusecut.optimizer.plan.restore import restore_plan

            internal = restore_plan(self.fusion, as_metadata(inputs), planned.json)
        out = []
        for seg in internal.segments:
            out.append(SegmentDefinition(seg.index, seg.kind.value,
                                         FusionDefinition.from_fusion(seg.sub.fusion),
                                         dict(seg.sub.input_map), dict(seg.sub.output_map)))
        return out

    def execute(self, inputs: list[Any], **options: Any) -> list[Any]:
        """Plan (cached per input metadata), compile (cached) and run; return the outputs.

        A repeated call with arguments like the last one's (shapes, strides, dtypes, device,
        alignment) goes straight to the compiled kernels. ``return_execution=True`` returns the
        outputs with per-segment timings; ``remote=URL`` runs on a fusecut service instead.
        """
        warm = self._warm
        if warm is not None and not options:
            outputs = warm(inputs)
            if outputs is not None:
                return outputs
        remote = options.pop("remote", None)
        if remote is not None:
            from fusecut.client import Client

            with Client(remote) as client:
                return client.execute(self.fusion, inputs, **options).outputs
        local = self._local_state()
        result = local.execute(inputs, **options)
        self._warm = local.warm
        return result

    def _local_state(self):
        if self._local is None:
            from fusecut.local import Local

            self._local = Local(self.fusion)
        return self._local


@dataclass(frozen=True)
class SegmentDefinition:
    """One segment of a plan: its kind, its definition, and the maps from its inputs and
    outputs to the original definition's tensors."""

    index: int
    kind: str
    definition: FusionDefinition
    input_map: dict[str, str]
    output_map: dict[str, str]
