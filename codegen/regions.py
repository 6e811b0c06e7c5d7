"""Shared machinery of the reduction-kind generators: a code region evaluates tensors at an index
of the reduction domain P, with loads vectorised along the innermost axis and hoisted when they
do not depend on the lane.

A region owns its statements and memo: values computed inside a loop are not visible after it,
so each region (loop body, epilogue, finishing kernel) starts fresh, seeded with the values the
kernel itself holds there (reduction results, on-chip buffers).
"""

from __future__ import annotations

from collections.abc import Callable

from fusecut.codegen import cuda
from fusecut.codegen.code import Code, Stmt, declare, derived, lines, named, stmt
from fusecut.codegen.cuda import loaded
from fusecut.codegen.emit import Emitter
from fusecut.codegen.index import (
    LANE,
    ZERO,
    Index,
    IndexExpr,
    at_lane_zero,
    join_index,
    lane_base,
    reads,
    uses,
)
from fusecut.codegen.layout import address, compact_strides, tensor_strides
from fusecut.codegen.names import Names, value_name
from fusecut.codegen.precision import fast_math_tensors
from fusecut.codegen.resize import whole_vector_resizes
from fusecut.optimizer.analysis.axes import domain_axes
from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.kinds.rules import Schedule


class Region:
    def __init__(self, bound: Bound, schedule: Schedule, itype: str, p_idx: Index,
                 vec: int, aligned: dict[str, int], params: list[str],
                 names: Names | None = None):
        """``p_idx``: the index of every domain axis in this region; ``vec``: lanes of the
        innermost axis (its index reads ``_lane``); ``names``: those of the kernel source the
        region is part of."""
        self.bound = bound
        self.schedule = schedule
        self.p_idx = p_idx
        self.vec = vec
        self.aligned = aligned
        self.params = params
        self.pre: list[Stmt] = []
        self.decls: list[Stmt] = []  # registers of vectorised stores (before the lane loop)
        self.post: list[Stmt] = []  # the vector stores (after the lane loop)
        self._vec_loads: dict[tuple, str] = {}
        self._computed: set[str] = set()  # names the statements declare (see _reads_computed)
        self._scanned = 0
        self.em = Emitter(bound, schedule.ops, set(schedule.inputs), self._load, itype, names,
                          fast_math_tensors(bound, schedule),
                          resizes=whole_vector_resizes(bound, schedule.ops, vec))

    def index_of(self, tensor: str) -> Index:
        """The tensor's index in this region, through its axis map onto the domain (an axis on
        a run of domain axes joins their indices, as the emitter's reshapes do)."""
        return tensor_index(self.schedule, self.p_idx, tensor, self.em.join)

    def value(self, tensor: str) -> Code:
        return self.em.value(tensor, self.index_of(tensor))

    def raw(self, tensor: str) -> Code:
        """The value to store (see ``Emitter.raw``)."""
        return self.em.raw(tensor, self.index_of(tensor))

    def seed(self, tensor: str, expr: Code) -> None:
        """A value the kernel holds itself (an on-chip buffer)."""
        self.em.memo[(tensor, self.index_of(tensor))] = expr

    def result(self, tensor: str, expr: Code) -> Stmt:
        """Declare a value the kernel computed itself (a reduction result); returns the
        statement."""
        return self.em.result(tensor, self.index_of(tensor), expr)

    def store(self, tensor: str, expr: Code, guard: str | None = None) -> None:
        """Write a value: lane by lane into a register vector stored whole after the lane loop
        where the tensor's innermost stored axis follows the lanes, else element by element."""
        d = self.bound.fusion.tensors[tensor].dtype
        idx = self.index_of(tensor)
        strides = compact_strides(self.bound, tensor)
        lanes = [a for a, i in enumerate(idx) if uses(i, LANE)]
        if (guard is None and self.vec > 1 and len(lanes) == 1
                and lane_base(idx[lanes[0]]) is not None and strides[lanes[0]] == 1
                and all(s % self.vec == 0 for a, s in enumerate(strides) if a != lanes[0])):
            a = lanes[0]
            base = tuple(at_lane_zero(i) if k == a else i for k, i in enumerate(idx))
            reg = f"o_{tensor}"
            st = cuda.storage(d)
            self.decls.append(stmt(f"fc_vec<{st}, {self.vec}> {reg};", "fc_vec"))
            stored = cuda.to_storage(expr, d)
            self.em.lines.append(stmt(f"{reg}.v[{LANE}] = {stored};", LANE, expr, stored))
            where = address(base, strides)
            self.post.append(stmt(f"*reinterpret_cast<fc_vec<{st}, {self.vec}>*>(out_{tensor} + "
                                  f"{where}) = {reg};", where, "fc_vec"))
            self.aligned[tensor] = self.vec * d.itemsize
            return
        where = address(idx, strides)
        stored = cuda.to_storage(expr, d)
        line = f"out_{tensor}[{where}] = {stored};"
        self.em.lines.append(stmt(f"if ({guard}) {line}" if guard else line, where, expr, stored))

    def lane_block(self, prefix: list[Stmt]) -> list[Stmt]:
        """``prefix``, the hoisted loads, then the per-lane statements in a lane loop, then the
        vector stores."""
        self.finish()
        lines = prefix + self.pre + self.decls + lane_loop(self.vec, self.em.lines) + self.post
        return lines

    def finish(self) -> list[Stmt]:
        for p in self.em.params:
            if p not in self.params:
                self.params.append(p)
        return self.pre + self.em.lines

    def _load(self, t: str, idx: Index) -> Code:
        bound, em = self.bound, self.em
        d = bound.fusion.tensors[t].dtype
        strides = tensor_strides(bound, t)
        st, ct = cuda.storage(d), cuda.compute(d)
        where = address(idx, strides)
        if not any(uses(i, LANE) for i in idx) and not self._reads_computed(idx):
            hoisted = em.names.fresh(value_name(t))
            self.pre.append(declare(ct, hoisted, loaded(f"in_{t}[{where}]", d, where)))
            return named(hoisted)
        lanes = [a for a, i in enumerate(idx) if uses(i, LANE)]
        if (self.vec > 1 and len(lanes) == 1 and lane_base(idx[lanes[0]]) is not None
                and strides[lanes[0]] == 1
                and all(s % self.vec == 0 for a, s in enumerate(strides) if a != lanes[0])
                and not self._reads_computed(idx)):  # a vector is read before the lane loop
            a = lanes[0]
            base = tuple(at_lane_zero(i) if k == a else i for k, i in enumerate(idx))
            key = (t, base)
            if key not in self._vec_loads:
                vname = em.names.fresh(f"vec_{t}")
                first, guard = address(base, strides), em.lane_guard(idx[a])
                read = vector_read(st, self.vec, f"in_{t} + {first}", guard)
                self.pre.append(declare(f"fc_vec<{st}, {self.vec}>", vname, read,
                                        reads=(first, guard)))
                self._vec_loads[key] = vname
                self.aligned[t] = self.vec * d.itemsize
            vname = self._vec_loads[key]
            return loaded(f"{vname}.v[{LANE}]", d, vname, LANE, simple=True)
        return em.let_load(t, loaded(f"in_{t}[{where}]", d, where))

    def _reads_computed(self, idx: Index) -> bool:
        """Whether an index reads a value the region's statements compute (a gather's index
        computed from its input): a load at it cannot be hoisted above them."""
        statements = self.em.lines
        self._computed.update(s.declares for s in statements[self._scanned:] if s.declares)
        self._scanned = len(statements)
        return any(not reads(i).isdisjoint(self._computed) for i in idx)


def tensor_index(schedule: Schedule, p_idx: Index, tensor: str,
                 join: Callable[[Index, tuple[int, ...]], IndexExpr] = join_index) -> Index:
    """The tensor's index where the domain's axes are indexed by ``p_idx``, through its axis
    map (an axis on a run of domain axes joins their indices with ``join``)."""
    out = []
    for m in schedule.axis_map[tensor]:
        run = domain_axes(m)
        if not run:
            out.append(ZERO)
        elif len(run) == 1:
            out.append(p_idx[run[0]])
        else:
            out.append(join(tuple(p_idx[a] for a in run),
                            tuple(schedule.domain[a] for a in run)))
    return tuple(out)


def shorter_axes(bound: Bound, schedule: Schedule, t: str) -> list[tuple[int, int]]:
    """(axis of output t, the domain axis it runs along) wherever t is shorter than the domain
    (k's heads beside q's, a slice written out): t's stores there are guarded, and the loads
    that feed it must stay inside their tensors (``codegen.bounds``)."""
    return [(a, m) for a, m in enumerate(schedule.axis_map[t])
            if m is not None and bound.shapes[t][a] < schedule.domain[m]]


def vector_read(storage: str, vec: int, pointer: str, guard: IndexExpr | None = None) -> Code:
    """A vector of ``vec`` values of C type ``storage`` at ``pointer`` (aligned to the
    vector); where ``guard`` is given, read only under it (zeros otherwise: a piece of a cat or
    pad the vector does not lie in)."""
    vt = f"fc_vec<{storage}, {vec}>"
    read = f"*reinterpret_cast<const {vt}*>({pointer})"
    if guard is None:
        return derived(read, "fc_vec")
    return derived(f"{guard} ? {read} : {vt}{{}}", "fc_vec", guard)


def vector_address(bound: Bound, t: str, idx: Index, vec: int) -> IndexExpr | None:
    """The address of input t's first element at index ``idx`` (its lanes along the
    innermost axis), if its ``vec`` lanes are contiguous in memory (else None)."""
    strides = tensor_strides(bound, t)
    lanes = [a for a, i in enumerate(idx) if uses(i, LANE)]
    if vec == 1 and not lanes:
        return address(idx, strides)
    if (vec > 1 and len(lanes) == 1 and strides[lanes[0]] == 1
            and all(x % vec == 0 for a, x in enumerate(strides) if a != lanes[0])):
        a = lanes[0]
        return address(tuple(at_lane_zero(i) if k == a else i for k, i in enumerate(idx)),
                       strides)
    return None


def lane_loop(vec: int, body: list[Stmt]) -> list[Stmt]:
    """``body`` for each lane of a vector: a loop, or for one lane the lane declared 0 where the
    body reads it."""
    if vec == 1:
        reads_lane = any(LANE in s.reads for s in body)
        return [declare("int", LANE, "0"), *body] if reads_lane else body
    return [*lines("#pragma unroll"), lane_for(vec), *[s.indented(2) for s in body],
            *lines("}")]


def lane_for(vec: int, body: str = "{", *parts) -> Stmt:
    """``for (int _lane = 0; _lane < vec; ++_lane) body``: reads the lane and what ``parts``
    (those of ``body``) read."""
    head = f"for (int {LANE} = 0; {LANE} < {vec}; ++{LANE})"
    return stmt(f"{head} {body}" if body else head, LANE, *parts)
