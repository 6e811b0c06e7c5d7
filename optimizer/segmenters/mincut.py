"""Min-cut refinement: between a segment and the ones before it, which tensors should cross and
which should the segment recompute?

For one consumer segment, build a flow network over the values it needs from earlier segments
and their recomputable ancestors (fusible ops, back to fusion inputs or to values that cannot be
recomputed, such as reduction results). Each value is a node whose capacity is what reading it
costs: its bytes if it is already in memory (a fusion input, or written anyway), its bytes twice
if an earlier segment must write it as well, nothing if the segment reads it already. The source
feeds the values that cannot be recomputed; the sink takes the values the segment needs. A
minimum cut (OR-Tools max flow) is the cheapest set of values to read; everything between the cut
and the sink is recomputed in the segment. A refinement is kept only if the grown segment still
schedules. Each segment is refined in order; this is fast enough for fusions too large for the
full CP-SAT model.
"""

from __future__ import annotations

import time

from ortools.graph.python import max_flow

from fusecut.optimizer.analysis.cost import CUT_INFINITY, cut_capacity
from fusecut.optimizer.analysis.opclass import Role, is_view
from fusecut.optimizer.segmenters.graph import SegGraph
from fusecut.optimizer.segmenters.result import Group, SolverOptions, SolverReport, plan_cost

DEPTH = 64  # producers back from a segment's reads that it may recompute


def refine(graph: SegGraph, groups: list[Group], options: SolverOptions,
           deadline: float | None = None) -> tuple[list[Group], SolverReport]:
    """``deadline``: a ``time.perf_counter()`` value, by default ``time_limit_s`` from now. Each
    segment's refinement costs time in proportion to the values it could recompute; what the
    segments before and after it compute and read is kept up to date as the sweep moves, never
    gathered again per segment."""
    start = time.perf_counter()
    deadline = start + options.time_limit_s if deadline is None else deadline
    ops_list = [ops for ops, _ in groups]
    sweep = _Sweep(graph, ops_list)
    changed, late = 0, False
    for k in range(len(ops_list)):
        if k and time.perf_counter() > deadline:
            late = True
            break
        grown = _refine_one(graph, sweep, ops_list[k]) if k else None
        if grown is not None:
            ops_list[k] = grown
            changed += 1
        sweep.advance(ops_list[k])
    ops_list = _drop_idle(graph, ops_list)
    writes = graph.derive_writes(ops_list)
    refined = list(zip(ops_list, writes))
    note = "; time limit reached" if late else ""
    # each grown segment scheduled when it grew, but the writes derived at the end can ask
    # another segment to write more (a value a later one no longer recomputes): one that then
    # does not schedule keeps the input plan (a Llama backward region's rotary slices wrote
    # [2, 2, 16, 16] and [2, 4, 16, 8] from one segment)
    unscheduled = [ops for ops, written in refined if not graph.classify(ops, written)]
    if unscheduled:
        return groups, SolverReport("FEASIBLE", wall_s=time.perf_counter() - start,
                                    message="a refined segment did not schedule; kept the "
                                            "input plan" + note)
    if plan_cost(graph, refined) > plan_cost(graph, groups):
        return groups, SolverReport("FEASIBLE", wall_s=time.perf_counter() - start,
                                    message="refinement did not pay; kept the input plan" + note)
    return refined, SolverReport("FEASIBLE", wall_s=time.perf_counter() - start,
                                 message=f"min-cut refined {changed} segment(s)" + note)


class _Sweep:
    """As a sweep moves through an ordered segmentation: what the segments before the current
    one compute (in memory), and what the segments after it read (any of their ops' operands,
    and those they read from memory)."""

    def __init__(self, graph: SegGraph, ops_list: list[frozenset[int]]):
        self.graph = graph
        self.in_memory: set[str] = set()
        self._operands: list[set[str]] = []
        self._loads: list[set[str]] = []
        for ops in ops_list:
            closure = graph.closure(ops)
            operands = {n for i in closure for n in graph.fusion.ops[i].inputs
                        if n in graph.fusion.tensors}
            self._operands.append(operands)
            self._loads.append(operands - graph.produced(closure))
        self._later = [_count(self._operands), _count(self._loads)]
        self._k = 0

    def operand_later(self, t: str) -> bool:
        """An op of a later segment reads t."""
        return self._later[0].get(t, 0) - (t in self._operands[self._k]) > 0

    def loaded_later(self, t: str) -> bool:
        """A later segment reads t from memory."""
        return self._later[1].get(t, 0) - (t in self._loads[self._k]) > 0

    def advance(self, final: frozenset[int]) -> None:
        """The current segment is final (as ``final``): move past it."""
        for counts, sets in zip(self._later, (self._operands, self._loads)):
            for t in sets[self._k]:
                counts[t] -= 1
        self.in_memory |= self.graph.produced(self.graph.closure(final))
        self._k += 1


def _count(sets: list[set[str]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for s in sets:
        for t in s:
            counts[t] = counts.get(t, 0) + 1
    return counts


def _refine_one(graph: SegGraph, sweep: _Sweep, ops: frozenset[int]) -> frozenset[int] | None:
    fusion, bound = graph.fusion, graph.bound
    seg = graph.closure(ops)
    made = graph.produced(seg)
    in_memory = sweep.in_memory
    reads = {n for i in seg for n in fusion.ops[i].inputs if n in fusion.tensors and n not in made}
    needed = {t for t in reads if t not in graph.inputs}
    if not needed:
        return None

    def written_anyway(t: str) -> bool:
        """Fusion outputs, and what segments after this one read: written whatever this one
        recomputes."""
        return t in in_memory and (t in graph.outputs or sweep.operand_later(t))

    def recomputable(t: str) -> bool:
        p = graph.producer.get(t)
        return (p is not None and graph.roles[p] is Role.FUSIBLE and not is_view(fusion.ops[p])
                and p not in graph.forwarded)

    # The values the segment could recompute, breadth first from what it needs, at most DEPTH
    # producers back: beyond, a value is one the segment would read (a long chain is rarely
    # worth recomputing, and the network stays the size of the segment's neighbourhood instead
    # of the fusion's prefix, which made a sweep quadratic).
    region: set[str] = set(needed)
    layer = sorted(needed)
    for _ in range(DEPTH):
        grown = []
        for t in layer:
            if recomputable(t):
                for n in fusion.ops[graph.producer[t]].inputs:
                    if n in fusion.tensors and n not in region:
                        region.add(n)
                        grown.append(n)
        layer = grown
    horizon = set(layer)

    def inside(t: str) -> bool:
        """Recomputable, and within the horizon."""
        return t not in horizon and recomputable(t)

    names = sorted(region)
    index = {t: 2 * n for n, t in enumerate(names)}  # t_in = 2n, t_out = 2n + 1
    source, sink = 2 * len(names), 2 * len(names) + 1
    flow = max_flow.SimpleMaxFlow()
    for t in names:
        cap = cut_capacity(bound, t, read_anyway=t in reads and t in graph.inputs,
                           in_memory=t in graph.inputs or written_anyway(t),
                           writable=t in in_memory or t in needed)
        flow.add_arc_with_capacity(index[t], index[t] + 1, cap)
        if not inside(t):
            flow.add_arc_with_capacity(source, index[t], CUT_INFINITY)
        else:
            for n in fusion.ops[graph.producer[t]].inputs:
                if n in index:
                    flow.add_arc_with_capacity(index[n] + 1, index[t], CUT_INFINITY)
        if t in needed:
            flow.add_arc_with_capacity(index[t] + 1, sink, CUT_INFINITY)
    if flow.solve(source, sink) != flow.OPTIMAL or flow.optimal_flow() >= CUT_INFINITY:
        return None
    source_side = set(flow.get_source_side_min_cut())
    recompute = {t for t in names if index[t] not in source_side and inside(t)}
    if not recompute:
        return None
    grown = frozenset(ops | {graph.producer[t] for t in recompute})
    # What the grown segment writes: what it computes first (nothing earlier does) that is a
    # fusion output or that a later segment reads; it must read only what is in memory.
    closure = graph.closure(grown)
    grown_made = graph.produced(closure)
    if any(n in fusion.tensors and n not in grown_made and n not in graph.inputs
           and n not in in_memory for i in closure for n in fusion.ops[i].inputs):
        return None
    writes = frozenset(t for t in grown_made if t not in in_memory and (
        (t in graph.outputs and graph.producer.get(t) not in graph.forwarded)
        or sweep.loaded_later(t)))
    if not graph.classify(grown, writes):
        return None
    return grown


def _drop_idle(graph: SegGraph, ops_list: list[frozenset[int]]) -> list[frozenset[int]]:
    """Remove ops whose results no later op or output needs any more (they were recomputed
    where needed), and segments left empty. A worklist: removing an op re-checks only the
    producers of what it read."""
    fusion = graph.fusion
    out = [set(g) for g in ops_list]
    homes: dict[int, set[int]] = {}  # op -> segments computing it
    readers: dict[str, list[tuple[int, int]]] = {}  # tensor -> (segment, op) reading it
    for k, g in enumerate(out):
        for i in g:
            homes.setdefault(i, set()).add(k)
            for n in dict.fromkeys(fusion.ops[i].inputs):
                if n in fusion.tensors:
                    readers.setdefault(n, []).append((k, i))

    def needed(k: int, i: int) -> bool:
        for o in fusion.ops[i].outputs:
            if o not in fusion.tensors:
                continue
            if o in graph.outputs:
                return True
            for m, j in readers.get(o, ()):
                if j in out[m] and ((m == k and j != i) or (m > k and i not in out[m])):
                    return True  # read here, or read by a later segment that lacks it
        return False

    work = [(k, i) for k, g in enumerate(out) for i in sorted(g)]
    work.reverse()  # popped in segment and op order
    while work:
        k, i = work.pop()
        if i not in out[k] or needed(k, i):
            continue
        out[k].discard(i)
        homes[i].discard(k)
        for n in fusion.ops[i].inputs:
            p = graph.producer.get(n)
            for m in homes.get(p, ()):
                if m <= k:
                    work.append((m, p))
    return [frozenset(g) for g in out if g]
