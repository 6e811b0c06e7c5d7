"""The nvFuser-style greedy segmenter: the baseline every plan is compared against.

Start from one group per op (forwarded ops aside, see ``graph``); if the whole fusion schedules as
one kernel, done. Otherwise sweep the groups in topological order and merge each with its
consumer groups while the merged group still classifies and no cycle forms, then merge groups
that read a common tensor (nvFuser's horizontal merge), until a sweep merges nothing. Like
nvFuser it minimises the number of segments, not the bytes between them, and it never recomputes
anything beyond forwarding. The groups live in a ``GroupGraph``: a merge is classified from the
two groups' parts, never by walking the merged group's ops again.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable

from fusecut.optimizer.segmenters.graph import SegGraph
from fusecut.optimizer.segmenters.groups import GroupGraph


def greedy_groups(graph: SegGraph, ops: frozenset[int] | None = None,
                  deadline: float | None = None) -> list[frozenset[int]]:
    """Greedy segmentation of all placed ops (or of a subset, the rest being outside), in a
    topological order. Past the ``deadline`` (a ``time.perf_counter()`` value) it stops merging:
    every group it has is still valid, there are just more of them."""
    placed = graph.placed if ops is None else [i for i in graph.placed if i in ops]
    if not placed:
        return []

    def late() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    if late():  # not even the first try
        return [frozenset([i]) for i in placed]
    whole = frozenset(placed)
    if graph.classify(whole, graph.written(whole)):
        return [whole]
    groups = GroupGraph(graph, placed)
    while (_consumer_merges(groups, late) | _sibling_merges(groups, late)) and not late():
        pass
    return groups.groups()


def _consumer_merges(groups: GroupGraph, late: Callable[[], bool]) -> bool:
    """Merge groups into their consumers while the result schedules."""
    changed = False
    for g in groups.topological():
        progress = g in groups and not late()
        while progress:
            progress = False
            for h in sorted(groups.succ[g], key=groups.first.__getitem__):
                if groups.try_merge(g, h):
                    progress = changed = True
                    break
    return changed


def _sibling_merges(groups: GroupGraph, late: Callable[[], bool]) -> bool:
    """Merge groups that read a common tensor (nvFuser's horizontal merge of reductions over the
    same input), in topological order, when neither reaches the other."""
    changed = False
    order = groups.topological()
    position = {g: k for k, g in enumerate(order)}
    for k, g in enumerate(order):
        if g not in groups:
            continue
        # the later groups that read what g reads, in order; a merge adds what the other read
        queue: list[tuple[int, int]] = []
        queued: set[int] = set()
        _enqueue(groups, groups.reads(g), position, k, queue, queued)
        while queue:
            if late():
                return changed
            at, h = heapq.heappop(queue)
            if h not in groups:
                continue
            reads = groups.reads(h)
            if groups.try_merge(g, h):
                changed = True
                _enqueue(groups, reads, position, at, queue, queued)
    return changed


def _enqueue(groups: GroupGraph, tensors: set[str], position: dict[int, int], after: int,
             queue: list[tuple[int, int]], queued: set[int]) -> None:
    for t in tensors:
        for h in groups.readers.get(t, ()):
            if position[h] > after and h not in queued:
                queued.add(h)
                heapq.heappush(queue, (position[h], h))
