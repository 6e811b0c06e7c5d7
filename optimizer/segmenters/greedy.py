"""The nvFuser-style greedy segmenter: the baseline every plan is compared against.

Start from one group per op (forwarded ops aside, see ``graph``); if the whole fusion schedules as
one kernel, done. Otherwise sweep the groups in topological order and merge each with its
consumer groups while the merged group still classifies and no cycle forms, until a sweep merges
nothing. Like nvFuser it minimises the number of segments, not the bytes between them, and it
never recomputes anything beyond forwarding.
"""

from __future__ import annotations

import time

from optimizer.segmenters.graph import SegGraph


def greedy_groups(graph: SegGraph, ops: frozenset[int] | None = None,
                  deadline: float | None = None) -> list[frozenset[int]]:
    """Greedy segmentation of all placed ops (or of a subset, the rest being outside). Past the
    ``deadline`` (a ``time.perf_counter()`` value) it stops merging: every group it has is still
    valid, there are just more of them."""
    placed = graph.placed if ops is None else [i for i in graph.placed if i in ops]
    if not placed:
        return []
    if deadline is not None and time.perf_counter() > deadline:  # not even the first try
        return [frozenset([i]) for i in placed]
    whole = frozenset(placed)
    if graph.classify(whole, graph.written(whole)):
        return [whole]
    members: dict[int, set[int]] = {i: {i} for i in placed}
    fusion = graph.fusion
    # The group graph, kept up to date on every merge so that a successor query costs nothing.
    succ: dict[int, set[int]] = {i: set() for i in placed}
    pred: dict[int, set[int]] = {i: set() for i in placed}
    for i in placed:
        for o in fusion.ops[i].outputs:
            for c in graph.consumers.get(o, ()):
                if c in succ and c != i:
                    succ[i].add(c)
                    pred[c].add(i)

    def successors(g: int) -> set[int]:
        return succ[g]

    def late() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    # Ops are numbered in a topological order, so a group whose first op comes after the
    # target's last op cannot reach the target: the search need not go past it.
    first = {i: i for i in placed}
    last = {i: i for i in placed}

    def reaches(start: set[int], target: int) -> bool:
        seen = set()
        stack = list(start)
        bound = last[target]
        while stack:
            g = stack.pop()
            if g == target:
                return True
            if g in seen or first[g] > bound:
                continue
            seen.add(g)
            stack.extend(succ[g])
        return False

    def ok(group: set[int]) -> bool:
        return bool(graph.classify(group, graph.written(group)))

    read_cache: dict[int, set[str]] = {}

    def reads(g: int) -> set[str]:
        if g not in read_cache:
            read_cache[g] = {n for i in graph.closure(members[g]) for n in fusion.ops[i].inputs
                             if n in fusion.tensors}
        return read_cache[g]

    def merge(g: int, h: int) -> None:
        members[g] |= members.pop(h)
        first[g], last[g] = min(first[g], first.pop(h)), max(last[g], last.pop(h))
        if g in read_cache or h in read_cache:  # the closure of a union is the union of closures
            read_cache[g] = reads(g) | reads(h)
            read_cache.pop(h)
        for p in pred.pop(h):
            succ[p].discard(h)
            if p != g:
                succ[p].add(g)
                pred[g].add(p)
        for c in succ.pop(h):
            pred[c].discard(h)
            if c != g:
                pred[c].add(g)
                succ[g].add(c)
        succ[g].discard(h)
        pred[g].discard(g)
        succ[g].discard(g)

    def consumer_merges() -> bool:
        """Merge groups into their consumers while the result schedules."""
        changed = False
        for g in topological(members, successors):
            progress = g in members and not late()
            while progress:
                progress = False
                for h in sorted(successors(g), key=lambda x: min(members[x])):
                    if reaches(successors(g) - {h}, h):
                        continue  # merging would close a cycle through another group
                    if ok(members[g] | members[h]):
                        merge(g, h)
                        progress = changed = True
                        break
        return changed

    def sibling_merges() -> bool:
        """Merge groups that read a common tensor (nvFuser's horizontal merge of reductions
        over the same input), when neither reaches the other."""
        changed = False
        order = topological(members, successors)
        for a_pos, g in enumerate(order):
            for h in order[a_pos + 1:]:
                if late():
                    return changed
                if g not in members or h not in members or not reads(g) & reads(h):
                    continue
                if reaches(successors(g), h) or reaches(successors(h), g):
                    continue
                if ok(members[g] | members[h]):
                    merge(g, h)
                    changed = True
        return changed

    while (consumer_merges() | sibling_merges()) and not late():
        pass
    order = topological(members, successors)
    return [frozenset(members[g]) for g in order]


def topological(members: dict[int, set[int]], successors) -> list[int]:
    """Groups in a topological order (ties broken by their first op, for determinism)."""
    import heapq

    indeg = dict.fromkeys(members, 0)
    succ = {g: successors(g) for g in members}
    for g in members:
        for h in succ[g]:
            indeg[h] += 1
    heap = [(min(members[g]), g) for g in members if indeg[g] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        _, g = heapq.heappop(heap)
        order.append(g)
        for h in succ[g]:
            indeg[h] -= 1
            if indeg[h] == 0:
                heapq.heappush(heap, (min(members[h]), h))
    if len(order) != len(members):
        raise AssertionError("segment graph has a cycle")
    return order
