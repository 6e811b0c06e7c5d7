"""Lane maps: index components whose lanes all fall inside the vector their base starts.

An interleaved RoPE (llama2's ``view_as_complex``) reads, for lane l of a vector at x, the
elements ``((x + l) / 2) * 2`` and ``((x + l) / 2) * 2 + 1``: pairs of its own vector. With x
a multiple of the vector width, such an index is ``x + p(l)`` with ``p(l)`` in ``[0, vec)``, so
the kernel reads the whole vector once and each lane takes element ``p(l)`` of it (the lane
loop is unrolled: the map folds into register choices), instead of one scalar load per lane.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusecut.codegen.index import (
    LANE,
    LANE_VAR,
    ZERO,
    Add,
    Const,
    Div,
    IndexExpr,
    Mod,
    Mul,
    Paren,
    Sub,
    Var,
    substitute,
    variables,
    walk,
)


@dataclass(frozen=True)
class LaneMap:
    """Lane l reads element ``offsets[l]`` of the vector at ``start`` (a multiple of the width);
    ``values``: start's value at each trial point, the same for equal starts written
    differently (two reads of one vector share its load)."""

    start: IndexExpr
    offsets: tuple[int, ...]
    values: tuple


def lane_map(component: IndexExpr, innermost: str, vec: int) -> LaneMap | None:
    """``start`` and ``p`` such that ``component`` (an index of domain indices and the lane)
    equals ``start + p[lane]`` with ``p[lane]`` in ``[0, vec)`` and ``start`` (without the lane) a
    multiple of ``vec``, for every value of the indices the kernel gives them (the ``innermost``
    one a multiple of ``vec``); None when it is not so. Only ``+ - *`` by constants and division
    or remainder by constants that divide ``vec`` are followed, on which each index's residue
    modulo ``vec`` decides: every other index is tried at every residue."""
    names = sorted(variables(component) - {LANE})
    if not names or not _followed(component, vec):
        return None
    offsets = tuple(_value(component, dict.fromkeys(names, 0) | {LANE: lane})
                    for lane in range(vec))
    if any(p is None or not 0 <= p < vec for p in offsets):
        return None
    step = {n: vec if n == innermost else 1 for n in names}  # the innermost: whole vectors
    trials = [dict.fromkeys(names, 0) | {n: k * step[n]} for n in names for k in range(1, vec + 1)]
    trials.append({n: (3 + 2 * i) * step[n] for i, n in enumerate(names)})
    starts = []
    for values in trials:
        at = [_value(component, values | {LANE: lane}) for lane in range(vec)]
        if any(v is None for v in at):
            return None
        first = at[0] - offsets[0]
        if first % vec or any(v - first != p for v, p in zip(at, offsets)):
            return None
        starts.append(first)
    start = substitute(component, {LANE_VAR: ZERO})
    return LaneMap(start if offsets[0] == 0 else Paren(Sub(start, Const(offsets[0]))), offsets,
                   (tuple(names), *starts))


def _followed(e: IndexExpr, vec: int) -> bool:
    """Every node of ``e`` is an integer, a variable, a sum or difference, a product with a
    constant factor, or a division or remainder by a constant that divides ``vec``."""
    for node in walk(e):
        if isinstance(node, Mul):
            if not any(isinstance(k, Const) for k in node.kids):
                return False
        elif isinstance(node, (Div, Mod)):
            k = node.kids[1]
            if not (isinstance(k, Const) and k.value > 0 and vec % k.value == 0):
                return False
        elif not isinstance(node, (Const, Var, Paren, Add, Sub)):
            return False
    return True


def _value(e: IndexExpr, names: dict[str, int]) -> int | None:
    """``e``'s value with C's integer arithmetic (None where a division or remainder meets a
    negative operand, which C truncates and Python floors), evaluated after its operands."""
    values: dict[int, int] = {}
    pending: list[tuple[IndexExpr, bool]] = [(e, False)]
    while pending:
        node, ready = pending.pop()
        if isinstance(node, Const):
            values[id(node)] = node.value
        elif isinstance(node, Var):
            values[id(node)] = names[node.name]
        elif not ready:
            pending.append((node, True))
            pending.extend((k, False) for k in node.kids)
        else:
            kids = [values[id(k)] for k in node.kids]
            if isinstance(node, Paren):
                values[id(node)] = kids[0]
            elif isinstance(node, Add):
                values[id(node)] = sum(kids)
            elif isinstance(node, Sub):
                values[id(node)] = kids[0] - kids[1]
            elif isinstance(node, Mul):
                values[id(node)] = kids[0] * kids[1]
            elif kids[0] < 0:
                return None
            else:
                values[id(node)] = kids[0] // kids[1] if isinstance(node, Div) \
                    else kids[0] % kids[1]
    return values[id(e)]
