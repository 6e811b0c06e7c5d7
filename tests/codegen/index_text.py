"""Index expressions written as C in tests: ``parse_index("((x1 % 128) + _lane)")`` is the tree
whose rendering is that text (parentheses kept as ``Paren`` nodes), so a test states an index the
way a kernel spells it. A test helper only: the generators build their trees themselves."""

from __future__ import annotations

import re

from fusecut.codegen.index import (
    Add,
    All,
    AtLeast,
    Bool,
    Cast,
    Clamp,
    Const,
    Div,
    Equal,
    IndexExpr,
    Less,
    Mod,
    Mul,
    Paren,
    Select,
    Sub,
    Var,
)

_TOKEN = re.compile(r"\s*(fc_clampi<\w+>|\d+|[A-Za-z_]\w*|&&|>=|==|[-+*/%()<?:,])")
_TYPES = {"int", "int64", "index_t", "long long", "unsigned", "unsigned long long"}


def parse_index(text: str) -> IndexExpr:
    tokens = _tokens(text)
    pos, e = _ternary(tokens, 0)
    assert pos == len(tokens), f"unparsed: {tokens[pos:]}"
    return e


def _tokens(text: str) -> list[str]:
    out, at = [], 0
    while at < len(text.rstrip()):
        m = _TOKEN.match(text, at)
        assert m, text[at:]
        out.append(m.group(1))
        at = m.end()
    return out


def _ternary(t, i):
    i, cond = _and(t, i)
    if i < len(t) and t[i] == "?":
        i, a = _ternary(t, i + 1)
        assert t[i] == ":"
        i, b = _ternary(t, i + 1)
        return i, Select(cond, a, b)
    return i, cond


def _and(t, i):
    i, first = _compare(t, i)
    terms = [first]
    while i < len(t) and t[i] == "&&":
        i, nxt = _compare(t, i + 1)
        terms.append(nxt)
    return i, terms[0] if len(terms) == 1 else All(*terms)


def _compare(t, i):
    i, a = _sum(t, i)
    ops = {"<": Less, ">=": AtLeast, "==": Equal}
    if i < len(t) and t[i] in ops:
        op = ops[t[i]]
        i, b = _sum(t, i + 1)
        return i, op(a, b)
    return i, a


def _sum(t, i):
    i, first = _product(t, i)
    terms = [first]
    while i < len(t) and t[i] in "+-" and len(t[i]) == 1:
        if t[i] == "+":
            i, nxt = _product(t, i + 1)
            terms.append(nxt)
        else:
            i, nxt = _product(t, i + 1)
            terms = [Sub(terms[0] if len(terms) == 1 else Add(*terms), nxt)]
    return i, terms[0] if len(terms) == 1 else Add(*terms)


def _product(t, i):
    i, e = _unary(t, i)
    ops = {"*": Mul, "/": Div, "%": Mod}
    while i < len(t) and t[i] in ops:
        op = ops[t[i]]
        i, b = _unary(t, i + 1)
        e = op(e, b)
    return i, e


def _unary(t, i):
    if t[i] == "-" and t[i + 1].isdigit():
        return i + 2, Const(-int(t[i + 1]))
    return _primary(t, i)


def _primary(t, i):
    tok = t[i]
    if tok.isdigit():
        return i + 1, Const(int(tok))
    if tok.startswith("fc_clampi<"):
        assert t[i + 1] == "("
        i, x = _ternary(t, i + 2)
        assert t[i] == ","
        i, hi = _ternary(t, i + 1)
        assert t[i] == ")" and isinstance(hi, Const)
        return i + 1, Clamp(x, hi.value, tok[len("fc_clampi<"):-1])
    if tok in ("true", "false"):
        return i + 1, Bool(tok == "true")
    if tok == "(":
        end = t.index(")", i)
        ctype = " ".join(t[i + 1:end])
        if ctype in _TYPES and end + 1 < len(t) and t[end + 1] == "(":
            i, x = _ternary(t, end + 2)
            assert t[i] == ")"
            return i + 1, Cast(x, ctype)
        i, x = _ternary(t, i + 1)
        assert t[i] == ")", t[i:]
        return i + 1, Paren(x)
    return i + 1, Var(tok)
