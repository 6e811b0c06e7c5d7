"""Values and statements as the generators emit them, with what they read and declare.

A value (``Code``) is a C expression of some compute type, with the declared names it reads, the
index expressions its text spells, and whether it is a plain name (``simple``: ``T7``,
``vec_T0.v[_lane]``, ``p_T3[k][_lane]``, which a second use costs nothing to repeat). A statement
(``Stmt``) is a line of a kernel (a signature spans several) with the name it declares (``const``
declarations only), the names it reads and the index expressions it spells.
The spelling is made once, by the generators and ``codegen.cuda``; what follows from it is then
computed on these records, never by reading the text back: which declarations nothing reads
(``drop_unread``), whether a cast or squeeze can hand its operand on, whether a load reads what
the statements compute, whether a loop reads its lane, how a tile's code uses a batch index.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fusecut.codegen import cuda
from fusecut.codegen.index import IndexExpr
from fusecut.codegen.index import reads as index_reads
from fusecut.optimizer.ir.dtypes import DType


@dataclass(frozen=True)
class Code:
    """A C value expression: its text, the declared names it reads, whether it is a plain (maybe
    indexed) name, and the index expressions its text spells."""

    text: str
    reads: frozenset[str] = frozenset()
    simple: bool = False
    indices: tuple[IndexExpr, ...] = ()

    def __str__(self) -> str:
        return self.text


def named(n: str) -> Code:
    """A declared value used by name."""
    return Code(n, frozenset({n}), True)


def derived(text: str | Code, *parts) -> Code:
    """A value computed from ``parts`` (values, indices, names): it reads what they read."""
    return Code(str(text), names(*parts), False, spelt(*parts))


def loaded(text: str, d: DType, *parts, simple: bool = False) -> Code:
    """A value of storage type ``d`` read at ``text`` (a ``simple`` element: ``vec_T0.v[_lane]``),
    as its compute type, reading what ``parts`` read."""
    return Code(cuda.to_compute(text, d), names(*parts), simple and cuda.computed_as_stored(d),
                spelt(*parts))


@dataclass(frozen=True)
class Stmt:
    """One statement: its text (no indentation of its own), the name it declares if it is a
    ``const`` declaration (which ``drop_unread`` may remove), the declared names it reads and
    the index expressions it spells."""

    text: str
    declares: str | None = None
    reads: frozenset[str] = frozenset()
    indices: tuple[IndexExpr, ...] = ()

    def indented(self, n: int) -> Stmt:
        return replace(self, text=" " * n + self.text) if self.text else self


def _flat(parts) -> list:
    """``parts`` with iterables of parts spread out, Nones left out."""
    out, pending = [], list(reversed(parts))
    while pending:
        p = pending.pop()
        if isinstance(p, (Code, IndexExpr, str)):
            out.append(p)
        elif p is not None:
            pending.extend(reversed(list(p)))
    return out


def names(*parts) -> frozenset[str]:
    """The declared names a statement built from ``parts`` reads: a value's, an index's (its
    variables and gathered data), a name itself, or those of an iterable of such parts."""
    out: set[str] = set()
    for p in _flat(parts):
        if isinstance(p, Code):
            out |= p.reads
        elif isinstance(p, IndexExpr):
            out |= index_reads(p)
        else:
            out.add(p)
    return frozenset(out)


def spelt(*parts) -> tuple[IndexExpr, ...]:
    """The index expressions a statement built from ``parts`` spells: the indices among them
    and those the values among them spell."""
    out: list[IndexExpr] = []
    for p in _flat(parts):
        if isinstance(p, Code):
            out += p.indices
        elif isinstance(p, IndexExpr):
            out.append(p)
    return tuple(out)


def stmt(text: str, *parts) -> Stmt:
    """A statement reading what ``parts`` read (see ``names``)."""
    return Stmt(text, None, names(*parts), spelt(*parts))


def lines(*texts: str) -> list[Stmt]:
    """Statements that read no declared name (braces, pragmas, comments, barriers)."""
    return [Stmt(t) for t in texts]


def declare(ctype: str, n: str, expr: Code | IndexExpr | str, comment: str = "",
            reads=()) -> Stmt:
    """``const ctype n = expr;  // comment``, reading what ``expr`` reads (text reads nothing)
    and ``reads``."""
    text = f"const {ctype} {n} = {expr};" + (f"  // {comment}" if comment else "")
    parts = (None if isinstance(expr, str) else expr, reads)
    return Stmt(text, n, names(*parts), spelt(*parts))


def indent(stmts: list[Stmt], n: int) -> list[Stmt]:
    return [s.indented(n) for s in stmts]


def drop_unread(stmts: list[Stmt]) -> list[Stmt]:
    """``stmts`` without the declarations nothing reads (a reduction result or 16-bit rounding no
    consumer took), repeated until none is left. Exact: only a name declared once in the source
    counts (the same name in two scopes is kept), and a read is a recorded one."""
    stmts = list(stmts)
    for s in stmts:
        if not isinstance(s, Stmt):
            raise TypeError(f"a kernel line must be a Stmt (what it reads is recorded): {s!r}")
    while True:
        declared: dict[str, int] = {}
        for s in stmts:
            if s.declares is not None:
                declared[s.declares] = declared.get(s.declares, 0) + 1
        read: set[str] = set()
        for s in stmts:
            read |= s.reads
        dead = {n for n, count in declared.items() if count == 1 and n not in read}
        if not dead:
            return stmts
        stmts = [s for s in stmts if s.declares not in dead]


def text_of(stmts: list[Stmt]) -> str:
    return "\n".join(s.text for s in stmts)
