"""The nvFuser-style greedy segmenter: the baseline every plan is compared against.

Start from one group per op (forwarded ops aside, see ``graph``); if the whole fusion schedules as
one kernel, done. Otherwise sweep the groups in topological order and merge each with its
consumer groups while the merged group still classifies and no cycle forms, until a sweep merges
nothing. Like nvFuser it minimises the number of segments, not the bytes between them, and it
never recomputes anything beyond forwarding.
"""

from __future__ import annotations

from optimizer.segmenters.graph import SegGraph


def greedy_groups(graph: SegGraph, ops: frozenset[int] | None = None) -> list[frozenset[int]]:
    """Greedy segmentation of all placed ops (or of a subset, the rest being outside)."""
    placed = graph.placed if ops is None else [i for i in graph.placed if i in ops]
    if not placed:
        return []
    whole = frozenset(placed)
    if graph.classify(whole, graph.written(whole)):
        return [whole]
    members: dict[int, set[int]] = {i: {i} for i in placed}
    owner: dict[int, int] = {i: i for i in placed}
    fusion = graph.fusion

    def successors(g: int) -> set[int]:
        out = set()
        for i in members[g]:
            for o in fusion.ops[i].outputs:
                for c in graph.consumers.get(o, ()):
                    if c in owner and owner[c] != g:
                        out.add(owner[c])
        return out

    def reaches(start: set[int], target: int) -> bool:
        seen = set()
        stack = list(start)
        while stack:
            g = stack.pop()
            if g == target:
                return True
            if g in seen:
                continue
            seen.add(g)
            stack.extend(successors(g))
        return False

    def ok(group: set[int]) -> bool:
        return bool(graph.classify(group, graph.written(group)))

    def reads(g: int) -> set[str]:
        return {n for i in graph.closure(members[g]) for n in fusion.ops[i].inputs
                if n in fusion.tensors}

    def merge(g: int, h: int) -> None:
        members[g] |= members.pop(h)
        for i in members[g]:
            owner[i] = g

    def consumer_merges() -> bool:
        """Merge groups into their consumers while the result schedules."""
        changed = False
        for g in topological(members, successors):
            progress = g in members
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
                if g not in members or h not in members or not reads(g) & reads(h):
                    continue
                if reaches(successors(g), h) or reaches(successors(h), g):
                    continue
                if ok(members[g] | members[h]):
                    merge(g, h)
                    changed = True
        return changed

    while consumer_merges() | sibling_merges():
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
