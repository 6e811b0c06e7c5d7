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

import math
from dataclasses import dataclass

from optimizer.analysis.axes import AxisEntry, domain_axes
from optimizer.analysis.shapes import Bound
from optimizer.ir.opspec import get_spec

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


def is_row_tensor(axis_map: dict[str, tuple[AxisEntry, ...]], row_axes: tuple[int, ...],
                  tensor: str) -> bool:
    """True if the tensor varies along a reduced (row) axis."""
    return any(a in row_axes for m in axis_map[tensor] for a in domain_axes(m))


def analyze_persistence(bound: Bound, ops, inputs, outputs, domain, axis_map, row_axes,
                        row_reductions, col_reductions) -> Persistence | str:
    fusion = bound.fusion
    rows, cols = set(row_reductions), set(col_reductions)
    stage: dict[str, int] = dict.fromkeys(inputs, 0)
    in_stage: dict[int, int] = {}
    for i in ops:
        op = fusion.ops[i]
        s = max((stage[n] for n in op.inputs if n in fusion.tensors), default=0)
        if i in cols and s >= COLUMN:
            return f"{op.outputs[0]} reduces the result of another column reduction"
        in_stage[i] = s
        out_stage = s + 1 if i in rows else COLUMN if i in cols else s
        for o in op.outputs:
            if o in fusion.tensors:
                stage[o] = out_stage
    for t, s in stage.items():
        if s >= COLUMN and any(a not in row_axes for m in axis_map[t] for a in domain_axes(m)):
            return f"{t} combines a column reduction's result with per-row values"
    consumers: dict[str, list[int]] = {}
    for i in ops:
        for n in dict.fromkeys(fusion.ops[i].inputs):
            consumers.setdefault(n, []).append(i)
    # what recomputing a value from the row's inputs and reduction results costs
    chain: dict[str, float] = {}
    cheap: set[int] = set()
    for i in ops:
        op = fusion.ops[i]
        if i in rows or i in cols or in_stage[i] == 0:
            cost = 0.0
        else:
            cost = get_spec(op.name).cost + sum(chain.get(n, 0.0) for n in op.inputs)
            if cost <= RECOMPUTE_LIMIT and in_stage[i] < COLUMN:
                cheap.add(i)
        for o in op.outputs:
            chain[o] = cost
    written = set(outputs)
    evals: dict[int, frozenset[int]] = {}
    for i in reversed(ops):
        op = fusion.ops[i]
        if i in rows or i in cols or (in_stage[i] > 0 and i not in cheap):
            evals[i] = frozenset({min(in_stage[i], COLUMN)})
            continue
        need = {s for o in op.outputs for c in consumers.get(o, ()) for s in evals[c]}
        if any(o in written for o in op.outputs) or not need:
            need.add(in_stage[i])
        evals[i] = frozenset(need)
    cheap_values = {o for i in cheap for o in fusion.ops[i].outputs}
    persisted = []
    for t in stage:
        if not is_row_tensor(axis_map, row_axes, t) or stage[t] >= COLUMN:
            continue
        use = {s for c in consumers.get(t, ()) for s in evals[c]}
        if t in inputs:
            keep = len(use) > 1  # read once, used in several stages
        else:
            keep = stage[t] > 0 and t not in cheap_values and any(s > stage[t] for s in use)
        if keep:
            persisted.append(t)
    row_bytes = 0
    for t in persisted:
        dtype = fusion.tensors[t].dtype
        size = dtype.itemsize if t in inputs else dtype.compute.itemsize
        row_bytes += _row_extent(domain, axis_map, row_axes, t) * size
    broadcasts_back = any(0 < s < COLUMN and is_row_tensor(axis_map, row_axes, t)
                          for t, s in stage.items())
    n_stages = 1 + max((in_stage[i] + 1 for i in rows), default=0)
    return Persistence(stage, evals, tuple(persisted), row_bytes, n_stages, broadcasts_back)


def _row_extent(domain, axis_map, row_axes, tensor: str) -> int:
    return math.prod(domain[a] for m in axis_map[tensor] for a in domain_axes(m)
                     if a in row_axes)
