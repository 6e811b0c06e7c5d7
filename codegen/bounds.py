"""Index ranges: where a kernel's read along an axis can leave its tensor.

A segment's domain is the largest of its outputs; a shorter output (k's heads beside q's, a
slice written out, an independent output of another shape) is stored under a guard, but the
loads that feed it run for every thread of the domain. Each index of such a load is an index
expression (``codegen.index``) of the domain indices (``x0``, ``x1``, ...) and the lane; its range
over the domain
follows by arithmetic on strided intervals (``lo..hi`` in steps of ``step``; ``+ - *``, and
``/ %`` by positive constants, as C's integer operators on the non-negative values they take
here). The step keeps what a plain interval loses: the innermost index starts a vector, a
multiple of its width, so ``(x1 % 128) + lane`` stays below 128. Where the range leaves
``[0, extent)``, the read needs the condition ``in_bounds`` gives.

An expression this does not follow (a clamp into a resize piece, which is in bounds by
construction; an index read from another tensor, whose range is the data's) gives no condition.
"""

from __future__ import annotations

import math

from fusecut.codegen.index import (
    ZERO,
    Add,
    AtLeast,
    Const,
    Div,
    IndexExpr,
    Less,
    Mod,
    Mul,
    Paren,
    Sub,
    Var,
)

Range = tuple[int, int]
Strided = tuple[int, int, int]  # lo, hi, step (0: the one value lo)


def index_range(expr: IndexExpr, ranges: dict[str, Strided]) -> Range | None:
    """The least and greatest values of ``expr`` over ``ranges`` (each variable's inclusive
    bounds and step), or None where it is not a sum, difference or product of variables and
    integers with division and remainder by positive integers (evaluated operands first, without
    recursion)."""
    done: dict[int, Strided] = {}
    pending: list[tuple[IndexExpr, bool]] = [(expr, False)]
    while pending:
        node, ready = pending.pop()
        if isinstance(node, Const):
            done[id(node)] = (node.value, node.value, 0)
        elif isinstance(node, Var):
            if node.name not in ranges:
                return None
            done[id(node)] = ranges[node.name]
        elif not isinstance(node, (Paren, Add, Sub, Mul, Div, Mod)):
            return None
        elif not ready:
            pending.append((node, True))
            pending.extend((k, False) for k in node.kids)
        elif isinstance(node, Paren):
            done[id(node)] = done[id(node.kids[0])]
        else:
            value = done[id(node.kids[0])]
            for k in node.kids[1:]:  # a sum of several terms adds them left to right
                value = _combine(type(node), value, done[id(k)])
                if value is None:
                    return None
            done[id(node)] = value
    lo, hi, _ = done[id(expr)]
    return lo, hi


def _combine(op: type, a: Strided, b: Strided) -> Strided | None:
    if op is Add:
        return a[0] + b[0], a[1] + b[1], math.gcd(a[2], b[2])
    if op is Sub:
        return a[0] - b[1], a[1] - b[0], math.gcd(a[2], b[2])
    if op is Mul:
        products = [x * y for x in a[:2] for y in b[:2]]
        if b[2] == 0 or a[2] == 0:  # by a constant: the step scales
            k, other = (b[0], a) if b[2] == 0 else (a[0], b)
            return min(products), max(products), abs(k) * other[2]
        return min(products), max(products), 1
    if not (b[2] == 0 and b[0] > 0 and a[0] >= 0):  # Div, Mod
        return None
    k, (lo, hi, step) = b[0], a
    if op is Div:
        return lo // k, hi // k, step // k if step % k == 0 else 1
    if lo // k == hi // k:  # within one period
        return lo % k, hi % k, step
    if step and step % k == 0:  # every value has lo's residue
        return lo % k, lo % k, 0
    if step and k % step == 0:  # residues lo % step, in steps of step
        return lo % step, k - step + lo % step, step
    return 0, k - 1, 1


def in_bounds(expr: IndexExpr, extent: int, ranges: dict[str, Strided]) -> list[IndexExpr]:
    """The conditions under which ``expr`` indexes inside ``[0, extent)``: none where its
    range over ``ranges`` stays inside (or cannot be told)."""
    span = index_range(expr, ranges)
    if span is None:
        return []
    conds: list[IndexExpr] = []
    if span[0] < 0:
        conds.append(AtLeast(expr, ZERO))
    if span[1] >= extent:
        conds.append(Less(expr, Const(extent)))
    return conds
