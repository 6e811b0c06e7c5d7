"""Index expressions: the typed form of every index a generated kernel computes.

An index is a small tree of integer C expressions over the kernel's index variables (``x0``,
``c_2``, the vector lane ``_lane``): constants, sums, differences, products, divisions and
remainders by constants, clamps into a range, casts, comparisons, selects, and values the kernel
read from memory (a gather's index). The generators decide on the tree (which variables an
access uses, whether a component is a vector's lane-contiguous ``B + _lane``, how far an address
moves along an axis) and render it when the kernel's text is assembled: ``render`` spells each
node by the table ``SPELLING``, bottom-up in one loop (no recursion: an index may be as deep as
the chain of reshapes and slices it went through).

The tree keeps the generated parentheses as nodes (``Paren``): the emitted source is pinned byte
for byte (tests/data/emitted_sources.json), and where the generators put parentheses is part of
it. Operators are spelt bare (``a + b``, ``a * k``); C parses the spelling back into the tree, as
the generators build sums and products only where that holds.

Nodes are immutable and hashed once when made: an index is a dictionary key (the emitter's memo)
however deep it is, and equality walks both trees without recursion. An index never equals text:
comparing one with a string raises, so a decision cannot quietly fall back to the spelling.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

LANE = "_lane"  # a vectorised kernel's lane within a vector


class IndexExpr:
    """A node: its operands (``kids``) and what else makes it (``arg``: a name, a constant, a C
    type). Made by the subclasses' constructors."""

    __slots__ = ("kids", "arg", "_hash", "_text", "_reads")

    kids: tuple[IndexExpr, ...]
    arg: object

    def _init(self, kids: tuple[IndexExpr, ...], arg: object = None) -> None:
        for k in kids:
            if not isinstance(k, IndexExpr):
                raise TypeError(f"an index is made of indices, not {k!r}")
        set_ = object.__setattr__
        set_(self, "kids", kids)
        set_(self, "arg", arg)
        set_(self, "_hash", hash((type(self), arg, kids)))  # kids' hashes are stored: no descent
        set_(self, "_text", None)
        set_(self, "_reads", None)

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        if self is other:
            return True
        if isinstance(other, str):
            raise TypeError(f"compared an index with text {other!r}: decide on the index")
        if not isinstance(other, IndexExpr):
            return NotImplemented
        pending = [(self, other)]
        while pending:
            a, b = pending.pop()
            if a is b:
                continue
            if (type(a) is not type(b) or a._hash != b._hash or a.arg != b.arg
                    or len(a.kids) != len(b.kids)):
                return False
            pending.extend(zip(a.kids, b.kids))
        return True

    def __str__(self) -> str:
        return render(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}<{render(self)}>"


class Var(IndexExpr):
    """An index variable the kernel declares: ``x0``, ``c_2``, ``_lane``."""

    __slots__ = ()

    def __init__(self, name: str):
        self._init((), name)

    @property
    def name(self) -> str:
        return self.arg


class Const(IndexExpr):
    __slots__ = ()

    def __init__(self, value: int):
        self._init((), int(value))

    @property
    def value(self) -> int:
        return self.arg


class Bool(IndexExpr):
    """``true``: a condition that always holds."""

    __slots__ = ()

    def __init__(self, value: bool):
        self._init((), bool(value))


class Data(IndexExpr):
    """A value the kernel computed or loaded, used as an index (a gather's index tensor): its C
    text and the declared names it reads."""

    __slots__ = ()

    def __init__(self, text: str, reads: frozenset[str] = frozenset()):
        self._init((), (text, frozenset(reads)))

    @property
    def reads(self) -> frozenset[str]:
        return self.arg[1]


class Paren(IndexExpr):
    __slots__ = ()

    def __init__(self, x: IndexExpr):
        self._init((x,))


class Add(IndexExpr):
    """``a + b + ...``, bare."""

    __slots__ = ()

    def __init__(self, *terms: IndexExpr):
        if len(terms) < 2:
            raise ValueError("a sum has two terms or more")
        self._init(tuple(terms))


class _Binary(IndexExpr):
    __slots__ = ()

    def __init__(self, a: IndexExpr, b: IndexExpr):
        self._init((a, b))


class Sub(_Binary):
    __slots__ = ()


class Mul(_Binary):
    __slots__ = ()


class Div(_Binary):
    """C's integer division (truncating; the generators divide non-negative values)."""

    __slots__ = ()


class Mod(_Binary):
    __slots__ = ()


class Less(_Binary):
    __slots__ = ()


class AtLeast(_Binary):
    __slots__ = ()


class Equal(_Binary):
    __slots__ = ()


class All(IndexExpr):
    """``a && b && ...``, bare (one condition: itself)."""

    __slots__ = ()

    def __init__(self, *conds: IndexExpr):
        if not conds:
            raise ValueError("no condition to join")
        self._init(tuple(conds))


class Select(IndexExpr):
    """``cond ? a : b``, bare."""

    __slots__ = ()

    def __init__(self, cond: IndexExpr, a: IndexExpr, b: IndexExpr):
        self._init((cond, a, b))


class Clamp(IndexExpr):
    """``fc_clampi<itype>(x, hi)``: x clamped into ``[0, hi]``."""

    __slots__ = ()

    def __init__(self, x: IndexExpr, hi: int, itype: str):
        self._init((x, Const(hi)), itype)


class Cast(IndexExpr):
    """``(ctype)(x)``."""

    __slots__ = ()

    def __init__(self, x: IndexExpr, ctype: str):
        self._init((x,), ctype)


Index = tuple[IndexExpr, ...]
ZERO = Const(0)
LANE_VAR = Var(LANE)

# node type -> its C spelling from (arg, the operands' spellings)
SPELLING: dict[type, Callable[[object, list[str]], str]] = {
    Var: lambda name, _: name,
    Const: lambda value, _: str(value),
    Bool: lambda value, _: "true" if value else "false",
    Data: lambda value, _: value[0],
    Paren: lambda _, k: f"({k[0]})",
    Add: lambda _, k: " + ".join(k),
    Sub: lambda _, k: f"{k[0]} - {k[1]}",
    Mul: lambda _, k: f"{k[0]} * {k[1]}",
    Div: lambda _, k: f"{k[0]} / {k[1]}",
    Mod: lambda _, k: f"{k[0]} % {k[1]}",
    Less: lambda _, k: f"{k[0]} < {k[1]}",
    AtLeast: lambda _, k: f"{k[0]} >= {k[1]}",
    Equal: lambda _, k: f"{k[0]} == {k[1]}",
    All: lambda _, k: " && ".join(k),
    Select: lambda _, k: f"{k[0]} ? {k[1]} : {k[2]}",
    Clamp: lambda itype, k: f"fc_clampi<{itype}>({k[0]}, {k[1]})",
    Cast: lambda ctype, k: f"({ctype})({k[0]})",
}


def render(e: IndexExpr) -> str:
    """The C spelling of ``e``, operands first (each node's spelling is kept)."""
    if e._text is not None:
        return e._text
    pending: list[tuple[IndexExpr, bool]] = [(e, False)]
    while pending:
        node, ready = pending.pop()
        if node._text is not None:
            continue
        if not ready:
            pending.append((node, True))
            pending.extend((k, False) for k in node.kids if k._text is None)
            continue
        text = SPELLING[type(node)](node.arg, [k._text for k in node.kids])
        object.__setattr__(node, "_text", text)
    return e._text


# ---- queries ------------------------------------------------------------------------------------

def walk(e: IndexExpr) -> Iterator[IndexExpr]:
    """Every node of ``e`` (a node reached twice is given twice), parents before operands."""
    pending = [e]
    while pending:
        node = pending.pop()
        yield node
        pending.extend(reversed(node.kids))


def variables(e: IndexExpr) -> frozenset[str]:
    """The index variables ``e`` uses."""
    return frozenset(n.arg for n in walk(e) if isinstance(n, Var))


def reads(e: IndexExpr) -> frozenset[str]:
    """Every name the spelling of ``e`` reads: its variables, what its data reads, and the
    helper and index type a clamp or cast spells (``fc_clampi``, ``int64``: the kernel's
    preamble must define them)."""
    if e._reads is not None:
        return e._reads
    out: set[str] = set()
    for n in walk(e):
        if isinstance(n, Var):
            out.add(n.arg)
        elif isinstance(n, Data):
            out |= n.reads
        elif isinstance(n, Clamp):
            out |= {"fc_clampi", n.arg}
        elif isinstance(n, Cast):
            out.add(n.arg)
    object.__setattr__(e, "_reads", frozenset(out))
    return e._reads


def uses(e: IndexExpr, *names: str) -> bool:
    """Whether ``e`` reads any of ``names`` (a variable, or a value its data reads)."""
    return not reads(e).isdisjoint(names)


def contains(e: IndexExpr, part: IndexExpr) -> bool:
    """Whether ``part`` is a subexpression of ``e``."""
    return any(n == part for n in walk(e))


def plus_lane(base: IndexExpr) -> Paren:
    """``(base + _lane)``: lane l of a vector whose first lane is at ``base``."""
    return Paren(Add(base, LANE_VAR))


def lane_base(e: IndexExpr) -> IndexExpr | None:
    """``B`` of a vector's index ``(B + _lane)`` (B, the first lane's index, is a multiple of the
    vector width; a sum ``(i1 * 64 + c_2 + _lane)`` gives the bare sum ``i1 * 64 + c_2``), or None
    where ``e`` is not of that form."""
    if not (isinstance(e, Paren) and isinstance(e.kids[0], Add)):
        return None
    terms = e.kids[0].kids
    if terms[-1] != LANE_VAR:
        return None
    return terms[0] if len(terms) == 2 else Add(*terms[:-1])


def is_atom(e: IndexExpr) -> bool:
    """A variable or a constant: spelt as one word, it needs no parentheses."""
    return isinstance(e, (Var, Const))


def at_lane_zero(e: IndexExpr) -> IndexExpr:
    """The index of a vector's first lane: ``(c_2 + _lane)`` -> ``c_2``, and for an axis joined
    from several (``(i1 * 64 + c_2 + _lane)``) -> ``(i1 * 64 + c_2)``; other indices as they are."""
    base = lane_base(e)
    if base is None:
        return e
    return base if is_atom(base) else Paren(base)


def substitute(e: IndexExpr, replace: dict[IndexExpr, IndexExpr]) -> IndexExpr:
    """``e`` with every subexpression that is a key of ``replace`` replaced by its value (the
    outermost match wins), rebuilt operands first."""
    done: dict[int, IndexExpr] = {}
    pending: list[tuple[IndexExpr, bool]] = [(e, False)]
    while pending:
        node, ready = pending.pop()
        if id(node) in done:
            continue
        hit = replace.get(node)
        if hit is not None:
            done[id(node)] = hit
            continue
        if not node.kids:
            done[id(node)] = node
            continue
        if not ready:
            pending.append((node, True))
            pending.extend((k, False) for k in node.kids)
            continue
        kids = tuple(done[id(k)] for k in node.kids)
        if all(a is b for a, b in zip(kids, node.kids)):
            done[id(node)] = node
        else:
            done[id(node)] = _rebuilt(node, kids)
    return done[id(e)]


def _rebuilt(node: IndexExpr, kids: tuple[IndexExpr, ...]) -> IndexExpr:
    """A node of ``node``'s type and arg over other operands."""
    out = object.__new__(type(node))
    out._init(kids, node.arg)
    return out


def join_index(parts: Index, extents: tuple[int, ...]) -> IndexExpr:
    """``sum(part * stride)`` over a row-major run of axes: ``(i1 * 10 + c_2)``. A vector lane
    stays last and outside inner parentheses (``(i3 * 64 + c_4 + _lane)``), the form the kernels
    recognise as a lane-contiguous index (``index.lane_base``)."""
    if len(parts) == 1:
        return parts[0]
    groups: list[tuple[IndexExpr, ...]] = []  # innermost first
    stride = 1
    for p, e in zip(reversed(parts), reversed(extents)):
        if p != ZERO:
            lane = lane_base(p) if stride == 1 else None
            if lane is not None:
                groups.append((lane, LANE_VAR))
            else:
                groups.append((p if stride == 1 else Mul(p, Const(stride)),))
        stride *= e
    return sum_in_parens([t for g in reversed(groups) for t in g])


def sum_in_parens(terms: list[IndexExpr]) -> IndexExpr:
    """``(a + b + ...)``, ``(a)`` for one term, ``0`` for none."""
    if not terms:
        return ZERO
    return Paren(terms[0] if len(terms) == 1 else Add(*terms))


def linearize(idx: Index, shape) -> IndexExpr:
    terms = []
    stride = 1
    for i, e in zip(reversed(idx), reversed(shape)):
        if i != ZERO:
            terms.append(i if stride == 1 else Mul(i, Const(stride)))
        stride *= e
    return sum_in_parens(terms[::-1])


def delinearize(flat: IndexExpr, shape, flags) -> Index:
    out: list[IndexExpr] = []
    stride = math.prod(shape)
    for e, b in zip(shape, flags):
        stride //= max(e, 1)
        if b or e == 1:
            out.append(ZERO)
        elif stride == 1:
            out.append(Paren(Mod(flat, Const(e))))
        else:
            out.append(Paren(Mod(Paren(Div(flat, Const(stride))), Const(e))))
    return tuple(out)
