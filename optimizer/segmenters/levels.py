"""A coarse segmentation in one linear pass: the fallback when the greedy segmenter runs out of
time with most of the fusion still one group per op.

An op's *level* is the number of anchor ops (reductions, library and fallback calls,
segment_set) on the longest path to it from the fusion inputs, counting an anchor on its
consumers' side. All fusible ops and reductions of one level form one group, each other anchor a
group of its own, in level order: no path leaves a level except through an anchor, which raises
it, so the order is topological and no cycle can form. A group that does not classify is split:
its fusible ops (then their connected parts, then single ops) apart from its reductions.
Every op is classified once or a few times, never once per merge as in the greedy segmenter,
and the plan has a group per level instead of one per op.
"""

from __future__ import annotations

from fusecut.optimizer.analysis.opclass import Role
from fusecut.optimizer.segmenters.graph import SegGraph
from fusecut.optimizer.segmenters.unionfind import DisjointSets


def level_groups(graph: SegGraph) -> list[frozenset[int]]:
    """Groups of placed ops, in a topological order, every one of which classifies (single ops
    are assumed to, as the greedy segmenter assumes)."""
    fusion = graph.fusion
    level: dict[int, int] = {}
    for i in graph.placed:  # op order is a topological order
        preds = (graph.producer.get(n) for n in fusion.ops[i].inputs)
        level[i] = max((level[p] + (graph.roles[p] is not Role.FUSIBLE)
                        for p in preds if p in level), default=0)
    fusible: dict[int, list[int]] = {}
    reductions: dict[int, list[int]] = {}
    alone: dict[int, list[int]] = {}
    for i in graph.placed:
        by_role = fusible if graph.roles[i] is Role.FUSIBLE else \
            reductions if graph.roles[i] is Role.REDUCTION else alone
        by_role.setdefault(level[i], []).append(i)
    groups: list[frozenset[int]] = []
    for lv in sorted(set(level.values())):
        ops, reds = fusible.get(lv, []), reductions.get(lv, [])
        if not _fits(graph, ops + reds):
            groups += _split(graph, ops)
            groups += [frozenset([i]) for i in reds]
        else:
            groups.append(frozenset(ops + reds))
        groups += [frozenset([i]) for i in alone.get(lv, [])]
    return [g for g in groups if g]


def _fits(graph: SegGraph, ops: list[int]) -> bool:
    return bool(ops) and bool(graph.classify(ops, graph.written(ops)))


def _split(graph: SegGraph, ops: list[int]) -> list[frozenset[int]]:
    """Fusible ops of one level as one group, or their connected parts, or single ops."""
    if not ops or _fits(graph, ops):
        return [frozenset(ops)]
    groups = []
    for part in _connected_parts(graph, ops):
        if len(part) > 1 and _fits(graph, part):
            groups.append(frozenset(part))
        else:
            groups += [frozenset([i]) for i in part]
    return groups


def _connected_parts(graph: SegGraph, ops: list[int]) -> list[list[int]]:
    """``ops`` split into the parts that tensors between them connect (union-find), each part in
    op order; parts ordered by their first op."""
    sets = DisjointSets(ops)
    for i in ops:
        for n in graph.fusion.ops[i].inputs:
            p = graph.producer.get(n)
            if p in sets:
                sets.union(p, i)
    return sets.groups()
