"""Disjoint sets of op indices (union-find with path halving), for grouping ops that belong
together: the parts of a fusion that tensors connect, an op and its only consumer."""

from __future__ import annotations

from collections.abc import Iterable


class DisjointSets:
    def __init__(self, items: Iterable[int]):
        self._parent = {i: i for i in items}

    def __contains__(self, item: int) -> bool:
        return item in self._parent

    def find(self, item: int) -> int:
        parent = self._parent
        while parent[item] != item:
            parent[item] = parent[parent[item]]
            item = parent[item]
        return item

    def union(self, a: int, b: int) -> None:
        self._parent[self.find(a)] = self.find(b)

    def groups(self) -> list[list[int]]:
        """The sets, each in item order, ordered by their first item."""
        sets: dict[int, list[int]] = {}
        for item in sorted(self._parent):
            sets.setdefault(self.find(item), []).append(item)
        return sorted(sets.values(), key=lambda s: s[0])
