"""Groups of placed ops that carry what ``classify`` needs, so that merging two groups derives the
merged group's facts from the two parts instead of walking its ops again.

A ``Part`` knows its ops (placed, and with the forwarded ops they need), the tensors it computes
and reads, where it first reads each input, what it must write, its ops by role, its stream
stages and its axis ties. ``merged`` combines two parts without walking their ops: unions of
their sets, the tensors either writes checked against the merged group's ops, and the smaller
part's axis ties added to the larger's. The merged group is then classified from those facts,
the reduction kinds extending the larger part's analysis (see ``kinds.rules``).
"""

from __future__ import annotations

from dataclasses import dataclass
from heapq import merge as merge_sorted

from fusecut.optimizer.analysis.axes import AxisMap
from fusecut.optimizer.analysis.opclass import Role, reindexes
from fusecut.optimizer.kinds.rules import Rejection, Schedule, SegmentFacts, classify
from fusecut.optimizer.segmenters.graph import SegGraph


@dataclass
class Part:
    """A group of placed ops and its facts (see the module's docstring)."""

    ops: set[int]  # placed ops
    closure: set[int]  # and the forwarded ops they need
    produced: set[str]  # tensors the closure computes
    reads: set[str]  # tensors the closure reads (its own included)
    first_use: dict[str, tuple[int, int]]  # input -> (op, operand position) of its first read
    written: frozenset[str]  # fusion outputs it computes, and what ops outside it read
    alone: tuple[int, ...]  # library and fallback ops, in op order
    segment_sets: tuple[int, ...]
    reductions: tuple[int, ...]
    views: tuple[int, ...]
    stages: frozenset[int]  # stream stages of its ops (see ``analysis.streams``)
    axes: AxisMap
    schedule: Schedule | None = None  # its classification, once it has one
    base: Schedule | None = None  # a merged part's: the larger part's, which classify extends

    @staticmethod
    def of(graph: SegGraph, op: int) -> Part:
        fusion = graph.fusion
        closure = set(graph.closure([op]))
        produced = graph.produced(closure)
        first_use: dict[str, tuple[int, int]] = {}
        for i in sorted(closure):
            for pos, n in enumerate(fusion.ops[i].inputs):
                if n in fusion.tensors and n not in produced:
                    first_use.setdefault(n, (i, pos))
        reads = {n for i in closure for n in fusion.ops[i].inputs if n in fusion.tensors}
        role = graph.roles[op]
        return Part({op}, closure, produced, reads, first_use, graph.written([op]),
                    (op,) if role in (Role.LIBRARY, Role.FALLBACK) else (),
                    (op,) if role is Role.SEGMENT_SET else (),
                    (op,) if role is Role.REDUCTION else (),
                    (op,) if reindexes(fusion.ops[op], graph.bound) else (),
                    frozenset(graph.stage_of[i] for i in closure) if graph.stage_of else
                    frozenset(), AxisMap(graph.bound, (fusion.ops[i] for i in sorted(closure))))

    def facts(self, graph: SegGraph) -> SegmentFacts:
        inputs = sorted(self.first_use, key=self.first_use.__getitem__)
        return SegmentFacts(tuple(sorted(self.closure)), tuple(inputs), frozenset(self.produced),
                            self.alone, self.segment_sets, self.reductions, self.views,
                            self.axes, self.base, graph.consumers, graph.producer)

    def classify(self, graph: SegGraph) -> Schedule | Rejection:
        """What ``graph.classify`` says of this group, from the part's facts."""
        if len(self.stages) > 1:
            return Rejection(f"mixes ops of stream stages {sorted(self.stages)}: each stream "
                             "loop runs whole segments")
        result = classify(graph.bound, self.closure, self.written, graph.profile, graph.kinds,
                          self.facts(graph))
        if result:
            self.schedule = result
        return result


def merged(graph: SegGraph, a: Part, b: Part) -> Part:
    """The part of a's and b's ops together. The larger part's axis ties are forked, not copied:
    ``keep`` the result to make the merge final (until then a and b are unchanged)."""
    ops = a.ops | b.ops
    produced = a.produced | b.produced
    first_use = {}
    for t in a.first_use.keys() | b.first_use.keys():
        if t not in produced:
            uses = [u for u in (a.first_use.get(t), b.first_use.get(t)) if u is not None]
            first_use[t] = min(uses)
    written = frozenset(
        t for t in a.written | b.written
        if t in graph.outputs or any(c not in ops and c not in graph.forwarded
                                     for c in graph.consumers.get(t, ())))
    big, small = (a, b) if a.axes.size() >= b.axes.size() else (b, a)
    axes = big.axes.fork()
    axes.absorb(small.axes)
    # classify extends the larger part's analysis (the smaller one's ops are analysed anew)
    larger, smaller = (a, b) if len(a.closure) >= len(b.closure) else (b, a)
    base = larger.schedule if larger.schedule is not None else smaller.schedule
    return Part(ops, a.closure | b.closure, produced, a.reads | b.reads, first_use, written,
                _merge(a.alone, b.alone), _merge(a.segment_sets, b.segment_sets),
                _merge(a.reductions, b.reductions), _merge(a.views, b.views),
                a.stages | b.stages, axes, base=base)


def keep(part: Part) -> Part:
    """Make a ``merged`` part final: its axis ties are written into the larger part's table."""
    part.axes = part.axes.commit()
    return part


def _merge(x: tuple[int, ...], y: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(merge_sorted(x, y)) if x and y else x or y
