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

from fusecut.codegen.emit import LANE


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
    step = {n: vec if n == innermost else 1 for n in names}  # the innermost: whole vectors
    trials = [dict.fromkeys(names, 0) | {n: k * step[n]} for n in names for k in range(1, vec + 1)]
    trials.append({n: (3 + 2 * i) * step[n] for i, n in enumerate(names)})
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


_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Mod, ast.USub, ast.Load)


def _followed(tree: ast.AST, vec: int) -> bool:
    """Every node of ``tree`` is an integer, a name, a negation, a sum or difference, a product
    with a constant factor, or a division or remainder by a constant that divides ``vec``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            if not isinstance(node.value, int) or isinstance(node.value, bool):
                return False
        elif isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Mult) and not (isinstance(node.left, ast.Constant)
                                                      or isinstance(node.right, ast.Constant)):
                return False
            if isinstance(node.op, (ast.Div, ast.Mod)) and not (
                    isinstance(node.right, ast.Constant) and isinstance(node.right.value, int)
                    and node.right.value > 0 and vec % node.right.value == 0):
                return False
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, ast.USub):
                return False
        elif not isinstance(node, (ast.Name, *_OPERATORS)):
            return False
    return True


def _value(tree: ast.AST, names: dict[str, int]) -> int | None:
    """``tree``'s value with C's integer arithmetic (None where a division or remainder meets
    a negative operand, which C truncates and Python floors), evaluated after its operands."""
    values: dict[int, int] = {}
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, ready = stack.pop()
        if isinstance(node, ast.Constant):
            values[id(node)] = node.value
        elif isinstance(node, ast.Name):
            values[id(node)] = names[node.id]
        elif not ready:
            stack.append((node, True))
            operands = [node.operand] if isinstance(node, ast.UnaryOp) else \
                [node.left, node.right]
            stack.extend((o, False) for o in operands)
        elif isinstance(node, ast.UnaryOp):
            values[id(node)] = -values[id(node.operand)]
        else:
            left, right = values[id(node.left)], values[id(node.right)]
            if isinstance(node.op, ast.Add):
                values[id(node)] = left + right
            elif isinstance(node.op, ast.Sub):
                values[id(node)] = left - right
            elif isinstance(node.op, ast.Mult):
                values[id(node)] = left * right
            elif left < 0:
                return None
            else:
                values[id(node)] = left // right if isinstance(node.op, ast.Div) \
                    else left % right
    return values[id(tree)]
