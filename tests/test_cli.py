"""The fusecut command line, run as a user runs it (a subprocess)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import CORPUS


def fusecut(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fusecut.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_check_prints_inputs_ops_outputs():
    r = fusecut("check", str(CORPUS / "layernorm_fwd.py"))
    assert r.returncode == 0, r.stderr
    assert "var_mean" in r.stdout and "32768x4096" in r.stdout and "bfloat16" in r.stdout


def test_check_rejects_malformed_text_with_location():
    bad = ("from nvfuser import FusionDefinition, DataType\ndef f(fd):\n"
           "    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
           "    T1 = fd.ops.nope(T0)\n    fd.add_output(T1)\n")
    r = fusecut("check", "-", stdin=bad)
    assert r.returncode == 2
    assert "line 4" in r.stderr and "unknown op 'nope'" in r.stderr
    assert "Traceback" not in r.stderr


def test_check_missing_file():
    r = fusecut("check", "/nonexistent/x.py")
    assert r.returncode == 2 and "cannot read" in r.stderr


def test_plan_table_json_svg_dot(tmp_path):
    path = str(CORPUS / "seed_2146_rmsnorm_bwd.py")
    r = fusecut("plan", path, "--svg", str(tmp_path / "p.svg"), "--dot", str(tmp_path / "p.dot"))
    assert r.returncode == 0, r.stderr
    assert "inner_outer" in r.stdout and "lower bound" in r.stdout and "greedy" in r.stdout
    svg = (tmp_path / "p.svg").read_text()
    assert svg.startswith("<svg") and "segment 0" in svg and "http://" not in svg.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")
    assert (tmp_path / "p.dot").read_text().startswith("digraph plan")
    r = fusecut("plan", path, "--json", "--segmenter", "greedy")
    import json

    data = json.loads(r.stdout)
    assert data["segmenter"] == "greedy" and data["totals"]["segments"] >= 2


def test_plan_needs_input_metadata():
    text = ("from nvfuser import FusionDefinition, DataType\ndef f(fd):\n"
            "    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
            "    fd.add_output(fd.ops.neg(T0))\n")
    r = fusecut("plan", "-", stdin=text)
    assert r.returncode == 2 and "no input metadata" in r.stderr
    r = fusecut("plan", "-", "--inputs", '[{"shape": [8], "dtype": "float32"}]', "--json",
                stdin=text)
    assert r.returncode == 0, r.stderr
    r = fusecut("plan", "-", "--inputs", '[{"shape": [8], "dtype": "bfloat16"}]', stdin=text)
    assert r.returncode == 2 and "expected dtype float32, got bfloat16" in r.stderr
    r = fusecut("plan", "-", "--inputs", '[{"shape": [8], "dtype": "float32"}]',
                "--segmenter", "nope", stdin=text)
    assert r.returncode == 2 and "unknown segmenter" in r.stderr


def test_codegen_writes_readable_sources(tmp_path):
    r = fusecut("codegen", str(CORPUS / "layernorm_bwd.py"), "--out", str(tmp_path), "--compile")
    assert r.returncode == 0, r.stderr
    (cu,) = tmp_path.glob("*.cu")
    source = cu.read_text()
    assert "__global__" in source and "// stage 1" in source
    import json

    launch = json.loads(cu.with_suffix(".json").read_text())
    assert [k["name"] for k in launch["kernels"]] == ["fusecut_segment0_inner_outer",
                                                       "fusecut_segment0_inner_outer_columns"]


def test_execute_runs_a_repro_on_the_cpu():
    r = fusecut("execute", str(CORPUS / "softmax_fwd.py"), "--scale", "4096", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "largest difference from the torch reference: 0" in r.stdout
    assert "normalization" in r.stdout
