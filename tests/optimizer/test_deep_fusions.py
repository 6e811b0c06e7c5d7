"""Fusions deeper than Python's stack: no walk over the graph in optimizer/ or codegen/ recurses,
so a 20,000-op chain plans, generates code (``fusecut codegen``) and runs on the CPU path
(``fusecut execute --device cpu``)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from fusecut.optimizer.ir import parse_text
from tests.sdk.test_cli import fusecut

ROOT = Path(__file__).resolve().parents[2]  # optimizer/ and codegen/ are rooms at its top
# Walks over a value's nested attribute lists, or over the definition text's syntax tree (its
# depth bounded by Python's parser and nvtext.MAX_DEPTH): never over the graph.
NOT_GRAPH_WALKS = {
    ("optimizer/ir/fusion.py", "_collect_refs"), ("optimizer/ir/printer.py", "_attr"),
    ("optimizer/ir/wire.py", "_attr_out"), ("optimizer/ir/wire.py", "_attr_in"),
    ("optimizer/plan/subfusion.py", "_map_refs"), ("optimizer/ir/nvtext.py", "_literal_number"),
    ("optimizer/ir/nvtext.py", "_expr"), ("optimizer/ir/nvtext.py", "_tensor"),
}


def deep_chain(n_tensor_ops: int, n_scalar_ops: int) -> str:
    """A float chain of tanh, mul by a scalar and add ending in a bf16 output (so every tanh may
    use fast math), the scalar itself a chain of products of a scalar input."""
    lines = ["import torch", "from nvfuser import FusionDefinition, DataType", "",
             "def nvfuser_fusion_id0(fd : FusionDefinition) -> None :",
             "    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], "
             "dtype=DataType.Float, is_cpu=False)",
             "    S0 = fd.define_scalar(None, dtype=DataType.Double)"]
    lines += [f"    S{k} = fd.ops.mul(S{k - 1}, S0)" for k in range(1, n_scalar_ops + 1)]
    for k in range(1, n_tensor_ops + 1):
        expr = (f"fd.ops.add(T{k - 1}, T0)", f"fd.ops.tanh(T{k - 1})",
                f"fd.ops.mul(T{k - 1}, S{n_scalar_ops})")[k % 3]
        lines.append(f"    T{k} = {expr}")
    out = n_tensor_ops + 1
    lines += [f"    T{out} = fd.ops.cast(T{n_tensor_ops}, dtype=DataType.BFloat16)",
              f"    fd.add_output(T{out})", "",
              "with FusionDefinition() as fd:", "    nvfuser_fusion_id0(fd)", "",
              "inputs = [torch.randn((64, 64), dtype=torch.float32, device='cuda:0'), 0.999]",
              "fd.execute(inputs)", ""]
    return "\n".join(lines)


def _self_calls(path: Path) -> set[str]:
    """Functions of a module that call themselves by name: ``f(...)`` in a function or nested
    function ``f``, ``self.f(...)`` in a method ``f``."""
    tree = ast.parse(path.read_text())
    methods = {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body}
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for call in ast.walk(node):
            if not isinstance(call, ast.Call):
                continue
            f = call.func
            if id(node) in methods:
                itself = (isinstance(f, ast.Attribute) and f.attr == node.name
                          and isinstance(f.value, ast.Name) and f.value.id == "self")
            else:
                itself = isinstance(f, ast.Name) and f.id == node.name
            if itself:
                found.add(node.name)
    return found


def test_no_walk_over_the_graph_calls_itself():
    # before: AxisMap._find, codegen/precision.py's only_reaches_16bit and
    # subfusion._scalar recursed along chains (the emitter's pull recursed through _op and operand:
    # see below)
    recursive = {(str(p.relative_to(ROOT)), name)
                 for package in ("optimizer", "codegen") for p in (ROOT / package).rglob("*.py")
                 for name in _self_calls(p)}
    assert recursive <= NOT_GRAPH_WALKS, sorted(recursive - NOT_GRAPH_WALKS)
    assert ("optimizer/ir/fusion.py", "_collect_refs") in recursive  # the check finds them


def test_the_emitter_pulls_a_chain_longer_than_the_stack_allows():
    from fusecut.codegen import generate_segment
    from fusecut.optimizer.planner import PlanOptions, make_plan

    parsed = parse_text(deep_chain(3 * sys.getrecursionlimit(), 0))
    plan = make_plan(parsed.fusion, parsed.inputs, PlanOptions(segmenter="greedy"))
    (segment,) = plan.segments
    source = generate_segment(plan, segment).source
    assert source.count("[recomputed]") == 0
    assert f"T{3 * sys.getrecursionlimit()} = add(" in source
    assert source.count("fc_tanh_fast(") > sys.getrecursionlimit()  # fast math along it all


@pytest.mark.slow
def test_a_20000_op_chain_generates_code_and_runs_on_the_cpu(tmp_path):
    path = tmp_path / "deep.py"
    path.write_text(deep_chain(20_000, 1_500))
    r = fusecut("codegen", str(path), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr[-2000:]
    (cu,) = (tmp_path / "out").glob("*.cu")
    source = cu.read_text()
    assert "T20000 = mul(T19999, S1500)" in source and source.count("fc_tanh_fast(") > 6_666
    r = fusecut("execute", str(path), "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "whole-fusion torch reference: 0 " in r.stdout
