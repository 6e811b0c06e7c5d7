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

from optimizer.analysis.opclass import Role, is_view
from optimizer.plan.plan import SolverReport
from optimizer.segmenters.graph import SegGraph

Group = tuple[frozenset[int], frozenset[str]]
INF = 1 << 50
KIB = 1024


def refine(graph: SegGraph, groups: list[Group], options, deadline: float | None = None
           ) -> tuple[list[Group], SolverReport]:
    """``deadline``: a ``time.perf_counter()`` value, by default ``time_limit_s`` from now."""
    start = time.perf_counter()
    deadline = start + options.time_limit_s if deadline is None else deadline
    ops_list = [ops for ops, _ in groups]
    changed = 0
    for k in range(1, len(ops_list)):
        if time.perf_counter() > deadline:
            break
        grown = _refine_one(graph, ops_list, k)
        if grown is not None:
            ops_list[k] = grown
            changed += 1
    ops_list = _drop_idle(graph, ops_list)
    writes = graph.derive_writes(ops_list)
    refined = list(zip(ops_list, writes))
    from optimizer.segmenters.cpsat import plan_cost

    if plan_cost(graph, refined) > plan_cost(graph, groups):
        return groups, SolverReport("FEASIBLE", wall_s=time.perf_counter() - start,
                                    message="refinement did not pay; kept the input plan")
    return refined, SolverReport("FEASIBLE", wall_s=time.perf_counter() - start,
                                 message=f"min-cut refined {changed} segment(s)")


def _refine_one(graph: SegGraph, ops_list: list[frozenset[int]], k: int) -> frozenset[int] | None:
    fusion, bound = graph.fusion, graph.bound
    seg = graph.closure(ops_list[k])
    made = graph.produced(seg)
    earlier = [graph.produced(graph.closure(g)) for g in ops_list[:k]]
    in_memory = set().union(*earlier) if earlier else set()
    reads = {n for i in seg for n in fusion.ops[i].inputs if n in fusion.tensors and n not in made}
    needed = {t for t in reads if t not in graph.inputs}
    if not needed:
        return None
    # Values written anyway: fusion outputs, or read by other segments after k.
    later = [graph.closure(g) for g in ops_list[k + 1:]]
    later_reads = {n for g in later for i in g for n in fusion.ops[i].inputs}
    written_anyway = (graph.outputs | later_reads) & in_memory

    def recomputable(t: str) -> bool:
        p = graph.producer.get(t)
        return (p is not None and graph.roles[p] is Role.FUSIBLE and not is_view(fusion.ops[p])
                and p not in graph.forwarded)

    region: set[str] = set()
    stack = list(needed)
    while stack:
        t = stack.pop()
        if t in region:
            continue
        region.add(t)
        if recomputable(t):
            stack.extend(n for n in fusion.ops[graph.producer[t]].inputs
                         if n in fusion.tensors)
    names = sorted(region)
    index = {t: 2 * n for n, t in enumerate(names)}  # t_in = 2n, t_out = 2n + 1
    source, sink = 2 * len(names), 2 * len(names) + 1
    flow = max_flow.SimpleMaxFlow()
    for t in names:
        size = max(1, bound.nbytes(t) // KIB)
        if t in reads and t in graph.inputs:
            cap = 0  # read anyway
        elif t in graph.inputs or t in written_anyway:
            cap = size
        elif t in in_memory or t in needed:
            cap = 2 * size  # an earlier segment must write it too
        else:
            cap = INF  # nothing before can provide it
        flow.add_arc_with_capacity(index[t], index[t] + 1, cap)
        if not recomputable(t):
            flow.add_arc_with_capacity(source, index[t], INF)
        else:
            for n in fusion.ops[graph.producer[t]].inputs:
                if n in index:
                    flow.add_arc_with_capacity(index[n] + 1, index[t], INF)
        if t in needed:
            flow.add_arc_with_capacity(index[t] + 1, sink, INF)
    if flow.solve(source, sink) != flow.OPTIMAL or flow.optimal_flow() >= INF:
        return None
    source_side = set(flow.get_source_side_min_cut())
    recompute = {t for t in names if index[t] not in source_side and recomputable(t)}
    if not recompute:
        return None
    grown = frozenset(ops_list[k] | {graph.producer[t] for t in recompute})
    trial = list(ops_list)
    trial[k] = grown
    try:
        writes = graph.derive_writes(trial)
    except ValueError:
        return None
    if not graph.classify(grown, writes[k]):
        return None
    return grown


def _drop_idle(graph: SegGraph, ops_list: list[frozenset[int]]) -> list[frozenset[int]]:
    """Remove ops whose results no later op or output needs any more (they were recomputed
    where needed), and segments left empty."""
    fusion = graph.fusion
    out = [set(g) for g in ops_list]
    changed = True
    while changed:
        changed = False
        for k, g in enumerate(out):
            for i in sorted(g):
                outs = [o for o in fusion.ops[i].outputs if o in fusion.tensors]
                if any(o in graph.outputs for o in outs):
                    continue
                used_here = any(o in fusion.ops[j].inputs for j in graph.closure(g) if j != i
                                for o in outs)
                used_later = any(o in fusion.ops[j].inputs and o not in graph.produced(
                    graph.closure(out[m])) for m in range(k + 1, len(out))
                    for j in graph.closure(out[m]) for o in outs)
                if not used_here and not used_later:
                    g.discard(i)
                    changed = True
    return [frozenset(g) for g in out if g]
