"""How a pointwise kernel indexes its domain, and which adjacent axes it indexes as one.

The emitter names one index per domain axis (``x0``, ``x1``, ...; the innermost one plus the
lane, ``(x1 + _lane)``, where a thread takes vectors), and the kernel addresses each run of
adjacent axes with one index (``x0_1`` for axes 0 and 1): a contiguous [8192, 14336] domain is
indexed flat, without a division and a remainder by 14336 per vector.

Axes merge into a run where every access walks them contiguously (``layout.merge_axes``), and
only where the kernel needs no per-axis index of the run anyway. Both are decided before the
kernel is written, on a survey: the emitter runs once over the segment with a load that only
records, giving every access (tensor, typed index, strides) and the names the values' code reads.
An access whose index is not a plain domain index (a slice's offset, a pad's clamp, a gather)
keeps every axis apart; so does a per-axis index read outside an address (an iota's position, a
pad's or cat's condition, a random number's linear index, a bounds condition, a guarded store).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from fusecut.codegen.bounds import Strided, in_bounds
from fusecut.codegen.code import Code, derived, named, names
from fusecut.codegen.emit import Emitter, FlatIndex
from fusecut.codegen.index import (
    LANE,
    ZERO,
    All,
    Const,
    Equal,
    Index,
    IndexExpr,
    Less,
    Var,
    plus_lane,
)
from fusecut.codegen.launch import LaunchDecision, pointwise_launch
from fusecut.codegen.layout import compact_strides, merge_axes, numel, tensor_strides
from fusecut.codegen.names import Names
from fusecut.codegen.regions import shorter_axes
from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.kinds.rules import Schedule

Run = tuple[int, int]  # first and last domain axis of a run


@dataclass(frozen=True)
class Indexing:
    """A kernel's indices over ``domain``: one per axis for the emitter, one per run of ``runs``
    for its addresses, the innermost one taking ``vec`` lanes a vector."""

    domain: tuple[int, ...]
    runs: tuple[Run, ...]
    vec: int

    @property
    def rank(self) -> int:
        return len(self.domain)

    @property
    def merged(self) -> bool:
        return any(a != b for a, b in self.runs)

    @cached_property
    def extents(self) -> list[int]:
        return [numel(self.domain[a:b + 1]) for a, b in self.runs]

    @cached_property
    def xs(self) -> list[Var]:
        return [Var(f"x{a}") for a in range(self.rank)]

    @cached_property
    def run_names(self) -> list[Var]:
        return [self.xs[a] if a == b else Var(f"x{a}_{b}") for a, b in self.runs]

    @cached_property
    def lane_expr(self) -> IndexExpr:
        """The innermost axis's index of the current lane."""
        if not self.rank:
            return ZERO
        return plus_lane(self.xs[-1]) if self.vec > 1 else self.xs[-1]

    @cached_property
    def run_lane(self) -> IndexExpr:
        """The innermost run's index of the current lane."""
        return plus_lane(self.run_names[-1]) if self.rank and self.vec > 1 else self.lane_expr

    @cached_property
    def domain_idx(self) -> Index:
        """The index of every domain axis, as the emitter takes it."""
        return (*self.xs[:-1], self.lane_expr) if self.rank else ()

    @cached_property
    def axis_of(self) -> dict[IndexExpr, int]:
        return {x: a for a, x in enumerate(self.xs)} | \
            ({self.lane_expr: self.rank - 1} if self.rank else {})

    @cached_property
    def ranges(self) -> dict[str, Strided]:
        """Each index's values (the innermost one starts a vector), for ``codegen.bounds``."""
        out = {x.name: (0, e - 1, 1) for x, e in zip(self.xs, self.domain)}
        if self.rank and self.vec > 1:
            out[self.xs[-1].name] = (0, self.domain[-1] - self.vec, self.vec)
            out[LANE] = (0, self.vec - 1, 1)
        return out

    @cached_property
    def merged_names(self) -> frozenset[str]:
        """The per-axis indices a merged run replaces."""
        return frozenset(self.xs[k].name for a, b in self.runs if a != b
                         for k in range(a, b + 1))

    def domain_strides(self, idx: Index, strides: tuple[int, ...]) -> tuple[int, ...] | None:
        """The stride of each domain axis in an access at ``idx`` (0 where it does not move
        along it), or None where a component is not a plain domain index or two name one
        axis."""
        ds = [0] * self.rank
        for i, s in zip(idx, strides):
            if s == 0 or i == ZERO:
                continue
            a = self.axis_of.get(i)
            if a is None or ds[a]:
                return None
            ds[a] = s
        return tuple(ds)

    def addressed(self, idx: Index, strides: tuple[int, ...]) -> tuple[Index, tuple[int, ...]]:
        """An access as the kernel addresses it: onto the runs' indices where axes merged
        (the access is then a plain domain index: the survey said so)."""
        if not self.merged:
            return idx, strides
        ds = self.domain_strides(idx, strides)
        lane = self.vec > 1 and self.lane_expr in idx
        out_idx, out_strides = [], []
        for (a, b), run in zip(self.runs, self.run_names):
            inner = max((k for k in range(a, b + 1) if self.domain[k] != 1), default=None)
            if inner is None or ds[inner] == 0:
                continue
            out_idx.append(self.run_lane if lane and inner == self.rank - 1 else run)
            out_strides.append(ds[inner])
        return tuple(out_idx), tuple(out_strides)

    def flat_index(self, bound: Bound) -> FlatIndex | None:
        """The emitter's linear index of a domain-shaped tensor: the loop's flat counter (a
        multiple of the vector width) and the lane."""
        if not self.rank:
            return None
        flat = (derived("(unsigned long long)flat", "flat"),
                derived(f"(unsigned int){LANE}", LANE) if self.vec > 1 else Code("0u"))

        def flat_index(t: str, idx: Index) -> tuple[Code, Code] | None:
            return flat if idx == self.domain_idx and \
                tuple(bound.shapes[t]) == self.domain else None

        return flat_index

    def within(self, bound: Bound, t: str, idx: Index) -> IndexExpr | None:
        """The condition under which input t is read at ``idx``, where the domain reaches past
        t's end (``codegen.bounds``): only the outputs' guarded stores use those values, so the
        threads past it load nothing."""
        conds = [c for i, n in zip(idx, bound.shapes[t]) for c in in_bounds(i, n, self.ranges)]
        return All(*conds) if conds else None


def laid_out_like_the_domain(bound: Bound, schedule: Schedule, t: str) -> bool:
    """Output t has the domain's shape and axis order (a broadcast axis is a unit axis of the
    domain): it is stored a whole vector at a time."""
    domain, shape = schedule.domain, bound.shapes[t]
    # a broadcast axis is not stored, whatever its extent: one of extent 1 in the domain
    # (``pointwise.without_unwritten_axes``) is laid out like it
    return len(shape) == len(domain) and all(
        (m == a and shape[a] == domain[a]) or (m is None and domain[a] == 1)
        for a, m in enumerate(schedule.axis_map[t]))


def output_index(schedule: Schedule, ix: Indexing, t: str) -> Index:
    return tuple(ZERO if m is None else ix.domain_idx[m] for m in schedule.axis_map[t])


def store_guards(bound: Bound, schedule: Schedule, ix: Indexing, t: str) -> list[IndexExpr]:
    """Where output t is written: at index 0 of the moving domain axes it does not have, and
    inside it where it is shorter than the domain."""
    covered = {m for m in schedule.axis_map[t] if m is not None}
    guards: list[IndexExpr] = [Equal(ix.domain_idx[a], ZERO) for a in range(ix.rank)
                               if a not in covered and ix.domain[a] > 1]
    shape = bound.shapes[t]
    return guards + [Less(ix.domain_idx[m], Const(shape[a]))
                     for a, m in shorter_axes(bound, schedule, t)]


def launch_for(bound: Bound, schedule: Schedule, runs: tuple[Run, ...], vector: int | None
               ) -> LaunchDecision:
    """The launch of a kernel indexing ``runs``: its vectors run along the innermost run."""
    domain = schedule.domain
    innermost = numel(domain[runs[-1][0]:]) if domain and domain[-1] > 1 else 1
    return pointwise_launch(bound, schedule, innermost, vector)


@dataclass(frozen=True)
class Survey:
    """What a kernel's emitter reads and writes: per access (each input read and output write),
    the stride of every domain axis (None: an access that is not a plain domain index), and the
    names read outside the addresses (values' code, bounds conditions, store guards)."""

    rows: tuple[tuple[int, ...], ...] | None
    reads: frozenset[str]


def survey(bound: Bound, schedule: Schedule, ix: Indexing, launch: LaunchDecision) -> Survey:
    """The accesses and reads of the kernel ``ix`` and ``launch`` index (a run of the emitter
    over the segment whose loads only record: no kernel is written)."""
    accesses: list[tuple[int, ...] | None] = []
    outside: set[str] = set()

    def record(t: str, idx: Index) -> Code:
        accesses.append(ix.domain_strides(idx, tensor_strides(bound, t)))
        outside.update(names(ix.within(bound, t, idx)))
        return named(f"ld{len(accesses)}")

    em = Emitter(bound, schedule.ops, set(schedule.inputs), record, launch.index_type, Names(),
                 flat_index=ix.flat_index(bound), resizes=launch.resizes)
    for t in schedule.outputs:
        idx = output_index(schedule, ix, t)
        em.raw(t, idx)
        if laid_out_like_the_domain(bound, schedule, t) and ix.vec > 1:
            idx = tuple(ix.xs)  # the vector store addresses the first lane
        else:
            outside.update(names(store_guards(bound, schedule, ix, t)))
        accesses.append(ix.domain_strides(idx, compact_strides(bound, t)))
    for s in em.lines:
        outside.update(s.reads)
    rows = None if any(r is None for r in accesses) else tuple(accesses)
    return Survey(rows, frozenset(outside))


def direct_indexing(bound: Bound, schedule: Schedule, vector: int | None
                    ) -> tuple[Indexing, LaunchDecision]:
    """The indexing of a direct kernel: adjacent axes merged where every access walks them as
    one and nothing else reads their own indices, else one index per axis."""
    domain = tuple(schedule.domain)
    per_axis = tuple((a, a) for a in range(len(domain)))
    launch = launch_for(bound, schedule, per_axis, vector)
    apart = Indexing(domain, per_axis, launch.vector)
    found = survey(bound, schedule, apart, launch)
    if found.rows is None:  # an access that is not a plain domain index (slice, pad, gather...)
        return apart, launch
    runs = tuple(merge_axes(list(domain), list(found.rows)))
    if len(runs) == len(per_axis):
        return apart, launch
    merged_launch = launch_for(bound, schedule, runs, vector)
    merged = Indexing(domain, runs, merged_launch.vector)
    if merged_launch != launch:  # wider vectors along the longer run: other reads, maybe
        found = survey(bound, schedule, merged, merged_launch)
    if found.rows is None or found.reads & merged.merged_names:
        return apart, launch  # an op that needs the per-axis indices (iota, a guarded store...)
    return merged, merged_launch
