"""Index ranges: where a kernel's read along an axis can leave its tensor.

A segment's domain is the largest of its outputs; a shorter output (k's heads beside q's, a
slice written out, an independent output of another shape) is stored under a guard, but the
loads that feed it run for every thread of the domain. Each index of such a load is a C
expression of the domain indices (``x0``, ``x1``, ...) and the lane; its range over the domain
follows by arithmetic on strided intervals (``lo..hi`` in steps of ``step``; ``+ - *``, and
``/ %`` by positive constants, as C's integer operators on the non-negative values they take
here). The step keeps what a plain interval loses: the innermost index starts a vector, a
multiple of its width, so ``(x1 % 128) + lane`` stays below 128. Where the range leaves
``[0, extent)``, the read needs the condition ``in_bounds`` gives.

An expression this does not follow (a clamp into a resize piece, which is in bounds by
construction; an index read from another tensor, whose range is the data's) gives no condition.
"""

from __future__ import annotations

import ast
import math

Range = tuple[int, int]
Strided = tuple[int, int, int]  # lo, hi, step (0: the one value lo)


def index_range(expr: str, ranges: dict[str, Strided]) -> Range | None:
    """The least and greatest values of ``expr`` over ``ranges`` (each name's inclusive bounds
    and step), or None where it is not a sum, difference or product of names and integers with
    division and remainder by positive integers (evaluated bottom-up, without recursion)."""
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return None
    done: dict[int, Strided] = {}
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, ready = stack.pop()
        if isinstance(node, ast.Constant):
            if not isinstance(node.value, int) or isinstance(node.value, bool):
                return None
            done[id(node)] = (node.value, node.value, 0)
        elif isinstance(node, ast.Name):
            if node.id not in ranges:
                return None
            done[id(node)] = ranges[node.id]
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            if not ready:
                stack += [(node, True), (node.operand, False)]
                continue
            lo, hi, step = done[id(node.operand)]
            done[id(node)] = (-hi, -lo, step)
        elif isinstance(node, ast.BinOp):
            if not ready:
                stack += [(node, True), (node.left, False), (node.right, False)]
                continue
            value = _combine(node.op, done[id(node.left)], done[id(node.right)])
            if value is None:
                return None
            done[id(node)] = value
        else:
            return None
    lo, hi, _ = done[id(tree)]
    return lo, hi


def _combine(op: ast.operator, a: Strided, b: Strided) -> Strided | None:
    if isinstance(op, ast.Add):
        return a[0] + b[0], a[1] + b[1], math.gcd(a[2], b[2])
    if isinstance(op, ast.Sub):
        return a[0] - b[1], a[1] - b[0], math.gcd(a[2], b[2])
    if isinstance(op, ast.Mult):
        products = [x * y for x in a[:2] for y in b[:2]]
        if b[2] == 0 or a[2] == 0:  # by a constant: the step scales
            k, other = (b[0], a) if b[2] == 0 else (a[0], b)
            return min(products), max(products), abs(k) * other[2]
        return min(products), max(products), 1
    if not (isinstance(op, (ast.Div, ast.Mod)) and b[2] == 0 and b[0] > 0 and a[0] >= 0):
        return None
    k, (lo, hi, step) = b[0], a
    if isinstance(op, ast.Div):
        return lo // k, hi // k, step // k if step % k == 0 else 1
    if lo // k == hi // k:  # within one period
        return lo % k, hi % k, step
    if step and step % k == 0:  # every value has lo's residue
        return lo % k, lo % k, 0
    if step and k % step == 0:  # residues lo % step, in steps of step
        return lo % step, k - step + lo % step, step
    return 0, k - 1, 1


def in_bounds(expr: str, extent: int, ranges: dict[str, Strided]) -> list[str]:
    """The conditions under which ``expr`` indexes inside ``[0, extent)``: none where its
    range over ``ranges`` stays inside (or cannot be told)."""
    span = index_range(expr, ranges)
    if span is None:
        return []
    conds = []
    if span[0] < 0:
        conds.append(f"{expr} >= 0")
    if span[1] >= extent:
        conds.append(f"{expr} < {extent}")
    return conds
