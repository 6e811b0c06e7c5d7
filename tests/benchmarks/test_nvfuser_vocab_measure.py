"""The parse-rate measure (benchmarks/nvfuser_vocab.py): which definitions it extracts, and the
table it makes, on a small Fuser-like git repository."""

from __future__ import annotations

import subprocess

from benchmarks.nvfuser_vocab import definitions_in, extract, main, measure

SOURCE = '''
import torch
from nvfuser import DataType, FusionDefinition

SIZE = 4


def module_level(fd: FusionDefinition) -> None:
    t0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
    fd.add_output(fd.ops.neg(t0))


def test_things():
    inputs = [torch.randn(4)]
    dtype = DataType.Half

    def self_contained(fd: FusionDefinition) -> None:
        t0 = fd.define_tensor(shape=[SIZE, -1])  # a module-level name is allowed
        t1 = fd.ops.relu(t0)
        fd.add_output(t1)
        return t1

    def uses_inputs(fd: FusionDefinition) -> None:
        t0 = fd.from_pytorch(inputs[0])
        fd.add_output(t0)

    def uses_dtype(fd):
        t0 = fd.define_tensor(shape=[-1], dtype=dtype)
        fd.add_output(t0)

    def with_a_loop(fd):
        t0 = fd.define_tensor(shape=[-1])
        for _ in range(2):
            t0 = fd.ops.neg(t0)
        fd.add_output(t0)

    def two_parameters(fd, n):
        fd.add_output(fd.define_tensor(shape=[n]))

    def not_a_definition(x):
        return x.shape

    def unknown_op(fd):
        t0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
        fd.add_output(fd.ops.no_such_op(t0))
'''


def test_extracts_one_parameter_self_contained_straight_line_definitions():
    defs = definitions_in("tests/python/test_x.py", SOURCE)
    assert [(d.name, d.line) for d in defs] == [("module_level", 8), ("self_contained", 17),
                                               ("unknown_op", 43)]
    text = defs[1].text
    assert text.startswith("from nvfuser import") and "\ndef self_contained(fd" in text


def test_measure_reports_each_stage():
    defs = {d.name: d for d in definitions_in("tests/python/test_x.py", SOURCE)}
    assert measure(defs["module_level"]).stage == "ran"
    failed = measure(defs["unknown_op"])
    assert failed.stage == "parse" and "unknown op 'no_such_op'" in failed.error
    assert "\n" not in failed.error and len(failed.error) <= 200
    # SIZE is not a literal fusecut can read: a one-line error names it
    assert measure(defs["self_contained"]).error == "line 5, column 5: name 'SIZE' is not defined"


def test_the_measure_reads_a_git_directory(tmp_path, capsys):
    repo = tmp_path / "fuser"
    (repo / "tests" / "python").mkdir(parents=True)
    (repo / "tests" / "python" / "test_x.py").write_text(SOURCE)
    (repo / "elsewhere.py").write_text(SOURCE)  # outside tests/python and benchmarks/python
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    commit, defs = extract(str(repo / ".git"))
    assert len(commit) == 40 and len(defs) == 3
    assert main(["--fuser", str(repo / ".git"), "--no-write"]) == 0
    out = capsys.readouterr().out
    assert f"NVIDIA/Fuser commit {commit}" in out
    assert "| parse (`fusecut check`) | 1/3 (33.3%) |" in out
    assert "tests/python/test_x.py:43 unknown_op | parse |" in out
