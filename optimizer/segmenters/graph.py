"""The graph segmenters work on: tensor ops, who produces and consumes what, and forwarding.

Forwarding, as nvFuser forwards inputs and factories: a cheap unary op whose operand is a fusion
input (or another forwarded value), and a factory (full, iota), is recomputed in every segment
that uses it instead of being passed through global memory, unless it is a fusion output.
Reading the root input must cost no more than reading the forwarded value, so a narrowing cast
is not forwarded. Segmenters place only the other ops; ``closure`` adds the forwarded ops a
segment needs.
"""

from __future__ import annotations

from collections.abc import Iterable

from fusecut.optimizer.analysis.cost import segment_time
from fusecut.optimizer.analysis.opclass import Role, is_view, role
from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.analysis.streams import stage_of_ops
from fusecut.optimizer.ir.opspec import OpClass, get_spec
from fusecut.optimizer.kinds.rules import (
    ALL_KINDS,
    Kind,
    Rejection,
    Schedule,
    classify,
    segment_facts,
)
from fusecut.optimizer.profiles import DeviceProfile


class SegGraph:
    """A bound fusion as the segmenters see it, for one device and the kinds a plan may use:
    the live tensor ops, each tensor's producer and consumers, each op's role, the forwarded ops
    (recomputed wherever needed, never placed) and the ops segmenters place, and the stream stage
    of each op. It classifies candidate segments (``classify``) and prices them
    (``segment_time``), remembering both: the solvers ask again for the segments they keep."""

    def __init__(self, bound: Bound, profile: DeviceProfile,
                 kinds: frozenset[Kind] = ALL_KINDS):
        self.bound = bound
        self.profile = profile
        self.kinds = kinds
        fusion = bound.fusion
        self.fusion = fusion
        self.producer: dict[str, int] = {o: i for i in fusion.tensor_ops()
                                         for o in fusion.ops[i].outputs}
        self.ops: list[int] = fusion.live_tensor_ops()
        self.consumers: dict[str, list[int]] = {}
        for i in self.ops:
            for n in dict.fromkeys(fusion.ops[i].inputs):
                if n in fusion.tensors:
                    self.consumers.setdefault(n, []).append(i)
        self.roles = {i: role(fusion.ops[i], bound) for i in self.ops}
        self.outputs = set(fusion.outputs)
        self.inputs = set(fusion.tensor_inputs())
        # op -> its stream-loop stage; segments never mix stages ({}: no stream axes)
        self.stage_of: dict[int, int] = stage_of_ops(bound)
        self.forwarded: frozenset[int] = self._forwarding()
        self.placed: list[int] = [i for i in self.ops if i not in self.forwarded]
        self._cache: dict[tuple[frozenset[int], frozenset[str]], Schedule | Rejection] = {}
        self._closures: dict[frozenset[int], frozenset[int]] = {}
        self._times: dict[tuple[frozenset[int], frozenset[str]], float] = {}

    def _forwarding(self) -> frozenset[int]:
        fusion, bound = self.fusion, self.bound
        forwarded: set[int] = set()
        # Each forwarded tensor -> the fusion input its chain starts from (None for a factory),
        # filled in op order so that a chain is walked once, not once per link.
        roots: dict[str, str | None] = {}
        for i in self.ops:
            op = fusion.ops[i]
            if self.roles[i] is not Role.FUSIBLE or is_view(op) or len(op.outputs) != 1:
                continue
            out = op.outputs[0]
            if out in self.outputs:
                continue
            operands = [n for n in op.inputs if n in fusion.tensors]
            root = roots.get(operands[0], operands[0]) if operands else None
            if get_spec(op.name).op_class is not OpClass.FACTORY:
                if len(set(operands)) != 1 or (operands[0] not in self.inputs
                                               and operands[0] not in roots):
                    continue
                if root is not None and bound.nbytes(root) > bound.nbytes(out):
                    continue  # a narrowing op: reading its input would cost more than its result
            if any(self.roles[c] not in (Role.FUSIBLE, Role.REDUCTION)
                   for c in self.consumers.get(out, ())):
                continue  # library, fallback and segment_set read from global memory
            if self.stage_of and any(self.stage_of[c] != self.stage_of[i]
                                     for c in self.consumers.get(out, ())):
                continue  # recomputing it in another stream stage would mix stages
            forwarded.add(i)
            roots[out] = root
        return frozenset(forwarded)

    # ---- segments ---------------------------------------------------------------------------

    def closure(self, ops: Iterable[int]) -> frozenset[int]:
        """``ops`` plus the forwarded ops they need, transitively (remembered for a frozenset:
        the solvers ask again for the segments they keep)."""
        if isinstance(ops, frozenset):
            hit = self._closures.get(ops)
            if hit is None:
                hit = self._closures[ops] = self._closure(ops)
            return hit
        return self._closure(ops)

    def _closure(self, ops: Iterable[int]) -> frozenset[int]:
        out = set(ops)
        stack = list(out)
        while stack:
            i = stack.pop()
            for n in self.fusion.ops[i].inputs:
                p = self.producer.get(n)
                if p is not None and p in self.forwarded and p not in out:
                    out.add(p)
                    stack.append(p)
        return frozenset(out)

    def produced(self, ops: Iterable[int]) -> set[str]:
        return {o for i in ops for o in self.fusion.ops[i].outputs if o in self.fusion.tensors}

    def classify(self, ops: Iterable[int], written: Iterable[str]) -> Schedule | Rejection:
        key = (self.closure(ops), frozenset(written))
        hit = self._cache.get(key)
        if hit is None:
            stages = {self.stage_of[i] for i in key[0]} if self.stage_of else ()
            if len(stages) > 1:
                hit = Rejection(f"mixes ops of stream stages {sorted(stages)}: each stream "
                                "loop runs whole segments")
            else:
                hit = classify(self.bound, key[0], key[1], self.profile, self.kinds,
                               segment_facts(self.bound, key[0], self.roles))
            self._cache[key] = hit
        return hit

    def segment_time(self, ops: frozenset[int], written: frozenset[str]) -> float:
        """Estimated seconds of a segment (see ``analysis.cost``), which must classify."""
        key = (ops, written)
        hit = self._times.get(key)
        if hit is None:
            schedule = self.classify(ops, written)
            assert schedule, schedule
            hit = self._times[key] = segment_time(self.bound, schedule, self.profile)
        return hit

    def written(self, group: Iterable[int]) -> frozenset[str]:
        """Tensors a group of placed ops must write: the fusion outputs it computes, and what any
        op outside it consumes."""
        group = set(group)
        out = set()
        for i in group:
            for o in self.fusion.ops[i].outputs:
                if o not in self.fusion.tensors:
                    continue
                if o in self.outputs or any(c not in group and c not in self.forwarded
                                            for c in self.consumers.get(o, ())):
                    out.add(o)
        return frozenset(out)

    def derive_writes(self, groups: list[frozenset[int]]) -> list[frozenset[str]]:
        """What each segment of an ordered segmentation writes: every fusion output once (by the
        first segment computing it), and every tensor a later segment reads (by the first earlier
        segment computing it)."""
        produced = [self.produced(self.closure(g)) for g in groups]
        first: dict[str, int] = {}  # tensor -> the first segment computing it
        for k, p in enumerate(produced):
            for t in p:
                first.setdefault(t, k)
        writes: list[set[str]] = [set() for _ in groups]
        for out in self.outputs:
            k = first.get(out)
            if k is not None and self.producer.get(out) not in self.forwarded:
                writes[k].add(out)
        for k, g in enumerate(groups):
            for i in self.closure(g):
                for n in self.fusion.ops[i].inputs:
                    if n not in self.fusion.tensors or n in produced[k] or n in self.inputs:
                        continue
                    j = first.get(n)
                    if j is None or j >= k:
                        raise ValueError(f"segment {k} reads {n}, which no earlier segment "
                                         f"computes")
                    writes[j].add(n)
        return [frozenset(w) for w in writes]
