"""Typed index expressions (codegen.index): each node renders as the generators used to write it
as text, parentheses included, and the queries the generators decide on answer on the tree."""

from __future__ import annotations

import sys

import pytest

from fusecut.codegen.index import (
    LANE,
    LANE_VAR,
    ZERO,
    Add,
    All,
    AtLeast,
    Bool,
    Cast,
    Clamp,
    Const,
    Data,
    Div,
    Equal,
    Less,
    Mod,
    Mul,
    Paren,
    Select,
    Sub,
    Var,
    at_lane_zero,
    contains,
    join_index,
    lane_base,
    plus_lane,
    reads,
    render,
    substitute,
    uses,
    variables,
)
from fusecut.codegen.layout import address
from tests.codegen.index_text import parse_index

x0, x1, x2, c2, i1 = (Var(n) for n in ("x0", "x1", "x2", "c_2", "i1"))


def test_every_node_type_renders_as_the_text_the_generators_wrote():
    assert render(x0) == "x0" and render(Const(-3)) == "-3" and render(Bool(True)) == "true"
    assert str(plus_lane(x1)) == "(x1 + _lane)"
    assert str(Paren(Div(x0, Const(4)))) == "(x0 / 4)"
    assert str(Paren(Mod(Paren(Div(x0, Const(4))), Const(8)))) == "((x0 / 4) % 8)"
    assert str(Mul(x0, Const(2))) == "x0 * 2"  # a slice's step: no parentheses
    assert str(Paren(Add(Const(3), Mul(x0, Const(2))))) == "(3 + x0 * 2)"
    assert str(Paren(Sub(x0, Const(-2)))) == "(x0 - -2)"
    assert str(Clamp(Paren(Sub(x1, Const(64))), 56, "int")) == "fc_clampi<int>((x1 - 64), 56)"
    gathered = Cast(Data("T3", frozenset({"T3"})), "int64")
    assert str(Clamp(Select(Less(gathered, ZERO), Add(gathered, Const(8)), gathered), 7,
                     "int64")) == \
        "fc_clampi<int64>((int64)(T3) < 0 ? (int64)(T3) + 8 : (int64)(T3), 7)"
    assert str(Paren(All(AtLeast(x0, Const(64)), Less(x0, Const(128))))) == \
        "(x0 >= 64 && x0 < 128)"
    assert str(All(Equal(x2, ZERO), Less(x1, Const(8)))) == "x2 == 0 && x1 < 8"


def _old_join(parts: tuple[str, ...], extents: tuple[int, ...]) -> str:
    """join_index as it built text before the tree (the lane regex included)."""
    import re

    def old_lane_base(component):
        m = re.fullmatch(rf"\((.+) \+ ({LANE})\)", component)
        if m is None:
            return None
        depth = 0
        for ch in m.group(1):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth < 0:
                return None
        return m.group(1) if depth == 0 else None

    if len(parts) == 1:
        return parts[0]
    terms, stride = [], 1
    for p, e in zip(reversed(parts), reversed(extents)):
        if p != "0":
            lane = old_lane_base(p) if stride == 1 else None
            terms.append(f"{lane} + {LANE}" if lane is not None else
                         (p if stride == 1 else f"{p} * {stride}"))
        stride *= e
    return f"({' + '.join(reversed(terms))})" if terms else "0"


@pytest.mark.parametrize("parts, extents", [
    (("i1", "(c_2 + _lane)"), (4, 64)),
    (("x0", "x1", "x2"), (2, 3, 5)),
    (("0", "x1"), (7, 9)),
    (("x0", "0"), (7, 9)),
    (("0", "0"), (7, 9)),
    (("(x1 + _lane)", "x2"), (4, 8)),  # a lane sum at a stride: kept whole
    (("x0", "((x3 / 4) % 8)", "(c_2 + _lane)"), (2, 8, 16)),
    (("x0", "(i1 * 64 + c_2 + _lane)"), (3, 128)),
])
def test_joined_indices_render_as_the_text_join_wrote(parts, extents):
    joined = join_index(tuple(parse_index(p) for p in parts), extents)
    assert str(joined) == _old_join(parts, extents)


def test_lane_base_and_the_first_lane():
    joined = parse_index("(i1 * 64 + c_2 + _lane)")
    assert str(lane_base(joined)) == "i1 * 64 + c_2"  # a bare sum, as the text had it
    assert str(at_lane_zero(joined)) == "(i1 * 64 + c_2)"
    assert lane_base(plus_lane(c2)) == c2 and at_lane_zero(plus_lane(c2)) == c2
    mod = parse_index("((x0 % 64) + _lane)")
    assert str(at_lane_zero(mod)) == "((x0 % 64))"  # the text's parentheses around a non-name
    for other in ("x1", "(x1 * 2)", "(x1 + 3)", "((x1 + _lane) / 2)", "(x1 + _lane) * 2"):
        assert lane_base(parse_index(other)) is None
        assert at_lane_zero(parse_index(other)) == parse_index(other)


def test_queries_on_variables_and_data():
    gathered = Clamp(Cast(Data("vec_T1.v[_lane]", frozenset({"vec_T1", LANE})), "int"), 7, "int")
    e = Paren(Add(Mul(x0, Const(8)), gathered))
    assert variables(e) == {"x0"}
    assert reads(e) == {"x0", "vec_T1", LANE, "fc_clampi", "int"}  # the helper and type too
    assert uses(e, LANE) and uses(e, "x9", "x0") and not uses(e, "x1")
    assert contains(e, gathered) and not contains(e, x1)
    assert substitute(plus_lane(x1), {LANE_VAR: ZERO}) == parse_index("(x1 + 0)")
    assert str(substitute(parse_index("((x3 + _lane) / 2)"), {parse_index("(x3 + _lane)"):
                                                              Var("x3")})) == "(x3 / 2)"


def test_equal_trees_are_equal_keys_and_never_equal_text():
    a, b = parse_index("((x0 / 4) % 8)"), parse_index("((x0 / 4) % 8)")
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert a != parse_index("((x0 / 4) % 9)") and Var("x0") != Const(0)
    assert Data("T1", frozenset({"T1"})) != Data("T1", frozenset())
    with pytest.raises(TypeError):
        _ = a == "((x0 / 4) % 8)"
    with pytest.raises(AttributeError):
        a.arg = 3


def test_deep_indices_render_compare_and_hash_without_recursion():
    depth = 4 * sys.getrecursionlimit()  # a chain of reshapes and slices
    e, f = x0, x0
    for k in range(depth):
        e, f = Paren(Add(Const(k), e)), Paren(Add(Const(k), f))
    assert e == f and hash(e) == hash(f)
    assert render(e).endswith("x0" + ")" * depth) and variables(e) == {"x0"}
    assert substitute(e, {x0: x1}) != e


def test_addresses_are_bare_sums_of_index_times_stride():
    assert str(address((x0, ZERO, plus_lane(x2)), (64, 8, 1))) == "x0 * 64 + (x2 + _lane)"
    assert str(address((x0, x1), (0, 0))) == "0"
    assert str(address((Mul(x0, Const(2)),), (64,))) == "x0 * 2 * 64"


def test_text_parsed_back_renders_as_it_was():
    for text in ("((x0 / 4) % 8)", "(i1 * 64 + c_2 - 64)", "fc_clampi<int>((x1 - 64), 56)",
                 "(x0 >= 64 && x0 < 128)", "x0 * 2 * 64", "(5 + (x1 + _lane) * 2)"):
        assert str(parse_index(text)) == text
