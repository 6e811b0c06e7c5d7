"""Typed statements (codegen.code): a kernel's lines carry what they declare, what they read and
the index trees they spell, and dropping unread declarations is a set computation over those
records. The records are checked here against the text the generators emit (the rule the
generator once applied to its own text with regular expressions, kept in this test as the
reference)."""

from __future__ import annotations

import re

import pytest

from fusecut.codegen import code as code_module
from fusecut.codegen import generate_segment
from fusecut.codegen import kernel as kernel_module
from fusecut.codegen import pointwise as pointwise_module
from fusecut.codegen.code import Code, Stmt, declare, derived, drop_unread, lines, named, stmt
from fusecut.codegen.index import Var, variables
from fusecut.codegen.persistent import IO_PREAMBLE
from fusecut.codegen.preamble import needed
from fusecut.optimizer.ir import parse_text
from fusecut.optimizer.ir.inputs import tensor_meta
from fusecut.optimizer.planner import PlanOptions, make_plan
from tests.conftest import CORPUS
from tests.helpers import fusion, small_metas

# the text rule: a ``const`` declaration, and a read as a word outside comments
_DECLARATION = re.compile(r"\s*const [\w<>, :]+? (\w+) = [^;]*;(\s*//.*)?")
_WORD = re.compile(r"[A-Za-z_]\w*")
_DOMAIN_INDEX = re.compile(r"x\d+")


def test_drop_unread_is_exact():
    a = declare("float", "a", Code("1.0f"))
    b = declare("float", "b", derived("a * 2.0f", "a"), "reads a")
    c = declare("float", "c", Code("3.0f"), "c is also read below")
    x0 = declare("index_t", "x0", Code("0"))
    inner = declare("index_t", "x0", Code("1"))
    out = stmt("out[0] = c;  // b", "c")
    body = [a, b, c, x0, *lines("{"), inner, *lines("}"), out]
    # b is unread, then a is; a name in a comment is no read; x0 is declared in two scopes, so
    # its name alone cannot tell which is read: both stay
    assert drop_unread(body) == body[2:]
    assert drop_unread(body[2:]) == body[2:]
    with pytest.raises(TypeError):
        drop_unread(["const float a = 1.0f;"])


def test_statements_record_what_their_parts_read():
    x = Var("x1")
    value = derived("(T3 + T4)", named("T3"), named("T4"))
    assert value.reads == {"T3", "T4"} and not value.simple and named("T3").simple
    s = stmt(f"out_T5[{x} * 8] = {value};", x, value)
    assert s.reads == {"x1", "T3", "T4"} and s.declares is None
    d = declare("float", "T6", value, "T6 = add(T3, T4)")
    assert d.text == "const float T6 = (T3 + T4);  // T6 = add(T3, T4)" and d.declares == "T6"
    assert d.indented(2).text.startswith("  const") and d.indented(2).reads == d.reads
    assert declare("index_t", "c", "(k * 32 + threadIdx.x) * 4").reads == frozenset()


def _audit(stmts: list[Stmt]) -> list[str]:
    """Where the records and the text disagree on a declared name."""
    declared = {s.declares for s in stmts if s.declares}
    helpers = set(IO_PREAMBLE.strip("\n").split("\n"))  # static text: it declares nothing
    wrong = []
    for s in stmts:
        m = _DECLARATION.fullmatch(s.text)
        if (m.group(1) if m and s.text not in helpers else None) != s.declares:
            wrong.append(f"declares {s.declares!r}: {s.text}")
        words = set(_WORD.findall(s.text.split("//", 1)[0])) - {s.declares}
        if words & declared != s.reads & declared:
            wrong.append(f"reads {sorted(s.reads & declared)}: {s.text}")
        # the domain indices it spells are those of the index trees it records
        spelt = {v for e in s.indices for v in variables(e) if _DOMAIN_INDEX.fullmatch(v)}
        if {w for w in words if _DOMAIN_INDEX.fullmatch(w)} != spelt:
            wrong.append(f"indices {sorted(spelt)}: {s.text}")
    return wrong


@pytest.mark.parametrize("case", ["layernorm_bwd", "rope_fwd_thunder", "cross_entropy_fwd",
                                  "rope_bwd_interleaved_thunder", "group_norm_fwd",
                                  "bias_dropout_add_layernorm", "transpose_add", "adam_step",
                                  "seed_2146_rmsnorm_bwd"])
def test_recorded_declarations_and_reads_match_the_text(case, monkeypatch):
    seen: list[list[str]] = []

    def audited(stmts):
        seen.append(_audit(stmts))
        return code_module.drop_unread(stmts)

    monkeypatch.setattr(kernel_module, "drop_unread", audited)
    monkeypatch.setattr(pointwise_module, "drop_unread", audited)
    parsed = parse_text((CORPUS / f"{case}.py").read_text())
    for metas in (small_metas(parsed, 1 << 14), parsed.inputs):
        plan = make_plan(parsed.fusion, metas, PlanOptions(segmenter="greedy"))
        for seg in plan.segments:
            for vector in (None, 1):
                _assert_links_what_it_spells(generate_segment(plan, seg, vector))
    assert seen and not [w for ws in seen for w in ws]


def _assert_links_what_it_spells(sk) -> None:
    """The preamble pieces a segment's recorded calls need are those its text names."""
    assert needed(sk.uses) == needed(_WORD.findall(sk.code)), sk.code


def _two(dtype: str, *lines_: str) -> str:
    decl = f"fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.{dtype})"
    return "\n".join([f"T0 = {decl}", f"T1 = {decl}", *lines_])


# every helper codegen.cuda spells: integer division and powers, float remainders and clamps,
# 8-bit float conversions
HELPER_CASES = {
    "integer": _two("Int32", "T2 = fd.ops.div(T0, T1)", "T3 = fd.ops.fmod(T0, T1)",
                    "T4 = fd.ops.remainder(T0, T1)", "T5 = fd.ops.pow(T0, T1)",
                    "T6 = fd.ops.logical_right_shift(T0, T1)",
                    *[f"fd.add_output(T{k})" for k in range(2, 7)]),
    "float": _two("Float", "T2 = fd.ops.remainder(T0, T1)", "T3 = fd.ops.maximum(T0, T1)",
                  "T4 = fd.ops.clamp(T0, T1, T1)", "T5 = fd.ops.minimum(T0, T1)",
                  *[f"fd.add_output(T{k})" for k in range(2, 6)]),
    "fp8": _two("Float8_e4m3fn", "T2 = fd.ops.cast(T0, dtype=DataType.Float)",
                "T3 = fd.ops.cast(T1, dtype=DataType.Float)", "T4 = fd.ops.add(T2, T3)",
                "T5 = fd.ops.cast(T4, dtype=DataType.Float8_e5m2)",
                "T6 = fd.ops.cast(T4, dtype=DataType.Float8_e4m3fn)",
                "fd.add_output(T5)", "fd.add_output(T6)"),
}
HELPERS = {"integer": {"fc_div", "fc_div_rem", "fc_remainder_int", "fc_ipow", "fc_lshr"},
           "float": {"fc_max", "fc_min", "fc_remainder"}, "fp8": {"fc_e4m3", "fc_e5m2"}}


@pytest.mark.parametrize("case", sorted(HELPER_CASES))
def test_the_preamble_links_the_helpers_the_statements_call(case):
    f = fusion(HELPER_CASES[case])
    metas = [tensor_meta((64, 128), f.tensors[t].dtype) for t in f.tensor_inputs()]
    plan = make_plan(f, metas, PlanOptions(segmenter="greedy"))
    for seg in plan.segments:
        for vector in (None, 1):
            sk = generate_segment(plan, seg, vector)
            _assert_links_what_it_spells(sk)
            assert HELPERS[case] <= {p.name for p in needed(sk.uses)}
