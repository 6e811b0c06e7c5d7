"""The CP-SAT segmenter: the fewest bytes through global memory, with recomputation.

Model (OR-Tools CP-SAT), over a window of the plan (the whole plan when it is small):
- K ordered slots. ``x[u, k]``: unit u (a coarsened group of ops) is computed in slot k; a unit
  may be computed in several slots, which is rematerialization.
- ``w[t, k]``: slot k writes tensor t to global memory; ``r[t, k]``: slot k reads it.
- A unit in slot k needs each operand there: computed in k (``x[p, k]``) or read (``r[t, k]``);
  a read needs a write in an earlier slot (or the value already in memory when the window
  starts); a write needs the producer in the slot. Forwarded values (see ``graph``) are never
  variables: a slot that uses one reads its root input.
- Every fusion output the window produces, and every value a later segment reads, is written
  exactly once; ``segment_set`` operands must be read.
- Kind rules: library/fallback units sit alone; reductions of incompatible domains never share a
  slot, nor reductions and view ops, nor a column reduction and the ops that broadcast its result
  back. The remaining rules (output domains, the persistent budget) are checked on every solution
  with ``classify``: a violated slot gives a cut (a minimal set of units that cannot share a
  slot), the invalid slots are repaired with the greedy segmenter, and the window is solved again.
- Minimise bytes read + written + launch cost per used slot + recomputed arithmetic.

Large plans are optimised window by window (a few consecutive segments at a time, the rest held
fixed), sliding over the plan until a pass improves nothing or time runs out. A plan of few ops
is one window whatever its segments: a value written by one segment and read by two others
further on is recomputed by its readers only when all three are in the window (a loss
backward's one-hot: 6.9 GiB planned in windows of 4 of its 5 segments, 2.3 GiB in one).
Coarsening: an op whose results only its single consumer reads joins that consumer's unit when
the current plan has them together. The search starts from the greedy plan refined by the
min-cut segmenter (in linear time; it recomputes what is cheaper than reading back, 2-4x fewer
bytes on the generated fusions), and the current plan is each window's warm start. If nothing
better and valid is found, that plan stands.

The same input gives the same plan, on an idle machine or a busy one: the search's effort is
counted in CP-SAT's deterministic time (one worker, a fixed seed), converted to planned seconds
(``_Effort``) that the search may spend, a share of the time limit; the search stops when the
next solve would not fit. The wall-clock deadline is only a backstop, reached when the machine
runs the plan's work more than about twice as slowly as this estimate.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from ortools.sat.python import cp_model

from fusecut.optimizer.analysis.axes import AxisMap
from fusecut.optimizer.analysis.cost import (
    KIB,
    gathered_elements,
    launch_kib,
    lower_bound_bytes,
    objective_kib,
    recompute_kib,
)
from fusecut.optimizer.analysis.opclass import Role, reindexes
from fusecut.optimizer.ir.ops_misc import reduction_axes
from fusecut.optimizer.kinds.gather import may_gather_rows
from fusecut.optimizer.kinds.online import OnlinePair, online_pairs
from fusecut.optimizer.kinds.resize import is_resize
from fusecut.optimizer.kinds.rules import Kind
from fusecut.optimizer.segmenters.graph import SegGraph
from fusecut.optimizer.segmenters.greedy import greedy_groups
from fusecut.optimizer.segmenters.mincut import refine
from fusecut.optimizer.segmenters.result import (
    Group,
    SolverOptions,
    SolverReport,
    plan_bytes,
    plan_cost,
)
from fusecut.optimizer.segmenters.unionfind import DisjointSets

WINDOW = 4  # segments optimised together
STRIDE = 2
WHOLE_PLAN_OPS = 64  # a plan of up to this many ops is one window, however many segments
WHOLE_PLAN_SOLVES = 16  # its solves, kind-rule cuts included (the effort still bounds them)
SOLVES_PER_WINDOW = 4
PASSES = 2
SEARCH_SHARE = 0.3  # of the time limit: the search's planned seconds (see _Effort)
# Measured (one worker, on the planner benchmark's fusions and a 50,304-wide loss backward): a
# solve's wall time is about WALL_PER_DET times its deterministic time, plus the building,
# hinting and checking of its window's model, which grows with the model (SOLVE_OVERHEAD_S, and
# SOLVE_S_PER_VARIABLE per CP-SAT variable: 12 ms at 150 variables, 60 ms at 1,100), plus, per
# slot that breaks a kind rule, its repair and cut, which grow with the slot's ops (CUT_OVERHEAD_S
# and CUT_S_PER_OP: 5 ms at 20 ops, 34 ms at 110, 130 ms at 520). A flat charge per solve (it
# was 50 ms, and 40 ms per cut) spent a small window's share in a fifth of its time: a 37-op
# loss backward stopped at 344 MiB where its plan of 147 MiB was a few solves further.
WALL_PER_DET = 1.5
SOLVE_OVERHEAD_S = 0.005
SOLVE_S_PER_VARIABLE = 0.00005
CUT_OVERHEAD_S = 0.001
CUT_S_PER_OP = 0.00025
# a large window's overhead (900 variables, 50 ms), for sharing the search out per solve
SHARED_OVERHEAD_S = SOLVE_OVERHEAD_S + SOLVE_S_PER_VARIABLE * 900
SOLVES_EXPECTED = 2  # per window, cuts included, for sharing out the deterministic time
WARM_S_PER_OP = 0.0003  # the min-cut warm start and the static rules, per placed op
MIN_DET = 0.02  # a solve with less finds little


@dataclass
class _Effort:
    """Planned seconds of search, spent per solve from its deterministic time (see the module's
    docstring), and the deterministic time each solve may take."""

    planned_s: float
    per_solve: float
    used_s: float = 0.0

    def fits(self, variables: int = 0) -> bool:
        """Whether a solve of a model with ``variables`` (CP-SAT's) fits what is left."""
        return (self.used_s + _solve_overhead(variables) + WALL_PER_DET * self.per_solve
                <= self.planned_s)

    def solved(self, det: float, variables: int) -> None:
        """A solve of a model with ``variables`` ended after ``det`` of deterministic time."""
        self.used_s += _solve_overhead(variables) + WALL_PER_DET * det

    def repaired(self, ops: Iterable[int]) -> None:
        """Slots that broke a kind rule, of ``ops`` ops each, were repaired and cut."""
        self.used_s += sum(CUT_OVERHEAD_S + CUT_S_PER_OP * n for n in ops)


def _solve_overhead(variables: int) -> float:
    return SOLVE_OVERHEAD_S + SOLVE_S_PER_VARIABLE * variables


def solve(graph: SegGraph, greedy: list[Group], options: SolverOptions,
          deadline: float | None = None) -> tuple[list[Group], SolverReport]:
    """``deadline``: a ``time.perf_counter()`` value, by default ``time_limit_s`` from now."""
    start = time.perf_counter()
    deadline = start + options.time_limit_s if deadline is None else deadline
    if len(greedy) <= 1 and plan_bytes(graph, greedy) <= lower_bound_bytes(graph.bound):
        return greedy, SolverReport("OPTIMAL", wall_s=time.perf_counter() - start,
                                    message="the greedy plan is one segment at the lower bound")
    start_plan, warm = refine(graph, greedy, options, deadline)
    best, best_cost = start_plan, plan_cost(graph, start_plan)
    stats = {"solves": 0, "cuts": 0, "windows": 0}
    planned = options.time_limit_s * SEARCH_SHARE - WARM_S_PER_OP * len(graph.placed)
    rules = _Rules(graph)
    if len(best) <= WINDOW or len(graph.placed) <= WHOLE_PLAN_OPS:
        effort = _Effort(planned, _per_solve(planned, SOLVES_PER_WINDOW))
        best, status, objective, bound = _optimize_window(
            graph, rules, best, 0, len(best), deadline, effort, options, stats,
            solves=WHOLE_PLAN_SOLVES)
        message = f"{stats['solves']} solve(s), {stats['cuts']} kind-rule cut(s)"
    else:
        status, objective, bound = "FEASIBLE", None, None
        windows = 1 + -(-(len(best) - WINDOW) // STRIDE)  # per pass
        effort = _Effort(planned, _per_solve(planned, PASSES * windows * SOLVES_EXPECTED))
        improved, passes = True, 0
        while improved and passes < PASSES and effort.fits() and time.perf_counter() < deadline:
            improved, passes = False, passes + 1
            a = 0
            while a < len(best) and effort.fits() and time.perf_counter() < deadline:
                b = min(a + WINDOW, len(best))
                candidate, _, _, _ = _optimize_window(graph, rules, best, a, b, deadline, effort,
                                                      options, stats)
                cost = plan_cost(graph, candidate)
                if cost < best_cost * (1 - 1e-9):
                    best, best_cost, improved = candidate, cost, True
                if b == len(best):
                    break
                a += STRIDE
        message = (f"windows of {WINDOW} segments: {stats['windows']} window(s), "
                   f"{stats['solves']} solve(s), {stats['cuts']} kind-rule cut(s)")
    if best is start_plan and status != "OPTIMAL":
        status = "FEASIBLE" if stats["solves"] or start_plan is not greedy else \
            "FALLBACK_TO_GREEDY"
    if start_plan is not greedy:
        message = f"warm start: {warm.message}; {message}"
    if not effort.fits():
        message += "; search effort spent"
    if time.perf_counter() >= deadline and "time limit reached" not in message:
        message += "; time limit reached"
    return best, SolverReport(status, objective=objective, bound=bound,
                              wall_s=time.perf_counter() - start, message=message)


def _per_solve(planned_s: float, solves: int) -> float:
    """Deterministic time per solve when ``solves`` share ``planned_s``."""
    return max(MIN_DET, (planned_s / solves - SHARED_OVERHEAD_S) / WALL_PER_DET)


def _optimize_window(graph: SegGraph, rules: _Rules, plan: list[Group], a: int, b: int,
                     deadline: float, effort: _Effort, options: SolverOptions, stats: dict,
                     solves: int = SOLVES_PER_WINDOW
                     ) -> tuple[list[Group], str, float | None, float | None]:
    """Re-segment plan[a:b] with the rest fixed; return the best valid plan found."""
    stats["windows"] += 1
    fusion = graph.fusion
    before, window, after = plan[:a], plan[a:b], plan[b:]
    available = set(graph.inputs) | {t for _, w in before for t in w}
    after_reads = {n for ops, _ in after for i in graph.closure(ops)
                   for n in fusion.ops[i].inputs if n in fusion.tensors}
    after_made = {t for ops, _ in after for t in graph.produced(graph.closure(ops))}
    window_ops = frozenset(i for ops, _ in window for i in ops)
    made = graph.produced(window_ops)
    must_write = {t for t in made if t not in available and (
        (t in graph.outputs and t not in {x for _, w in before for x in w})
        or (t in after_reads and t not in after_made))}
    # outputs already written before the window stay written there
    model = _Model(graph, rules, window, available, must_write, options)
    best, best_cost = plan, plan_cost(graph, plan)
    status, objective, bound = "FEASIBLE", None, None
    for _ in range(solves):
        remaining = deadline - time.perf_counter()
        if remaining <= 0.05 or not effort.fits(model.variables):
            break
        stats["solves"] += 1
        result = model.solve(effort, remaining, options.seed, hint=window)
        if result is None:
            break
        groups, solver_status, objective, bound = result
        bad = [k for k, (ops, written) in enumerate(groups) if not graph.classify(ops, written)]
        if bad:
            repaired = _repair(graph, before + groups + after, [a + k for k in bad])
            if repaired is not None and plan_cost(graph, repaired) < best_cost:
                best, best_cost = repaired, plan_cost(graph, repaired)
            for k in bad:
                model.add_cut(*groups[k])
                stats["cuts"] += 1
            effort.repaired(len(groups[k][0]) for k in bad)
            continue
        candidate = before + groups + after
        try:
            writes = graph.derive_writes([ops for ops, _ in candidate])
        except ValueError:
            break
        candidate = [(ops, w) for (ops, _), w in zip(candidate, writes)]
        if all(graph.classify(ops, w) for ops, w in candidate):
            cost = plan_cost(graph, candidate)
            if cost <= best_cost:
                best, best_cost, status = candidate, cost, solver_status
        break
    return best, status, objective, bound


def _repair(graph: SegGraph, groups: list[Group], bad: list[int]) -> list[Group] | None:
    """A valid plan near an invalid solution: split each slot that breaks a kind rule with the
    greedy segmenter, keep the rest, and re-derive what each segment writes."""
    ops_list: list[frozenset[int]] = []
    for k, (ops, _) in enumerate(groups):
        ops_list.extend(greedy_groups(graph, ops) if k in bad else [ops])
    try:
        writes = graph.derive_writes(ops_list)
    except ValueError:
        return None
    repaired = list(zip(ops_list, writes))
    return repaired if all(graph.classify(ops, w) for ops, w in repaired) else None


class _Model:
    def __init__(self, graph: SegGraph, rules: _Rules, window: list[Group], available: set[str],
                 must_write: set[str], options: SolverOptions):
        self.graph = graph
        self.rules = rules
        fusion, bound = graph.fusion, graph.bound
        self.units = _coarsen(graph, window)
        self.unit_of = {i: u for u, ops in enumerate(self.units) for i in ops}
        self.K = min(len(window) + 1, max(len(self.units), 1))
        m = self.model = cp_model.CpModel()
        U, K = range(len(self.units)), range(self.K)
        self.x = {(u, k): m.NewBoolVar(f"x{u}_{k}") for u in U for k in K}
        self.used = [m.NewBoolVar(f"used{k}") for k in K]
        produced_by = {o: u for u, ops in enumerate(self.units) for i in ops
                       for o in fusion.ops[i].outputs if o in fusion.tensors}
        needs: dict[int, set[str]] = {}  # unit -> tensors it reads from outside itself
        # unit -> what it reads only in part (through gathers), in KiB; a slot may read such a
        # tensor in part (rp) where no unit of it needs the whole (r)
        partial: dict[int, dict[str, int]] = {}
        part_kib: dict[str, int] = {}
        for u, ops in enumerate(self.units):
            closure = graph.closure(ops)
            made = graph.produced(closure)
            needs[u] = {n for i in closure for n in fusion.ops[i].inputs
                        if n in fusion.tensors and n not in made}
            leaving = {o for i in ops for o in fusion.ops[i].outputs if o in fusion.tensors and (
                o in graph.outputs or any(c not in closure for c in graph.consumers.get(o, ())))}
            some = gathered_elements(bound, closure, leaving)
            partial[u] = {t: objective_kib(bound, t, some) for t in needs[u] if t in some}
            for t, kib in partial[u].items():
                part_kib[t] = max(part_kib.get(t, 0), kib)
        boundary = {t for u in U for t in needs[u] if t in produced_by} | \
            {t for t in must_write if t in produced_by}
        self.w = {(t, k): m.NewBoolVar(f"w{t}_{k}") for t in sorted(boundary) for k in K}
        readable = sorted({t for u in U for t in needs[u]})
        self.r = {(t, k): m.NewBoolVar(f"r{t}_{k}") for t in readable for k in K}
        self.rp = {(t, k): m.NewBoolVar(f"rp{t}_{k}") for t in sorted(part_kib) for k in K}
        for u in U:
            segment_set_inputs = {fusion.ops[i].inputs[0] for i in self.units[u]
                                  if fusion.ops[i].name == "segment_set"}
            for k in K:
                xu = self.x[u, k]
                m.AddImplication(xu, self.used[k])
                for t in sorted(needs[u]):
                    p = produced_by.get(t)
                    reads = [self.r[t, k]] + ([self.rp[t, k]] if t in partial[u] else [])
                    if p is None or t in segment_set_inputs:
                        m.AddBoolOr([xu.Not(), *reads])
                        if p is not None:
                            m.AddBoolOr([xu.Not(), self.x[p, k].Not()])
                    else:
                        m.AddBoolOr([xu.Not(), self.x[p, k], *reads])
        for (t, k), rv in list(self.r.items()) + list(self.rp.items()):
            if t in produced_by and t not in available:
                earlier = [self.w[t, j] for j in range(k)]
                if earlier:
                    m.AddBoolOr([rv.Not(), *earlier])
                else:
                    m.Add(rv == 0)
            elif t not in produced_by and t not in available:
                m.Add(rv == 0)  # nothing can provide it: units needing it stay out
        for (t, k), wv in self.w.items():
            m.AddImplication(wv, self.x[produced_by[t], k])
        for t in sorted(must_write):
            if t in produced_by:
                m.AddExactlyOne(self.w[t, k] for k in K)
        for k in K:
            m.AddBoolOr([self.used[k].Not(), *[self.x[u, k] for u in U]])
            if k + 1 < self.K:
                m.AddImplication(self.used[k + 1], self.used[k])
        self._static_rules()
        profile = graph.profile
        launch = launch_kib(profile, options.launch_weight)
        terms = []
        for (t, _), v in list(self.r.items()) + list(self.w.items()):
            size = objective_kib(bound, t)
            if size:
                terms.append(size * v)
        terms += [part_kib[t] * v for (t, _), v in self.rp.items() if part_kib[t]]
        terms += [launch * v for v in self.used]
        for u, ops in enumerate(self.units):
            c = recompute_kib(bound, ops, profile, options.compute_weight)
            if c:
                terms += [c * self.x[u, k] for k in K]
        m.Minimize(sum(terms))
        self.variables = len(m.Proto().variables)  # what a solve's overhead grows with

    def _static_rules(self) -> None:
        graph, m = self.graph, self.model
        fusion = graph.fusion
        K = range(self.K)
        n = len(self.units)
        for u, ops in enumerate(self.units):
            if any(graph.roles[i] in (Role.LIBRARY, Role.FALLBACK) for i in ops):
                for k in K:
                    others = [self.x[v, k] for v in range(n) if v != u]
                    if others:
                        m.Add(sum(others) == 0).OnlyEnforceIf(self.x[u, k])
        sig = {i: self.rules.signature[i] for ops in self.units for i in ops
               if i in self.rules.signature}
        red_units = sorted({self.unit_of[i] for i in sig})
        # (resizes may join a reduction along kept axes, and gathers of one element per row
        # its epilogue: classify decides, see optimizer.kinds.resize and .gather)
        view_units = sorted({u for u, ops in enumerate(self.units)
                             if any(reindexes(fusion.ops[i], graph.bound)
                                    and not is_resize(fusion.ops[i])
                                    and not may_gather_rows(graph.bound, fusion.ops[i])
                                    for i in ops)})
        inner_outer = Kind.INNER_OUTER in graph.kinds

        def conflict(ua: int, ub: int) -> None:
            for k in K:
                m.AddBoolOr([self.x[ua, k].Not(), self.x[ub, k].Not()])

        for pos, ua in enumerate(red_units):
            for ub in red_units[pos + 1:]:
                sa = {sig[i] for i in self.units[ua] if i in sig}
                sb = {sig[i] for i in self.units[ub] if i in sig}
                if not all(_compatible(p, q, inner_outer) for p in sa for q in sb):
                    conflict(ua, ub)
            for uv in view_units:
                if uv != ua:
                    conflict(ua, uv)
        for i in sig:
            for o in self.rules.frontier[i]:
                ua, uo = self.unit_of[i], self.unit_of.get(o)
                if uo is not None and uo != ua:
                    conflict(ua, uo)

    def add_cut(self, ops: frozenset[int], written: frozenset[str]) -> None:
        """Forbid, in every slot, a minimal set of units that cannot form a segment."""
        graph = self.graph
        units = sorted({self.unit_of[i] for i in ops if i in self.unit_of})

        def bad(us: Iterable[int]) -> bool:
            ops_ = frozenset(i for u in us for i in self.units[u])
            w = frozenset(t for t in written if t in graph.produced(ops_))
            return bool(w) and not graph.classify(ops_, w)

        # Drop runs of units while the rest still breaks a rule, halving the run length down to
        # single units: a small core of a large slot costs a few classifications per unit kept,
        # not one per unit of the slot.
        core = list(units)
        run = max(len(core) // 2, 1)
        while True:
            k = 0
            while k < len(core):
                trial = core[:k] + core[k + run:]
                if trial and bad(trial):
                    core = trial
                else:
                    k += run
            if run == 1:
                break
            run //= 2
        core_ops = frozenset(i for u in core for i in self.units[u])
        core_w = sorted(t for t in written if t in graph.produced(core_ops)
                        and (t, 0) in self.w)
        for k in range(self.K):
            self.model.AddBoolOr([self.x[u, k].Not() for u in core] +
                                 [self.w[t, k].Not() for t in core_w])

    def solve(self, effort: _Effort, wall_limit: float, seed: int, hint: list[Group]):
        m = self.model
        m.ClearHints()
        self._hint(hint)
        solver = cp_model.CpSolver()
        p = solver.parameters
        p.random_seed = seed
        p.num_workers = 1  # one worker's deterministic time is reproducible (and on few cores
        # it searches further per second than interleaved workers)
        p.max_deterministic_time = effort.per_solve
        p.max_time_in_seconds = max(wall_limit, 0.1)  # a backstop; see the module's docstring
        status = solver.Solve(m)
        effort.solved(solver.deterministic_time, self.variables)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return None
        groups = []
        for k in range(self.K):
            if not solver.Value(self.used[k]):
                continue
            ops = frozenset(i for u in range(len(self.units)) if solver.Value(self.x[u, k])
                            for i in self.units[u])
            written = frozenset(t for (t, j), v in self.w.items() if j == k and solver.Value(v))
            if ops:
                groups.append((ops, written))
        name = "OPTIMAL" if status == cp_model.OPTIMAL else "FEASIBLE"
        return groups, name, solver.ObjectiveValue() * KIB, solver.BestObjectiveBound() * KIB

    def _hint(self, groups: list[Group]) -> None:
        m = self.model
        slot: dict[int, set[int]] = {}
        for k, (ops, _) in enumerate(groups):
            for i in ops:
                if i in self.unit_of:
                    slot.setdefault(self.unit_of[i], set()).add(k)
        for (u, k), v in self.x.items():
            m.AddHint(v, k in slot.get(u, ()))
        for k, v in enumerate(self.used):
            m.AddHint(v, k < len(groups))
        written = {(t, k) for k, (_, w) in enumerate(groups) for t in w}
        for key, v in self.w.items():
            m.AddHint(v, key in written)
        reads = set()
        fusion = self.graph.fusion
        for k, (ops, _) in enumerate(groups):
            closure = self.graph.closure(ops)
            made = self.graph.produced(closure)
            reads |= {(n, k) for i in closure for n in fusion.ops[i].inputs
                      if n in fusion.tensors and n not in made}
        for key, v in self.r.items():
            m.AddHint(v, key in reads)


class _Rules:
    """What every window's static kind rules read, found once per search: each reduction's
    signature (its domain and reduced axes, as axis ids of the whole fusion) and the ops that
    bring its result back onto its reduced axes."""

    def __init__(self, graph: SegGraph):
        fusion = graph.fusion
        axes = AxisMap(graph.bound, (fusion.ops[i] for i in graph.ops))
        self.signature: dict[int, tuple] = {}
        self.frontier: dict[int, list[int]] = {}
        reductions = [i for i in graph.ops if graph.roles[i] is Role.REDUCTION]
        online = {p.max_op: p for p in online_pairs(graph.bound, graph.ops, reductions,
                                                    graph.outputs)}
        for i in reductions:
            op = fusion.ops[i]
            ids = axes.ids(op.inputs[0])
            red = set(reduction_axes(op.attrs, len(ids)))
            self.signature[i] = (frozenset(x for x in ids if x is not None),
                                 frozenset(x for a, x in enumerate(ids)
                                           if x is not None and a in red))
            self.frontier[i] = _broadcast_back_frontier(graph, axes, i, online.get(i))


def _broadcast_back_frontier(graph: SegGraph, axes: AxisMap, r: int,
                             online: OnlinePair | None = None) -> list[int]:
    """For a reduction that does not reduce the innermost axis of its input (no persistent
    kernel keeps such rows), the first ops downstream that bring its result back onto the reduced
    axes. Such an op cannot share a segment with the reduction, unless it is part of the online
    log-sum-exp pair ``online`` that the reduction (a max) anchors."""
    fusion = graph.fusion
    op = fusion.ops[r]
    ids = axes.ids(op.inputs[0])
    red = set(reduction_axes(op.attrs, len(ids)))
    real = [a for a, x in enumerate(ids) if x is not None]
    reduced = {ids[a] for a in real if a in red}
    if not reduced or real[-1] in red:
        return []  # a row reduction: broadcasting back is what normalization does
    frontier = []
    seen: set[int] = set()
    stack = [o for o in op.outputs if o in fusion.tensors]
    while stack:
        t = stack.pop()
        for c in graph.consumers.get(t, ()):
            if c in seen:
                continue
            seen.add(c)
            outs = [o for o in fusion.ops[c].outputs if o in fusion.tensors]
            if online is not None and c == online.sum_op:
                continue  # the pair's own sum: one accumulator with the max
            if online is not None and c in online.absorbed:
                stack.extend(outs)
                continue
            if graph.roles[c] is Role.REDUCTION or any(
                    x in reduced for o in outs for x in axes.ids(o)):
                frontier.append(c)
            else:
                stack.extend(outs)
    return frontier


def _compatible(a: tuple, b: tuple, inner_outer: bool) -> bool:
    """Two reduction signatures may share a segment: the same, or inner/outer complements."""
    if a == b:
        return True
    (da, ra), (db, rb) = a, b
    return inner_outer and da == db and not (ra & rb) and (ra | rb) == da


def _coarsen(graph: SegGraph, window: list[Group]) -> list[frozenset[int]]:
    """Units: an op joins its only consumer when nothing else reads its results and the current
    plan has them in one segment; library, fallback and segment_set ops stay alone."""
    fusion = graph.fusion
    ops = sorted({i for g, _ in window for i in g})
    home = {i: k for k, (g, _) in enumerate(window) for i in g}
    sets = DisjointSets(ops)

    solo = {Role.LIBRARY, Role.FALLBACK, Role.SEGMENT_SET}
    for i in ops:
        if graph.roles[i] is not Role.FUSIBLE:
            continue
        outs = [o for o in fusion.ops[i].outputs if o in fusion.tensors]
        if any(o in graph.outputs for o in outs):
            continue
        readers = {c for o in outs for c in graph.consumers.get(o, ())}
        if len(readers) != 1:
            continue
        (c,) = readers
        if c not in sets or graph.roles[c] in solo or home.get(c) != home.get(i):
            continue
        sets.union(i, c)
    return [frozenset(g) for g in sets.groups()]
