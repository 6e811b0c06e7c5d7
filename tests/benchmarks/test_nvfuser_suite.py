"""The nvFuser frontend suite's report (benchmarks/nvfuser_suite.py): the tables it builds from the
harness's JSON lines, on a fake results file. Nothing of nvFuser's is run here."""

from __future__ import annotations

import json

import pytest

from benchmarks import common, nvfuser_suite
from benchmarks.nvfuser_suite import build_report, load_records, main, normalize

RECORDS = [
    {"run": True, "torch": "2.x", "cuda": False, "fusecut_commit": "abc123"},
    {"suite": "legacy", "nodeid": "python/test_a.py::test_1", "file": "python/test_a.py",
     "outcome": "passed", "reason": ""},
    {"suite": "legacy", "nodeid": "python/test_a.py::test_2", "file": "python/test_a.py",
     "outcome": "failed", "reason": "DefinitionError: T12 has rank 3"},
    {"suite": "legacy", "nodeid": "python/test_a.py::test_3", "file": "python/test_a.py",
     "outcome": "failed", "reason": "DefinitionError: T7 has rank 2"},
    {"suite": "legacy", "nodeid": "python/test_a.py::test_4", "file": "python/test_a.py",
     "outcome": "out_of_scope", "reason": "needs 2 GPUs"},
    {"suite": "direct", "nodeid": "python/direct/test_b.py::test_1",
     "file": "python/direct/test_b.py", "outcome": "error", "reason": "ImportError: x | y"},
    {"suite": "direct", "nodeid": "python/direct/test_b.py::test_2",
     "file": "python/direct/test_b.py", "outcome": "skipped", "reason": "needs Hopper"},
    # a later record of the same test wins (a rerun of one file merged in)
    {"suite": "direct", "nodeid": "python/direct/test_b.py::test_1",
     "file": "python/direct/test_b.py", "outcome": "passed", "reason": ""},
    {"summary": True, "passed": 99},
]


@pytest.fixture
def results(tmp_path):
    path = tmp_path / "res.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in RECORDS) + "\nnot json\n")
    return path


def test_reasons_group_across_tensor_names_and_numbers():
    assert normalize("DefinitionError: T12 has rank 3") == normalize("DefinitionError: T7 has "
                                                                     "rank 2")
    assert normalize("a\nsecond line") == "a"


def test_report_counts_per_suite_file_and_reason(results):
    recs, info = load_records([results])
    assert info["fusecut_commit"] == "abc123" and len(recs) == 6
    text, totals = build_report(recs)
    # in scope: 2 passed + 2 failed (skips and out-of-scope tests do not count)
    assert totals == {"ran": 4, "passed": 2, "pass_rate": "50.0%", "out_of_scope": 1,
                      "reasons": 1}
    assert "| legacy: python/test_a.py | 3 | 1 | 2 | 0 | 0 | 1 | 33.3% |" in text
    assert "| direct: python/direct/test_b.py | 1 | 1 | 0 | 0 | 1 | 0 | 100.0% |" in text
    assert "| 2 | `DefinitionError: TN has rank N` | legacy: python/test_a.py::test_2 |" in text
    assert "| **all** | 4 | 2 | 2 | 0 | 1 | 1 | 50.0% |" in text


def test_long_reason_lists_are_cut_with_a_count_of_the_rest(results):
    recs, _ = load_records([results])
    recs[("legacy", "python/test_a.py::test_3")]["reason"] = "ValueError: other"
    text, _ = build_report(recs, top=1)
    assert "| 1 | (1 other reasons) |  |" in text


def test_main_writes_the_table_from_earlier_results(results, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", tmp_path / "out")
    assert main(["--from-jsonl", str(results)]) == 0
    (written,) = (tmp_path / "out").iterdir()
    assert written.name.startswith("nvfuser-suite-cpu-")
    body = written.read_text()
    assert "Device: cpu (" in body and "2 of 4 in-scope tests pass (50.0%)" in body
    assert "fusecut commit abc123" in body


def test_staging_refuses_the_project_tree(tmp_path):
    with pytest.raises(SystemExit, match="outside the project tree"):
        nvfuser_suite.stage(nvfuser_suite.ROOT / "staged", "/nonexistent/mirror")
    with pytest.raises(SystemExit, match="NVF_MIRROR"):
        nvfuser_suite.stage(tmp_path / "stage", None)
