"""Segment kinds and their can-schedule rule: the contract between planner and code generator.

``classify(bound, ops, outputs, profile)`` returns the ``Schedule`` of a candidate segment (its
kind, iteration domain and how every tensor maps onto it) or a ``Rejection`` saying why no kind
fits. Every segmenter keeps only segments that classify; the code generator builds kernels from
the Schedule and relies on each rule below.

- pointwise: fusible ops only; every written tensor embeds (axis by axis, each axis onto a distinct
  axis at least as long) into the largest written tensor, whose domain the kernel iterates; a
  shorter axis is written where its index is in range. Views and resizes are index maps.
- reduction: real reductions that all reduce the same axes of one domain P, with a prologue on P
  and an epilogue on the reduced domain; nothing on P may depend on a reduction's result, except
  inside an online max/sum-exp pair (one accumulator, ``optimizer.kinds.online``).
- normalization: as reduction, but P-domain values that depend on reduction results (reduce,
  broadcast back, combine); the reduced axes must be the trailing axes of P (a row is kept on
  chip) and the row's persistent bytes must fit the profile's budget.
- inner_outer: normalization plus column reductions over all the other axes of the same P.
- library: one matmul/linear, through cuBLAS.
- fallback: one op without a generated kernel, through the torch reference.
In reduction kinds only axis-preserving ops may appear (no gather, no reshape but one that splits
or merges axes), so every tensor's axes land on axes of P (see ``optimizer.analysis.axes``); a
plain reduction may also hold resizes along its kept axes, of values computed before its
reductions (``optimizer.kinds.resize``), or gathers of one element per reduced row
(``optimizer.kinds.gather``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fusecut.optimizer.analysis.axes import AxisEntry, AxisMap, domain_axes
from fusecut.optimizer.analysis.opclass import Role, reindexes, role
from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.ir.ops_misc import reduction_axes
from fusecut.optimizer.kinds.gather import may_gather_rows, row_gather_misfit, tie_row_gathers
from fusecut.optimizer.kinds.kind import Kind
from fusecut.optimizer.kinds.online import online_pairs
from fusecut.optimizer.kinds.persistent import Extension, Persistence, analyze_persistence
from fusecut.optimizer.kinds.resize import (
    is_resize,
    place_through_partner,
    shifted_result_misfit,
    tie_resizes,
)
from fusecut.optimizer.profiles import DeviceProfile


@dataclass(frozen=True)
class Rejection:
    reason: str

    def __bool__(self) -> bool:
        return False


# kw_only: a Schedule has fifteen fields, several of them tuples of ints; built by position,
# two swapped ones (row and column axes, say) would still type-check (issue 46)
@dataclass(frozen=True, kw_only=True)
class Schedule:
    kind: Kind
    ops: tuple[int, ...]  # op indices, program order
    inputs: tuple[str, ...]  # tensors read from global memory
    outputs: tuple[str, ...]  # tensors written to global memory
    domain: tuple[int, ...] = ()  # iteration domain (pointwise: the reference output; else P)
    ref: str | None = None  # the tensor whose axes define the domain
    # tensor -> domain axis of each of its axes (None: broadcast; reduction kinds: a run of
    # domain axes for an axis a reshape splits, see domain_axes). Pointwise: written tensors;
    # reduction kinds: every tensor of the segment.
    axis_map: dict[str, tuple[AxisEntry, ...]] = field(default_factory=dict)
    reduction_axes: tuple[int, ...] = ()  # domain axes the (row) reductions reduce
    outer_axes: tuple[int, ...] = ()  # inner_outer: domain axes the column reductions reduce
    reductions: tuple[int, ...] = ()  # row reductions (op indices)
    outer_reductions: tuple[int, ...] = ()  # inner_outer column reductions (op indices)
    persistence: Persistence | None = None
    # What classifying a segment that contains this one reuses (reduction kinds): the tensors
    # with an axis placed by position (see ``_complete_by_position``), and the persistence
    # analysis, kept for the reduction kind too.
    by_position: frozenset[str] = field(default=frozenset(), compare=False, repr=False)
    analysis: Persistence | None = field(default=None, compare=False, repr=False)
    # (max op, sum op) pairs computed in one pass by an online log-sum-exp accumulator (see
    # ``optimizer.kinds.online``); the ops between them are never evaluated on their own.
    online: tuple[tuple[int, int], ...] = ()

    def __bool__(self) -> bool:
        return True

    @property
    def kernels(self) -> int:
        """Kernels the segment launches: inner_outer adds a column finisher to its row kernel."""
        return 2 if self.kind is Kind.INNER_OUTER else 1

    @property
    def on_tensor_cores(self) -> bool:
        """A library call (matmul/linear): its arithmetic runs on tensor cores."""
        return self.kind is Kind.LIBRARY


REDUCTION_KINDS = frozenset({Kind.REDUCTION, Kind.NORMALIZATION, Kind.INNER_OUTER})


@dataclass(frozen=True)
class SegmentFacts:
    """What ``classify`` reads off a candidate segment's ops before it applies the kinds' rules.
    ``segment_facts`` computes them from the ops; a segmenter that grows segments by merging
    derives them from the merged parts instead (``optimizer.segmenters.parts``)."""

    ops: tuple[int, ...]  # op indices, program order
    inputs: tuple[str, ...]  # tensors read and not produced, in order of first use
    produced: frozenset[str]  # tensors the ops compute
    alone: tuple[int, ...]  # library and fallback ops
    segment_sets: tuple[int, ...]
    reductions: tuple[int, ...]
    views: tuple[int, ...]  # ops that re-index data (see ``reindexes``)
    axes: AxisMap  # the ops' ties
    # A merging segmenter's: the Schedule of a segment these ops contain, whose analysis is
    # extended instead of redone, and the fusion's consumer and producer indexes.
    base: Schedule | None = None
    consumers: Mapping[str, Sequence[int]] | None = None
    producer: Mapping[str, int] | None = None


def segment_facts(bound: Bound, ops: Iterable[int], roles: Mapping[int, Role] | None = None
                  ) -> SegmentFacts:
    """``roles``: the ops' roles, where the caller knows them already."""
    fusion = bound.fusion
    ops = tuple(sorted(set(ops)))
    produced: set[str] = set()
    inputs: dict[str, None] = {}
    by_role: dict[Role, list[int]] = {r: [] for r in Role}
    for i in ops:
        op = fusion.ops[i]
        for name in op.inputs:
            if name in fusion.tensors and name not in produced:
                inputs.setdefault(name)
        produced.update(o for o in op.outputs if o in fusion.tensors)
        by_role[roles[i] if roles is not None else role(op, bound)].append(i)
    alone = by_role[Role.LIBRARY] + by_role[Role.FALLBACK]
    return SegmentFacts(ops, tuple(inputs), frozenset(produced), tuple(sorted(alone)),
                        tuple(by_role[Role.SEGMENT_SET]), tuple(by_role[Role.REDUCTION]),
                        tuple(i for i in ops if reindexes(fusion.ops[i], bound)),
                        AxisMap(bound, (fusion.ops[i] for i in ops)))


def written_order(bound: Bound, written: Iterable[str]) -> tuple[str, ...]:
    """A segment's outputs in the order of the ops computing them."""
    return tuple(sorted(set(written), key=lambda t: (_order(bound, t), t)))


def _order(bound: Bound, tensor: str) -> int:
    return bound.producers.get(tensor, -1)


ALL_KINDS = frozenset(Kind)


def classify(bound: Bound, ops: Iterable[int], written: Iterable[str], profile: DeviceProfile,
             kinds: frozenset[Kind] = ALL_KINDS, facts: SegmentFacts | None = None
             ) -> Schedule | Rejection:
    """The Schedule of a candidate segment, or why it cannot be one (only ``kinds`` allowed).
    ``facts``: the ``segment_facts`` of ``ops``, where the caller has them already."""
    result = _classify(bound, facts or segment_facts(bound, ops), written, profile)
    if result and result.kind not in kinds:
        return Rejection(f"{result.kind.value} segments are disabled")
    return result


def _classify(bound: Bound, facts: SegmentFacts, written: Iterable[str],
              profile: DeviceProfile) -> Schedule | Rejection:
    fusion = bound.fusion
    ops, inputs, produced = facts.ops, facts.inputs, facts.produced
    if not ops:
        return Rejection("empty segment")
    outputs = written_order(bound, written)
    missing = [t for t in outputs if t not in produced]
    if missing:
        return Rejection(f"writes {missing} that it does not compute")
    if not outputs:
        return Rejection("a segment must write something")
    alone = facts.alone
    if alone:
        if len(ops) > 1:
            op = fusion.ops[alone[0]]
            return Rejection(f"{op.name} ({op.outputs[0]}) runs alone as a library/fallback call")
        kind = Kind.LIBRARY if role(fusion.ops[alone[0]], bound) is Role.LIBRARY else \
            Kind.FALLBACK
        return Schedule(kind=kind, ops=ops, inputs=inputs, outputs=outputs)
    for i in facts.segment_sets:
        op = fusion.ops[i]
        if op.inputs[0] in produced:
            return Rejection(f"segment_set ({op.outputs[0]}) forces {op.inputs[0]} across a "
                             f"segment boundary")
    if not facts.reductions:
        return _pointwise(bound, ops, inputs, outputs, facts.axes)
    return _reduction(bound, ops, inputs, outputs, list(facts.reductions), profile, facts)


# ---- pointwise ---------------------------------------------------------------------------------


def embed(bound: Bound, tensor: str, ref: str, axes: AxisMap | None = None
          ) -> tuple[int | None, ...] | None:
    """Map each non-broadcast axis of ``tensor`` to a distinct axis of ``ref`` at least as long
    (equal extents preferred; a shorter axis is written where the index is in range): by axis
    identity where known, else right-aligned position, else any free axis. None if impossible."""
    shape, flags = bound.shapes[tensor], bound.broadcast[tensor]
    ref_shape = bound.shapes[ref]
    ref_ids = axes.ids(ref) if axes else []
    taken: set[int] = set()
    out: list[int | None] = []
    for a, (e, b) in enumerate(zip(shape, flags)):
        if b:
            out.append(None)
            continue
        candidates = []
        if axes is not None:
            rid = axes.root(tensor, a)
            candidates += [j for j, x in enumerate(ref_ids) if x is not None and x == rid]
        aligned = len(ref_shape) - len(shape) + a
        if 0 <= aligned < len(ref_shape):
            candidates.append(aligned)
        candidates += range(len(ref_shape))
        pick = next((j for j in candidates if j not in taken and ref_shape[j] == e), None)
        if pick is None:
            pick = next((j for j in candidates if j not in taken and ref_shape[j] > e), None)
        if pick is None:
            return None
        taken.add(pick)
        out.append(pick)
    return tuple(out)


def _pointwise(bound: Bound, ops, inputs, outputs, axes: AxisMap) -> Schedule | Rejection:
    ref = max(outputs, key=lambda t: (bound.numel(t), -outputs.index(t)))
    axis_map = {}
    for t in outputs:
        m = embed(bound, t, ref, axes)
        if m is None:
            return Rejection(f"outputs {ref} {list(bound.shapes[ref])} and {t} "
                             f"{list(bound.shapes[t])} do not share an iteration domain")
        axis_map[t] = m
    return Schedule(kind=Kind.POINTWISE, ops=ops, inputs=inputs, outputs=outputs,
                    domain=bound.shapes[ref], ref=ref, axis_map=axis_map)


# ---- reduction kinds ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _ReductionDomain:
    """Where a candidate reduction segment's reductions sit: the domain P (the axes of the first
    row reduction's input, ``p_ref``, that are not broadcast), each axis id's position in it,
    the reduced axes of the row reductions (the trailing ones where there are two sets) and of
    the column reductions, and which reductions are which."""

    p_ref: str
    domain: tuple[int, ...]
    pos: dict[int, int]  # axis id -> its position in the domain
    row_axes: tuple[int, ...]
    col_axes: tuple[int, ...]
    row_reductions: tuple[int, ...]
    col_reductions: tuple[int, ...]


def _reduction(bound: Bound, ops, inputs, outputs, reductions, profile,
               facts: SegmentFacts) -> Schedule | Rejection:
    """The reduction kinds' rule: the views the segment may hold (resizes or row gathers, tied
    into its axes), the domain its reductions share, every tensor mapped onto it, then which
    kind keeps what on chip (``_reduction_kind``)."""
    fusion = bound.fusion
    views = _reduction_views(bound, facts)
    if isinstance(views, Rejection):
        return views
    resizes, gathers, axes, partner = views
    dom = _reduction_domain(bound, axes, reductions)
    if isinstance(dom, Rejection):
        return dom
    base = facts.base if facts.base is not None and facts.base.kind in REDUCTION_KINDS and \
        facts.consumers is not None and facts.producer is not None and not resizes \
        and not gathers else None
    new_ops: set[int] = set()
    if base is None:
        tensors = list(dict.fromkeys(list(inputs) + [o for i in ops for o in fusion.ops[i].outputs
                                                     if o in fusion.tensors]))
        axis_map: dict[str, tuple[AxisEntry, ...]] = {}
    else:
        # The base's tensors whose axes are all the domain's map as they did (the domain and
        # its axis order are the base's: its reductions are among these); the rest, and the new
        # ops' tensors, are mapped again, in program order.
        new_ops = set(ops).difference(base.ops)
        redo = set(base.by_position)
        for i in new_ops:
            op = fusion.ops[i]
            redo.update(n for n in (*op.inputs, *op.outputs) if n in fusion.tensors)
        first_use = {t: k for k, t in enumerate(inputs)}
        tensors = sorted(redo, key=lambda t: (0, first_use[t], 0) if t in first_use else
                         (1, _order(bound, t), fusion.ops[_order(bound, t)].outputs.index(t)))
        axis_map = dict(base.axis_map)
    by_position = _map_onto_domain(bound, axes, partner, dom, tensors, axis_map, outputs)
    if isinstance(by_position, Rejection):
        return by_position
    extension = None
    if base is not None and base.analysis is not None and base.reduction_axes == dom.row_axes \
            and set(base.reductions) <= set(dom.row_reductions) \
            and set(base.outer_reductions) <= set(dom.col_reductions):
        extension = Extension(base.analysis, frozenset(new_ops), frozenset(tensors),
                              facts.consumers, facts.producer)
    return _reduction_kind(bound, ops, inputs, outputs, profile, dom, axis_map,
                           frozenset(by_position), resizes, gathers, extension)


def _reduction_views(bound: Bound, facts: SegmentFacts):
    """(resizes, row gathers, the segment's axis ties with theirs, the resizes' partners), or
    why the segment's views cannot join a reduction."""
    fusion = bound.fusion
    resizes = [i for i in facts.views if is_resize(fusion.ops[i])]
    gathers = [i for i in facts.views if may_gather_rows(bound, fusion.ops[i])]
    for i in facts.views:
        if i not in resizes and i not in gathers:
            op = fusion.ops[i]
            return Rejection(f"{op.name} ({op.outputs[0]}) re-indexes data and cannot join a "
                             f"reduction segment")
    if resizes and gathers:
        op = fusion.ops[gathers[0]]
        return Rejection(f"{op.name} ({op.outputs[0]}) cannot share a reduction segment with a "
                         f"resize")
    axes, partner = facts.axes, {}
    if resizes:  # see optimizer.kinds.resize
        axes, partner = tie_resizes(bound, axes, (fusion.ops[i] for i in resizes))
    if gathers:  # see optimizer.kinds.gather
        axes = tie_row_gathers(bound, axes, (fusion.ops[i] for i in gathers))
    return resizes, gathers, axes, partner


def _reduction_domain(bound: Bound, axes: AxisMap, reductions) -> _ReductionDomain | Rejection:
    """The domain the reductions share: one domain, one or two complementary sets of reduced
    axes, each reduction reading the domain in its order."""
    fusion = bound.fusion

    def signature(i: int):
        op = fusion.ops[i]
        src = op.inputs[0]
        red = set(reduction_axes(op.attrs, len(bound.shapes[src])))
        ids = axes.ids(src)
        domain = tuple(x for x in ids if x is not None)
        reduced = frozenset(x for a, x in enumerate(ids) if x is not None and a in red)
        return domain, reduced

    sigs: dict[tuple, list[int]] = {}
    for i in reductions:
        domain, reduced = signature(i)
        if len(set(domain)) != len(domain):
            op = fusion.ops[i]
            return Rejection(f"{op.name} ({op.outputs[0]}): two axes of {op.inputs[0]} iterate "
                             f"together")
        sigs.setdefault((frozenset(domain), reduced), []).append(i)
    keys = list(sigs)
    if len({k[0] for k in keys}) > 1:
        return Rejection("reductions over different domains: "
                         + ", ".join(fusion.ops[v[0]].outputs[0] for v in sigs.values()))
    inner_key = keys[0]
    outer_key = None
    if len(keys) == 2:
        a, b = keys
        if a[1] & b[1] or (a[1] | b[1]) != a[0]:
            return Rejection("reductions over different axes that are not complementary: "
                             + ", ".join(fusion.ops[v[0]].outputs[0] for v in sigs.values()))
        inner_key, outer_key = a, b
    elif len(keys) > 2:
        return Rejection("reductions over more than two sets of axes: "
                         + ", ".join(fusion.ops[v[0]].outputs[0] for v in sigs.values()))
    # The domain: axis order of the first row reduction's input.
    first = sigs[inner_key][0]
    p_ref = fusion.ops[first].inputs[0]
    p_ids = [x for x in axes.ids(p_ref) if x is not None]
    p_axes = [a for a, x in enumerate(axes.ids(p_ref)) if x is not None]
    domain = tuple(bound.shapes[p_ref][a] for a in p_axes)
    pos = {x: k for k, x in enumerate(p_ids)}
    if outer_key is not None:  # the row reductions are the ones over the trailing axes
        last = p_ids[-1]
        if last not in inner_key[1]:
            inner_key, outer_key = outer_key, inner_key
    for members in sigs.values():
        for i in members:
            src = fusion.ops[i].inputs[0]
            order = [x for x in axes.ids(src) if x is not None]
            if [pos.get(x) for x in order] != sorted(pos.get(x, -1) for x in order):
                return Rejection(f"{fusion.ops[i].outputs[0]} reduces a permuted view of the "
                                 f"domain")
    return _ReductionDomain(
        p_ref, domain, pos, tuple(sorted(pos[x] for x in inner_key[1])),
        tuple(sorted(pos[x] for x in outer_key[1])) if outer_key else (),
        tuple(sigs[inner_key]), tuple(sigs[outer_key]) if outer_key else ())


def _map_onto_domain(bound: Bound, axes: AxisMap, partner, dom: _ReductionDomain,
                     tensors: list[str], axis_map: dict[str, tuple[AxisEntry, ...]],
                     outputs) -> set[str] | Rejection:
    """Each of ``tensors`` mapped onto the domain (into ``axis_map``), through a resize's
    partner where the resize shifts it; the tensors with an axis placed by position (those a
    containing segment maps again). Or why one does not map."""
    fusion = bound.fusion
    pos, domain = dom.pos, dom.domain
    in_domain = set(pos)
    by_position = set()
    _complete_by_position(bound, axes, tensors, pos, domain)
    resized: dict[str, list[int]] = {}  # tensor -> domain axes it reads along at a shift
    for t in tensors:
        ids = axes.ids(t)
        mapped = tuple(_place(axes, x, pos) for x in ids)
        if partner and any(x is not None and m is None for x, m in zip(ids, mapped)):
            through = [place_through_partner(x, pos, partner) if x is not None and m is None
                       else None for x, m in zip(ids, mapped)]
            mapped = tuple(m if p is None else p for m, p in zip(mapped, through))
            if any(p is not None for p in through):
                resized[t] = [p for p in through if p is not None]
        if any(x is not None and m is None for x, m in zip(ids, mapped)):
            return Rejection(f"{t} {list(bound.shapes[t])} does not map onto the reduction "
                             f"domain {list(domain)}")
        real = [a for m in mapped for a in domain_axes(m)]
        if len(set(real)) != len(real):
            return Rejection(f"two axes of {t} iterate together")
        axis_map[t] = mapped
        if any(x is not None and x not in in_domain for x in ids):
            by_position.add(t)
    by_position.update(resized)
    if resized:
        why = _resize_misfit(fusion, resized, outputs, dom.row_axes,
                             dom.row_reductions + dom.col_reductions)
        if why:
            return Rejection(why)
    return by_position


def _reduction_kind(bound: Bound, ops, inputs, outputs, profile, dom: _ReductionDomain,
                    axis_map, by_position: frozenset[str], resizes, gathers,
                    extension: Extension | None) -> Schedule | Rejection:
    """Which kind computes the segment: a plain reduction where nothing on the domain reads a
    reduction's result (but an online max/sum-exp pair), else a normalization (or inner-outer,
    with column reductions) whose rows stay on chip within the profile's budget."""
    fusion = bound.fusion
    domain, row_axes = dom.domain, dom.row_axes
    row_reductions, col_reductions = dom.row_reductions, dom.col_reductions
    persistence = analyze_persistence(bound, ops, inputs, outputs, domain, axis_map, row_axes,
                                      row_reductions, col_reductions, extension)
    if isinstance(persistence, str):
        return Rejection(persistence)
    analysis = persistence
    stage = persistence.stage  # (the online re-analysis below drops the absorbed ops' stages)
    online = ()
    if persistence.broadcasts_back and not col_reductions:
        persistence, online = _online(bound, ops, inputs, outputs, domain, axis_map, row_axes,
                                      row_reductions, persistence)
        if online:
            analysis = None  # an extension would not know the absorbed ops: analyse afresh
    needs_rows = persistence.broadcasts_back or bool(col_reductions)
    if not needs_rows and any(persistence.stage[fusion.ops[i].inputs[0]] > 0
                              for i in row_reductions):
        return Rejection("a reduction reads another reduction's result")
    if resizes and not needs_rows:
        why = shifted_result_misfit(bound, resizes, persistence.stage, domain, axis_map,
                                    row_axes)
        if why:
            return Rejection(why)
    trailing = row_axes == tuple(range(len(domain) - len(row_axes), len(domain)))
    if not needs_rows:
        kind = Kind.REDUCTION
        persistence = None
    else:
        # A normalization row may skip axes (batch norm's [N, H, W] of [N, C, H, W]) as long
        # as it holds the innermost one: its threads then still read along memory.
        if not trailing and (col_reductions or len(domain) - 1 not in row_axes):
            return Rejection(f"reduced axes {list(row_axes)} of domain {list(domain)} are not the"
                             f" trailing axes: no persistent kernel keeps such rows")
        if persistence.row_bytes > profile.persistent_budget:
            return Rejection(f"a row keeps {persistence.row_bytes} bytes on chip, over the "
                             f"{profile.name} budget of {profile.persistent_budget}")
        kind = Kind.INNER_OUTER if col_reductions else Kind.NORMALIZATION
    if math.prod(domain) == 0 and kind is not Kind.REDUCTION:
        return Rejection("an empty domain needs no persistent kernel")
    if resizes and kind is not Kind.REDUCTION:
        op = fusion.ops[resizes[0]]
        return Rejection(f"{op.name} ({op.outputs[0]}) re-indexes data and cannot join a "
                         f"{kind.value} segment")
    if gathers:
        why = row_gather_misfit(bound, gathers, axis_map, row_axes, stage)
        if why is None and kind is not Kind.REDUCTION:
            why = f"{fusion.ops[gathers[0]].name} ({fusion.ops[gathers[0]].outputs[0]}) " \
                  f"gathers a row: only a plain reduction computes it in its epilogue"
        if why:
            return Rejection(why)
    if resizes or gathers:
        analysis = None  # the ties are this classification's: extend none of it
    return Schedule(kind=kind, ops=ops, inputs=inputs, outputs=outputs, domain=domain,
                    ref=dom.p_ref, axis_map=axis_map, reduction_axes=row_axes,
                    outer_axes=dom.col_axes, reductions=row_reductions,
                    outer_reductions=col_reductions, persistence=persistence,
                    by_position=by_position, analysis=analysis, online=online)


def _online(bound: Bound, ops, inputs, outputs, domain, axis_map, row_axes, row_reductions,
            persistence: Persistence) -> tuple[Persistence, tuple[tuple[int, int], ...]]:
    """The analysis of a segment whose max/sum-exp pairs run as online accumulators, and the
    pairs, where that leaves no value depending on a row reduction (a plain reduction: one pass,
    nothing kept on chip); else the analysis as it was and no pairs. Each pair's ``exp`` result
    is analysed as if read at stage 0: the accumulator consumes it in the first pass."""
    pairs = online_pairs(bound, ops, row_reductions, outputs)
    if not pairs:
        return persistence, ()
    absorbed = {i for p in pairs for i in p.absorbed}
    fed = tuple(bound.fusion.ops[p.sum_op].inputs[0] for p in pairs)
    rest = tuple(i for i in ops if i not in absorbed)
    online = analyze_persistence(bound, rest, tuple(inputs) + fed, outputs, domain, axis_map,
                                 row_axes, row_reductions, ())
    if isinstance(online, str) or online.broadcasts_back:
        return persistence, ()
    return online, tuple((p.max_op, p.sum_op) for p in pairs)


def _resize_misfit(fusion, resized: dict[str, list[int]], outputs, row_axes,
                   reductions) -> str | None:
    """Why tensors read at a resize's shift cannot be in this reduction segment, or None."""
    sources = {fusion.ops[i].inputs[0] for i in reductions}
    for t, along in resized.items():
        if any(a in row_axes for a in along):
            return f"{t} is resized along a reduced axis"
        if t in outputs or t in sources:
            return f"{t} is resized: it cannot be {'written' if t in outputs else 'reduced'} " \
                   f"in a reduction segment"
    return None


def _place(axes: AxisMap, axis_id, pos: dict) -> AxisEntry:
    """The domain axis of an axis id, or the domain axes a compound axis is made of (outer
    first); None if it has neither. The parts need not be adjacent in the domain, nor in its
    order: a kernel indexes the axis as their row-major join (``i1 * 128 + i4``), so a group
    sum writes a permute + reshape of its result (Thunder's dv, [B, S, H * D] of [B, H, S, D])
    itself instead of leaving a copy kernel."""
    if axis_id is None:
        return None
    if axis_id in pos:
        return pos[axis_id]
    parts = axes.parts(axis_id)
    if not parts or any(p not in pos for p in parts):
        return None
    return tuple(pos[p] for p in parts)


def _complete_by_position(bound: Bound, axes: AxisMap, tensors, pos: dict, domain) -> None:
    """Axes tied to the domain only through a broadcast (``T1 + broadcast(sum(T0))``): place them
    on the domain axis at the same right-aligned position when the extents agree, as nvFuser's
    permissive map does. Mapping an id places every axis tied to it."""
    for t in tensors:
        ids = axes.ids(t)
        rank = len(ids)
        used = {pos[x] for x in ids if x is not None and x in pos}
        for a, x in enumerate(ids):
            if x is None or x in pos or axes.parts(x):
                continue
            j = len(domain) - rank + a
            if 0 <= j < len(domain) and j not in used and bound.shapes[t][a] == domain[j]:
                pos[x] = j
                used.add(j)
