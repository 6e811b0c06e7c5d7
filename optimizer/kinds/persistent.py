"""Stages and on-chip buffers of a persistent (normalization / inner-outer) segment.

A persistent kernel walks each row in stages: stage 0 reads the row and feeds the first row
reduction; stage s+1 can use the results of reduction s, broadcast back over the row. Each op is
evaluated in the stages that need it:
- a row or column reduction accumulates in the stage its input becomes available;
- an op that depends on a row reduction runs once, in the stage its operands are ready, and its
  result is kept on chip ("persisted") if a later stage needs it, unless recomputing it from the
  row's inputs and reduction results is cheap (then each stage that needs it recomputes it);
- an op that depends on the row's inputs alone is recomputed in every stage that needs it
  (nvFuser's "projection to inputs"); the inputs it reads are kept on chip, in their own narrow
  dtype, when more than one stage reads them, and streamed from memory otherwise.
Column reductions (inner-outer) finish after every row: their results exist only at ``COLUMN``.

The planner checks ``row_bytes`` against the device budget; the code generator allocates exactly
the ``persisted`` buffers and evaluates each op in ``eval_stages``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fusecut.optimizer.analysis.axes import AxisEntry, domain_axes
from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.ir.opspec import get_spec

COLUMN = 1 << 20  # the stage of column-reduction results: after every row is done
RECOMPUTE_LIMIT = 8  # arithmetic (simple-op units) under which a later stage recomputes a value


@dataclass(frozen=True)
class Persistence:
    stage: dict[str, int]  # tensor -> stage where it becomes available (inputs: 0)
    eval_stages: dict[int, frozenset[int]]  # op index -> stages that evaluate it
    persisted: tuple[str, ...]  # row tensors kept on chip across stages, program order
    row_bytes: int  # on-chip bytes per row for the persisted tensors
    n_stages: int  # passes over a row: row-reduction stages + the final one
    broadcasts_back: bool  # some row-varying value depends on a row reduction
    # What extending the analysis to a larger segment reuses (see ``analyze_persistence``):
    in_stage: dict[int, int] = field(default_factory=dict, compare=False, repr=False)
    chain: dict[str, float] = field(default_factory=dict, compare=False, repr=False)
    cheap: frozenset[int] = field(default=frozenset(), compare=False, repr=False)
    written: frozenset[str] = field(default=frozenset(), compare=False, repr=False)
    depends_back: frozenset[str] = field(default=frozenset(), compare=False, repr=False)


@dataclass(frozen=True)
class Extension:
    """A segment's analysis to extend: ``base`` covered a segment whose ops the new one contains,
    with the same row axes and its reductions in the same roles; ``remapped`` are the tensors
    whose axis map may differ from the base's; ``consumers`` and ``producer`` index the fusion."""

    base: Persistence
    new_ops: frozenset[int]
    remapped: frozenset[str]
    consumers: Mapping[str, Sequence[int]]
    producer: Mapping[str, int]


def is_row_tensor(axis_map: dict[str, tuple[AxisEntry, ...]], row_axes: tuple[int, ...],
                  tensor: str) -> bool:
    """True if the tensor varies along a reduced (row) axis."""
    return any(a in row_axes for m in axis_map[tensor] for a in domain_axes(m))


def analyze_persistence(bound: Bound, ops, inputs, outputs, domain, axis_map, row_axes,
                        row_reductions, col_reductions, extension: Extension | None = None
                        ) -> Persistence | str:
    """The persistent-kernel analysis of a segment, or why it has none. With an ``extension``,
    only the new ops and what they change are analysed (worklists from them, forward through
    the stages and backward through the evaluation stages); the result is the same."""
    w = _walk(bound.fusion, ops, inputs, row_reductions, col_reductions, extension)
    why = _stages_forward(w)
    if why:
        return why
    order = _order_key(w.fusion, inputs, w.producer)
    check = w.stage if extension is None else sorted(
        (w.moved | extension.remapped | w.made_by_new) & w.stage.keys(), key=order)
    for t in check:
        if w.stage[t] >= COLUMN and any(a not in row_axes for m in axis_map[t]
                                        for a in domain_axes(m)):
            return f"{t} combines a column reduction's result with per-row values"
    written = set(outputs)
    _evaluation_stages(w, written)
    persisted, depends_back = _kept_on_chip(w, inputs, axis_map, row_axes, order)
    row_bytes = 0
    for t in persisted:
        dtype = w.fusion.tensors[t].dtype
        size = dtype.itemsize if t in inputs else dtype.compute.itemsize
        row_bytes += _row_extent(domain, axis_map, row_axes, t) * size
    n_stages = 1 + max((w.in_stage[i] + 1 for i in w.rows), default=0)
    return Persistence(w.stage, w.evals, tuple(persisted), row_bytes, n_stages,
                       bool(depends_back), w.in_stage, w.chain, frozenset(w.cheap),
                       frozenset(written), frozenset(depends_back))


@dataclass
class _Walk:
    """One analysis's working state: the segment (its ops, row and column reductions, who reads
    and makes each value) and what the passes find, carried over from the base analysis when
    extending one: each value's stage, each op's input stage, recompute chain cost and
    cheapness, the stages that evaluate it, and which values and ops the forward pass moved."""

    fusion: Any
    members: set[int]
    rows: set[int]
    cols: set[int]
    new: set[int]  # the ops to analyse (all of them, or an extension's new ones)
    users: Callable[[str], Sequence[int]]
    producer: Mapping[str, int]
    extension: Extension | None
    base: Persistence
    stage: dict[str, int]
    in_stage: dict[int, int]
    chain: dict[str, float]
    cheap: set[int]
    evals: dict[int, frozenset[int]]
    made_by_new: set[str] = field(default_factory=set)
    moved: set[str] = field(default_factory=set)  # tensors whose stage changed
    recosted: set[int] = field(default_factory=set)  # ops whose stage or cheapness changed
    read_by_new: set[str] = field(default_factory=set)
    reevaluated: set[int] = field(default_factory=set)


def _walk(fusion, ops, inputs, row_reductions, col_reductions,
          extension: Extension | None) -> _Walk:
    members = set(ops)
    if extension is None:
        stage: dict[str, int] = dict.fromkeys(inputs, 0)
        base = Persistence({}, {}, (), 0, 0, False)
        new = members
        consumers: dict[str, list[int]] = {}
        for i in ops:
            for n in dict.fromkeys(fusion.ops[i].inputs):
                consumers.setdefault(n, []).append(i)
        producer = {o: i for i in ops for o in fusion.ops[i].outputs}

        def users(t: str) -> Sequence[int]:
            return consumers.get(t, ())
    else:
        base, new = extension.base, extension.new_ops
        stage = dict(base.stage)
        for t in inputs:
            stage.setdefault(t, 0)
        producer = extension.producer
        index = extension.consumers

        def users(t: str) -> Sequence[int]:
            return [c for c in index.get(t, ()) if c in members]

    return _Walk(fusion, members, set(row_reductions), set(col_reductions), new, users,
                 producer, extension, base, stage, dict(base.in_stage), dict(base.chain),
                 set(base.cheap), dict(base.eval_stages))


def _stages_forward(w: _Walk) -> str | None:
    """Forward: the stage each op runs in, and what recomputing each value costs (or why a
    column reduction cannot take its input)."""
    fusion, ext = w.fusion, w.extension
    w.made_by_new = {o for i in w.new for o in fusion.ops[i].outputs}
    seeds = set(w.new) if ext is None else \
        set(w.new) | {c for t in w.made_by_new for c in w.users(t)}
    heap = sorted(seeds)
    queued = set(seeds)
    while heap:
        i = heapq.heappop(heap)
        op = fusion.ops[i]
        s = max((w.stage[n] for n in op.inputs if n in fusion.tensors), default=0)
        if i in w.cols and s >= COLUMN:
            return f"{op.outputs[0]} reduces the result of another column reduction"
        out_stage = s + 1 if i in w.rows else COLUMN if i in w.cols else s
        if i in w.rows or i in w.cols or s == 0:
            cost = 0.0
        else:
            cost = get_spec(op.name).cost + sum(w.chain.get(n, 0.0) for n in op.inputs)
        is_cheap = not (i in w.rows or i in w.cols or s == 0) and cost <= RECOMPUTE_LIMIT and \
            s < COLUMN
        if i in w.new or w.in_stage.get(i) != s or (i in w.cheap) != is_cheap:
            w.recosted.add(i)
        w.in_stage[i] = s
        if is_cheap:
            w.cheap.add(i)
        else:
            w.cheap.discard(i)
        for o in op.outputs:
            changed = w.chain.get(o) != cost
            w.chain[o] = cost
            if o in fusion.tensors:
                if w.stage.get(o) != out_stage:
                    w.moved.add(o)
                    changed = True
                w.stage[o] = out_stage
            if changed and ext is not None:
                for c in w.users(o):
                    if c not in queued:
                        queued.add(c)
                        heapq.heappush(heap, c)
    return None


def _evaluation_stages(w: _Walk, written: set[str]) -> None:
    """Backward: the stages that evaluate each op (a cheap value is recomputed in each stage
    that reads it; anything else in its own)."""
    fusion, ext = w.fusion, w.extension
    seeds = set(w.new) | w.recosted
    if ext is not None:
        w.read_by_new = {n for i in w.new for n in fusion.ops[i].inputs if n in fusion.tensors}
        rewritten = written ^ w.base.written
        seeds |= {w.producer[t] for t in w.read_by_new | rewritten
                  if t in w.producer and w.producer[t] in w.members}
    heap = [-i for i in seeds]
    heapq.heapify(heap)
    queued = set(seeds)
    while heap:
        i = -heapq.heappop(heap)
        op = fusion.ops[i]
        if i in w.rows or i in w.cols or (w.in_stage[i] > 0 and i not in w.cheap):
            need = {min(w.in_stage[i], COLUMN)}
        else:
            need = {s for o in op.outputs for c in w.users(o) for s in w.evals[c]}
            if any(o in written for o in op.outputs) or not need:
                need.add(w.in_stage[i])
        if w.evals.get(i) == need:
            continue
        w.evals[i] = frozenset(need)
        w.reevaluated.add(i)
        if ext is not None:
            for n in op.inputs:
                p = w.producer.get(n)
                if p is not None and p in w.members and p not in queued:
                    queued.add(p)
                    heapq.heappush(heap, -p)


def _kept_on_chip(w: _Walk, inputs, axis_map, row_axes, order) -> tuple[list[str], set[str]]:
    """What each row keeps on chip (values read in later stages than they are made, inputs
    used in several), and the row values that depend on a reduction's result."""
    fusion, ext = w.fusion, w.extension
    if ext is None:
        recheck = w.stage
        persisted_set: set[str] = set()
        depends_back: set[str] = set()
    else:
        recheck = w.moved | ext.remapped | w.made_by_new | w.read_by_new
        recheck |= {n for i in w.reevaluated for n in fusion.ops[i].inputs}
        recheck |= {o for i in w.recosted for o in fusion.ops[i].outputs}
        recheck &= w.stage.keys()
        persisted_set, depends_back = set(w.base.persisted), set(w.base.depends_back)
    input_set = set(inputs)
    for t in recheck:
        row = is_row_tensor(axis_map, row_axes, t)
        keep = False
        if row and w.stage[t] < COLUMN:
            use = {s for c in w.users(t) for s in w.evals[c]}
            if t in input_set:
                keep = len(use) > 1  # read once, used in several stages
            else:
                p = w.producer.get(t)
                keep = w.stage[t] > 0 and p not in w.cheap and any(s > w.stage[t] for s in use)
        if keep:
            persisted_set.add(t)
        else:
            persisted_set.discard(t)
        if row and 0 < w.stage[t] < COLUMN:
            depends_back.add(t)
        else:
            depends_back.discard(t)
    persisted = [t for t in w.stage if t in persisted_set] if ext is None else \
        sorted(persisted_set, key=order)
    return persisted, depends_back


def _order_key(fusion, inputs, producer: Mapping[str, int]):
    """Program order of a segment's tensors: its inputs in order of first use, then what its
    ops compute, in op order."""
    first = {t: k for k, t in enumerate(inputs)}

    def key(t: str) -> tuple[int, int, int]:
        if t in first:
            return (0, first[t], 0)
        p = producer[t]
        return (1, p, fusion.ops[p].outputs.index(t))
    return key


def _row_extent(domain, axis_map, row_axes, tensor: str) -> int:
    return math.prod(domain[a] for m in axis_map[tensor] for a in domain_axes(m)
                     if a in row_axes)
