"""The group graph the greedy segmenter merges in: groups of placed ops, the tensors between them,
and a topological numbering kept valid under merges.

Each group has a ``Part`` (see ``parts``): trying a merge classifies the merged part, derived
from the two, and a merge that would close a cycle is refused first. The numbering bounds the
searches for such cycles: a group numbered after another cannot reach it, so a search stops at
the target's number. Merging renumbers only the groups numbered between the two, as in Pearce
and Kelly's dynamic topological order: those reaching the later one move before the merged
group, those reached from the earlier one after it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from fusecut.optimizer.segmenters.graph import SegGraph
from fusecut.optimizer.segmenters.parts import Part, keep, merged


class GroupGraph:
    def __init__(self, graph: SegGraph, placed: list[int]):
        self.graph = graph
        self.parts: dict[int, Part] = {i: Part.of(graph, i) for i in placed}
        self.succ: dict[int, set[int]] = {i: set() for i in placed}
        self.pred: dict[int, set[int]] = {i: set() for i in placed}
        fusion = graph.fusion
        for i in placed:
            for o in fusion.ops[i].outputs:
                for c in graph.consumers.get(o, ()):
                    if c in self.succ and c != i:
                        self.succ[i].add(c)
                        self.pred[c].add(i)
        self.rank = {i: i for i in placed}  # op order is a topological order
        self.first = {i: i for i in placed}  # each group's first op: ties go by it
        self.readers: dict[str, set[int]] = {}  # tensor -> groups reading it
        for i, part in self.parts.items():
            for t in part.reads:
                self.readers.setdefault(t, set()).add(i)
        self._version = dict.fromkeys(placed, 0)  # bumped on every merge into the group
        self._refused: set[tuple[int, int, int, int]] = set()  # pairs whose union is no kind

    def __contains__(self, g: int) -> bool:
        return g in self.parts

    def reads(self, g: int) -> set[str]:
        return self.parts[g].reads

    def topological(self) -> list[int]:
        """The groups in a topological order, ties broken by their first op."""
        indeg = {g: len(p) for g, p in self.pred.items()}
        heap = [(self.first[g], g) for g, d in indeg.items() if d == 0]
        heapq.heapify(heap)
        order = []
        while heap:
            _, g = heapq.heappop(heap)
            order.append(g)
            for h in self.succ[g]:
                indeg[h] -= 1
                if indeg[h] == 0:
                    heapq.heappush(heap, (self.first[h], h))
        if len(order) != len(self.parts):
            raise AssertionError("segment graph has a cycle")
        return order

    def groups(self) -> list[frozenset[int]]:
        return [frozenset(self.parts[g].ops) for g in self.topological()]

    # ---- merging ----------------------------------------------------------------------------

    def try_merge(self, g: int, h: int) -> bool:
        """Merge h into g if no cycle forms and the union classifies."""
        if self._closes_cycle(g, h):
            return False
        key = (g, self._version[g], h, self._version[h])
        if key in self._refused:
            return False
        part = merged(self.graph, self.parts[g], self.parts[h])
        if not part.classify(self.graph):
            self._refused.add(key)
            return False
        self._merge(g, h, keep(part))
        return True

    def _closes_cycle(self, g: int, h: int) -> bool:
        """A path between g and h through another group (it would become a cycle)."""
        x, y = (g, h) if self.rank[g] < self.rank[h] else (h, g)
        return self._reach(self.succ[x] - {y}, y) is None

    def _reach(self, sources: Iterable[int], target: int) -> set[int] | None:
        """The groups reachable from ``sources`` numbered before ``target``, or None if the
        target is reachable."""
        bound = self.rank[target]
        seen: set[int] = set()
        stack = [s for s in sources if self.rank[s] <= bound]
        while stack:
            g = stack.pop()
            if g == target:
                return None
            if g in seen:
                continue
            seen.add(g)
            stack.extend(s for s in self.succ[g] if self.rank[s] <= bound)
        return seen

    def _reached_by(self, target: int, floor: int) -> set[int]:
        """The groups numbered after ``floor`` from which ``target`` is reachable."""
        seen: set[int] = set()
        stack = [p for p in self.pred[target] if self.rank[p] > floor]
        while stack:
            g = stack.pop()
            if g in seen:
                continue
            seen.add(g)
            stack.extend(p for p in self.pred[g] if self.rank[p] > floor)
        return seen

    def _merge(self, g: int, h: int, part: Part) -> None:
        x, y = (g, h) if self.rank[g] < self.rank[h] else (h, g)
        after = self._reach(self.succ[x] - {y}, y)  # reached from x: after the merged group
        before = self._reached_by(y, self.rank[x]) - {x}  # reaching y: before it
        assert after is not None and not after & before, "merging would close a cycle"
        region = sorted(before, key=self.rank.__getitem__) + [g] + \
            sorted(after, key=self.rank.__getitem__)
        labels = sorted([self.rank[n] for n in before | after] + [self.rank[x], self.rank[y]])
        del self.rank[h]
        for n, label in zip(region, labels):
            self.rank[n] = label
        for t in self.parts[h].reads:
            readers = self.readers[t]
            readers.discard(h)
            readers.add(g)
        for p in self.pred.pop(h):
            self.succ[p].discard(h)
            if p != g:
                self.succ[p].add(g)
                self.pred[g].add(p)
        for c in self.succ.pop(h):
            self.pred[c].discard(h)
            if c != g:
                self.pred[c].add(g)
                self.succ[g].add(c)
        self.succ[g].discard(h)
        self.pred[g].discard(h)
        self.first[g] = min(self.first[g], self.first.pop(h))
        del self.parts[h], self._version[h]
        self.parts[g] = part
        self._version[g] += 1
