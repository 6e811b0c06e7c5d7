"""One-pass (online) log-sum-exp statistics: ``m = max(x)`` and ``s = sum(exp(x - m))`` over the
same axes, computed in a single pass over ``x`` with a running maximum and a sum rescaled whenever
the maximum grows (flash-attention's online softmax).

Written as the definition says, ``s`` depends on ``m`` broadcast back over the row, so the row
must stay on chip (a normalization segment) or be read twice (two segments). A row too long for
the chip (cross-entropy over a 128k vocabulary) then costs an extra pass over the logits. When
the values between ``m`` and ``s`` (the broadcast of ``m``, ``x - m``, ``exp``) are used by
nothing else in the segment and not written, the pair is one accumulator instead: the segment is
a plain reduction. The code generator's accumulator is in ``codegen.online``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.ops_misc import reduction_axes

BROADCASTS = frozenset({"broadcast_in_dim", "broadcast", "expand"})
COPIES = frozenset({"set"})  # the same values: Thunder's shallow_copy
FLOATS = frozenset({DType.float32, DType.float64})
@dataclass(frozen=True)
class OnlinePair:
    max_op: int
    sum_op: int
    source: str  # x: what both reduce
    absorbed: frozenset[int]  # broadcast(s) of m, x - m, exp: evaluated only inside the pair


def online_pairs(bound: Bound, ops: Sequence[int], reductions: Iterable[int],
                 written: Iterable[str]) -> tuple[OnlinePair, ...]:
    """The max/sum-exp pairs among a segment's row reductions (``ops``: the segment's, sorted)
    that one accumulator can compute, in the order of their max ops. Looks only at the ops
    around each sum: no walk over the segment (merging segmenters classify often)."""
    fusion = bound.fusion
    reductions = sorted(reductions)
    maxes = {i for i in reductions if fusion.ops[i].name == "max"}
    sums = [i for i in reductions if fusion.ops[i].name == "sum"]
    if not maxes or not sums:
        return ()
    written = set(written)

    def member(i: int | None) -> bool:
        k = bisect_left(ops, i) if i is not None else len(ops)
        return k < len(ops) and ops[k] == i

    pairs: list[OnlinePair] = []
    for s in sums:
        pair = _match(bound, s, maxes, member, written)
        if pair is not None:
            maxes.discard(pair.max_op)
            pairs.append(pair)
    return tuple(sorted(pairs, key=lambda p: p.max_op))


def _match(bound: Bound, s: int, maxes: set[int], member: Callable[[int | None], bool],
           written: set[str]) -> OnlinePair | None:
    """``s = sum(exp(sub(x, broadcast(max(x)))))`` over the same axes, or None."""
    fusion = bound.fusion
    ops, producers = fusion.ops, bound.producers

    def producer(t: str) -> int | None:
        p = producers.get(t)
        return p if member(p) else None

    def through_copies(t: str, chain: list[int]) -> int | None:
        """The producer of ``t`` past ``set`` copies (Thunder's shallow_copy), which join
        ``chain``."""
        p = producer(t)
        while p is not None and ops[p].name in COPIES:
            chain.append(p)
            p = producer(ops[p].inputs[0])
        return p

    def root(t: str) -> str:
        """``t`` past ``set`` copies: the tensor whose value it is."""
        while (p := producer(t)) is not None and ops[p].name in COPIES:
            t = ops[p].inputs[0]
        return t

    sum_op = ops[s]
    chain: list[int] = []
    e = through_copies(sum_op.inputs[0], chain)
    if e is None or ops[e].name != "exp":
        return None
    chain.append(e)
    d = through_copies(ops[e].inputs[0], chain)
    if d is None or ops[d].name != "sub":
        return None
    chain.append(d)
    x, b = ops[d].inputs[0], ops[d].inputs[1]
    # the broadcast of m back over the row is absorbed; the row-level values on the way
    # ([rows, 1] and their copies) stay: the segment computes them from m after the pass
    while (p := producer(b)) is not None and ops[p].name in BROADCASTS | COPIES:
        if bound.shapes[ops[p].outputs[0]] == bound.shapes[x]:
            chain.append(p)
        b = ops[p].inputs[0]
    m = producer(b)
    if m is None or m not in maxes or root(ops[m].inputs[0]) != root(x):
        return None
    if x not in fusion.tensors or any(
            fusion.tensors[t].dtype is not fusion.tensors[x].dtype or
            fusion.tensors[t].dtype not in FLOATS
            for t in (x, ops[d].outputs[0], ops[e].outputs[0], sum_op.outputs[0], b)):
        return None
    if bound.shapes[ops[d].outputs[0]] != bound.shapes[x]:
        return None  # x - m must not broadcast x itself
    rank = len(bound.shapes[x])
    if reduction_axes(ops[m].attrs, rank) != reduction_axes(sum_op.attrs, rank):
        return None
    absorbed = frozenset(chain)
    for i in absorbed:  # evaluated nowhere else in the segment, never stored
        for o in ops[i].outputs:
            if o in written or any(member(c) and c not in absorbed and c != s
                                   for c in bound.consumers.get(o, ())):
                return None
    return OnlinePair(m, s, x, absorbed)
