"""Lane maps: index components whose lanes all fall inside the vector their base starts.

An interleaved RoPE (llama2's ``view_as_complex``) reads, for lane l of a vector at x, the
elements ``((x + l) / 2) * 2`` and ``((x + l) / 2) * 2 + 1``: pairs of its own vector. With x
a multiple of the vector width, such an index is ``x + p(l)`` with ``p(l)`` in ``[0, vec)``, so
the kernel reads the whole vector once and each lane takes element ``p(l)`` of it (the lane
loop is unrolled: the map folds into register choices), instead of one scalar load per lane.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from codegen.emit import LANE


@dataclass(frozen=True)
class LaneMap:
    """Lane l reads element ``offsets[l]`` of the vector at ``start`` (C, a multiple of the
    width); ``values``: start's value at each trial point, the same for equal starts written
    differently (two reads of one vector share its load)."""

    start: str
    offsets: tuple[int, ...]
    values: tuple[int, ...]


def lane_map(component: str, innermost: str, vec: int) -> LaneMap | None:
    """``start`` and ``p`` such that ``component`` (a C index expression of domain indices and the
    lane) equals ``start + p[lane]`` with ``p[lane]`` in ``[0, vec)`` and ``start`` (C, without
    the lane) a multiple of ``vec``, for every value of the indices the kernel gives them (the
    ``innermost`` one a multiple of ``vec``); None when it is not so. Only ``+ - *`` by constants
    and division or remainder by constants that divide ``vec`` are followed, on which each
    index's residue modulo ``vec`` decides: every other index is tried at every residue."""
    try:
        tree = ast.parse(component, mode="eval").body
    except SyntaxError:
        return None
    names = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - {LANE})
    if not names or not _followed(tree, vec):
        return None
    offsets = tuple(_value(tree, dict.fromkeys(names, 0) | {LANE: lane}) for lane in range(vec))
    if any(p is None or not 0 <= p < vec for p in offsets):
        return None
    def step(n: str) -> int:
        return vec if n == innermost else 1

    trials = [dict.fromkeys(names, 0) | {n: k * step(n)} for n in names for k in range(1, vec + 1)]
    trials.append({n: (3 + 2 * i) * step(n) for i, n in enumerate(names)})
    starts = []
    for values in trials:
        at = [_value(tree, values | {LANE: lane}) for lane in range(vec)]
        if any(v is None for v in at):
            return None
        first = at[0] - offsets[0]
        if first % vec or any(v - first != p for v, p in zip(at, offsets)):
            return None
        starts.append(first)
    start = component.replace(LANE, "0")
    return LaneMap(start if offsets[0] == 0 else f"({start} - {offsets[0]})", offsets,
                   (tuple(names), *starts))


def _followed(node: ast.AST, vec: int) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int) and not isinstance(node.value, bool)
    if isinstance(node, ast.Name):
        return True
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, ast.USub) and _followed(node.operand, vec)
    if not isinstance(node, ast.BinOp):
        return False
    if isinstance(node.op, (ast.Add, ast.Sub)):
        return _followed(node.left, vec) and _followed(node.right, vec)
    if isinstance(node.op, ast.Mult):  # by a constant on one side
        return (isinstance(node.left, ast.Constant) or isinstance(node.right, ast.Constant)) \
            and _followed(node.left, vec) and _followed(node.right, vec)
    if isinstance(node.op, (ast.Div, ast.Mod)):  # C's, on indices that are never negative
        return (isinstance(node.right, ast.Constant) and isinstance(node.right.value, int)
                and node.right.value > 0 and vec % node.right.value == 0
                and _followed(node.left, vec))
    return False


def _value(node: ast.AST, names: dict[str, int]) -> int | None:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return names[node.id]
    if isinstance(node, ast.UnaryOp):
        inner = _value(node.operand, names)
        return None if inner is None else -inner
    left, right = _value(node.left, names), _value(node.right, names)
    if left is None or right is None:
        return None
    if isinstance(node.op, ast.Add):
        return left + right
    if isinstance(node.op, ast.Sub):
        return left - right
    if isinstance(node.op, ast.Mult):
        return left * right
    if left < 0:  # C truncates where Python floors: not an index this follows
        return None
    return left // right if isinstance(node.op, ast.Div) else left % right
