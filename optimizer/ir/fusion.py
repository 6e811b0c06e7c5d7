"""The fusion IR: tensors, scalars, ops and the fusion that holds them.

A fusion is a list of ops in topological (program) order. Values are named as in nvFuser's printed
definitions (``T3``, ``S7``); an op reads values by name and defines new ones. Tensor values carry
their structure only (rank, dtype, which axes are broadcast); concrete sizes come from binding input
metadata (see ``optimizer.analysis.shapes``). Scalars are host values: constants, fusion inputs, or
results of scalar ops such as ``size``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fusecut.optimizer.ir.dtypes import DType


@dataclass(frozen=True)
class Ref:
    """A reference to a scalar value inside an op attribute (e.g. an entry of a shape list)."""

    name: str


@dataclass
class TensorValue:
    name: str
    dtype: DType
    # Per axis: True when the values do not vary along the axis (nvFuser's broadcast IterDomain,
    # expanded or not). Such axes are never stored (compact storage).
    broadcast: tuple[bool, ...]
    # Fusion inputs only: what define_tensor declared.
    declared_shape: tuple[int, ...] | None = None
    contiguity: tuple[bool | None, ...] | None = None
    stride_order: tuple[int, ...] | None = None

    @property
    def rank(self) -> int:
        return len(self.broadcast)


@dataclass
class ScalarValue:
    name: str
    dtype: DType
    value: bool | int | float | complex | None = None  # a constant; None for inputs and derived


@dataclass
class Op:
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any] = field(default_factory=dict)

    def refs(self) -> list[str]:
        """Every value this op reads: its operands and the scalars its attributes refer to."""
        out = list(self.inputs)
        for v in self.attrs.values():
            _collect_refs(v, out)
        return out


def _collect_refs(v: Any, out: list[str]) -> None:
    if isinstance(v, Ref):
        out.append(v.name)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _collect_refs(x, out)


@dataclass
class Fusion:
    tensors: dict[str, TensorValue] = field(default_factory=dict)
    scalars: dict[str, ScalarValue] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    # (tensor, axis) pairs marked ParallelType.stream, for stream lowering.
    stream_axes: list[tuple[str, int]] = field(default_factory=list)
    # output -> input it updates in place (nvFuser's ``fd.add_output(out, alias_input=inp)``)
    aliases: dict[str, str] = field(default_factory=dict)
    # the last inputs when random ops had no seed: drawn from torch's generator on every call,
    # never given by the caller (optimizer.ir.rng)
    implicit_rng: tuple[str, ...] = ()

    def is_tensor(self, name: str) -> bool:
        return name in self.tensors

    def tensor_inputs(self) -> list[str]:
        return [n for n in self.inputs if n in self.tensors]

    def scalar_inputs(self) -> list[str]:
        return [n for n in self.inputs if n in self.scalars]

    def caller_inputs(self) -> list[str]:
        """The inputs a caller gives: all but the implicit random-op seeds (``ir.rng``)."""
        return [n for n in self.inputs if n not in self.implicit_rng]

    def producers(self) -> dict[str, int]:
        """Value name -> index of the op that defines it."""
        return {out: i for i, op in enumerate(self.ops) for out in op.outputs}

    def consumers(self) -> dict[str, list[int]]:
        """Value name -> indices of the ops that read it (in order, without repeats)."""
        cons: dict[str, list[int]] = {}
        for i, op in enumerate(self.ops):
            for name in dict.fromkeys(op.refs()):
                cons.setdefault(name, []).append(i)
        return cons

    def tensor_ops(self) -> list[int]:
        """Indices of ops that produce tensors (scalar ops are host work, never segmented)."""
        return [i for i, op in enumerate(self.ops) if any(o in self.tensors for o in op.outputs)]

    def live_tensor_ops(self) -> list[int]:
        """Tensor ops some output depends on: the rest is dead code, never planned or run."""
        producer = {o: i for i in self.tensor_ops() for o in self.ops[i].outputs}
        live: set[int] = set()
        stack = [producer[o] for o in self.outputs if o in producer]
        while stack:
            i = stack.pop()
            if i not in live:
                live.add(i)
                stack.extend(producer[n] for n in self.ops[i].inputs if n in producer)
        return sorted(live)

    def value_dtype(self, name: str) -> DType:
        v = self.tensors.get(name) or self.scalars[name]
        return v.dtype
