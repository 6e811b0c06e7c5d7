"""Values and statements as the generators emit them, with what they read and declare.

A value (``Code``) is a C expression of some compute type, with the names it reads, the index
expressions its text spells, and whether it is a plain name (``simple``: ``T7``,
``vec_T0.v[_lane]``, ``p_T3[k][_lane]``, which a second use costs nothing to repeat). A statement
(``Stmt``) is a line of a kernel (a signature spans several) with the name it declares (``const``
declarations only), the names it reads and the index expressions it spells. The names read are
the declared values and indices, and the device helpers and types of ``codegen.preamble`` the
text calls (``fc_max``, ``fc_vec``, ``int64``).

The spelling is made once, by the generators and ``codegen.cuda``; what follows from it is then
computed on these records, never by reading the text back: which declarations nothing reads
(``drop_unread``), whether a cast or squeeze can hand its operand on, whether a load reads what
the statements compute, whether a loop reads its lane, how a tile's code uses a batch index,
which helpers the kernel's preamble defines.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusecut.codegen.index import IndexExpr
from fusecut.codegen.index import reads as index_reads


@dataclass(frozen=True, slots=True)
class Code:
    """A C value expression: its text, the names it reads, whether it is a plain (maybe indexed)
    name, and the index expressions its text spells."""

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
    """A value computed from ``parts`` (values, indices, names): it reads what they read (and,
    spelt by ``codegen.cuda`` as a helper's call, what ``text`` reads)."""
    if isinstance(text, Code):
        parts = (text, *parts)
    read, spelling = _records(parts)
    return Code(str(text), read, False, spelling)


@dataclass(frozen=True, slots=True)
class Stmt:
    """One statement: its text (no indentation of its own), the name it declares if it is a
    ``const`` declaration (which ``drop_unread`` may remove), the names it reads and the index
    expressions it spells."""

    text: str
    declares: str | None = None
    reads: frozenset[str] = frozenset()
    indices: tuple[IndexExpr, ...] = ()

    def indented(self, n: int) -> Stmt:
        if not self.text:
            return self
        return Stmt(" " * n + self.text, self.declares, self.reads, self.indices)


def _records(parts) -> tuple[frozenset[str], tuple[IndexExpr, ...]]:
    """What a statement built from ``parts`` reads and spells: for a value, its names and
    indices; for an index, its names (variables, gathered data, helpers) and itself; a string
    is a name; an iterable, those of its parts; None, nothing."""
    read: set[str] = set()
    spelling: list[IndexExpr] = []
    pending = list(parts)
    pending.reverse()
    while pending:
        p = pending.pop()
        if isinstance(p, str):
            read.add(p)
        elif isinstance(p, Code):
            read |= p.reads
            spelling += p.indices
        elif isinstance(p, IndexExpr):
            read |= index_reads(p)
            spelling.append(p)
        elif p is not None:
            more = list(p)
            more.reverse()
            pending += more
    return frozenset(read), tuple(spelling)


def names(*parts) -> frozenset[str]:
    """The names a statement built from ``parts`` reads (see ``_records``)."""
    return _records(parts)[0]


def spelt(*parts) -> tuple[IndexExpr, ...]:
    """The index expressions a statement built from ``parts`` spells (see ``_records``)."""
    return _records(parts)[1]


def stmt(text: str, *parts) -> Stmt:
    """A statement reading what ``parts`` read (see ``_records``)."""
    return Stmt(text, None, *_records(parts))


def lines(*texts: str) -> list[Stmt]:
    """Statements that read no declared name (braces, pragmas, comments, barriers)."""
    return [Stmt(t) for t in texts]


def declare(ctype: str, n: str, expr: Code | IndexExpr | str, comment: str = "",
            reads=()) -> Stmt:
    """``const ctype n = expr;  // comment``, reading what ``expr`` reads (text reads nothing)
    and ``reads``."""
    text = f"const {ctype} {n} = {expr};" + (f"  // {comment}" if comment else "")
    return Stmt(text, n, *_records((None if isinstance(expr, str) else expr, reads)))


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
