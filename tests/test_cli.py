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
