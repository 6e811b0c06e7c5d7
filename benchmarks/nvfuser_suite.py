"""nvFuser's own Python frontend test suite, run against fusecut (issue 31).

    python -m benchmarks.nvfuser_suite [--cpu] [--select FILES] [--out RESULTS.jsonl]
                                       [--stage DIR] [--workers N] [--timeout S]
                                       [--helpers strict|core] [--from-jsonl A.jsonl ...]

The suite lives outside this tree (``../shared/tools/nvf_suite``: nvFuser's tests are nvFuser's
code). Its ``stage.sh`` copies the pinned test files, a shim serving fusecut as ``nvfuser`` and
``nvfuser_direct``, and a pytest harness into a staging folder (``--stage``, default
``$NVF_SUITE_STAGE`` or ``~/.cache/fusecut/nvf_suite``; staged once, from the bare clone of
NVIDIA/Fuser in ``$NVF_MIRROR``). Its ``run.sh`` runs the tests with this checkout's fusecut and
writes one JSON line per test.

This script runs it (``--cpu``: device "cuda" mapped to the CPU, for machines without a GPU) and
writes the table, per file and per failure reason, to ``benchmarks/results/`` with the device and
the date. ``--from-jsonl`` builds the table from earlier runs' results instead (later records of
the same test win, so runs split over several calls merge).

Counts, as the harness defines them: ``pass_rate = passed / (passed + failed + error)``, over the
tests in scope (nvFuser's CUTLASS kernels, multi-GPU tests and packaging tests are out of scope
and counted apart).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.common import DEVPATH, cpu_name, markdown_table, write_result

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT.parent / "shared" / "tools" / "nvf_suite"
DEFAULT_STAGE = Path(os.environ.get("NVF_SUITE_STAGE")
                     or Path.home() / ".cache" / "fusecut" / "nvf_suite")
RAN = ("passed", "failed", "error")


# ---- reading the results ------------------------------------------------------------------------


def normalize(reason: str) -> str:
    """One group per failure cause: numbers, addresses and tensor names vary between tests (the
    harness's summarize.py groups the same way)."""
    r = reason.strip().splitlines()[0] if reason.strip() else ""
    r = re.sub(r"0x[0-9a-fA-F]+", "ADDR", r)
    r = re.sub(r"\b([TSV])\d+\b", r"\1N", r)
    r = re.sub(r"(?<![A-Za-z_])\d+(\.\d+)?(e[-+]?\d+)?", "N", r)
    return r[:160]


def outcome(rec: dict) -> str:
    o = rec.get("outcome", "error")
    if o == "out_of_scope":
        return "out_of_scope"
    return o if o in ("passed", "failed", "skipped", "xfailed", "xpassed",
                      "skipped_harness") else "error"


def load_records(paths: list[str | Path]) -> tuple[dict[tuple[str, str], dict], dict]:
    """Per (suite, test id) its last record, and the run's preflight line (device, commit)."""
    recs: dict[tuple[str, str], dict] = {}
    info: dict = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(rec, dict):
                continue
            if rec.get("run"):
                info = rec
            elif "nodeid" in rec and not rec.get("summary") and not rec.get("session"):
                recs[(rec.get("suite", "?"), rec["nodeid"])] = rec
    return recs, info


@dataclass
class Tally:
    counts: Counter = field(default_factory=Counter)

    def add(self, rec: dict) -> None:
        self.counts[outcome(rec)] += 1

    @property
    def ran(self) -> int:
        return sum(self.counts[k] for k in RAN)

    @property
    def passed(self) -> int:
        return self.counts["passed"]

    def rate(self) -> str:
        return f"{100 * self.passed / self.ran:.1f}%" if self.ran else "-"

    def row(self, name: str) -> list[str]:
        c = self.counts
        return [name, str(self.ran), str(c["passed"]), str(c["failed"]), str(c["error"]),
                str(c["skipped"] + c["xfailed"] + c["xpassed"]), str(c["out_of_scope"]),
                self.rate()]


HEADERS = ["", "in scope (ran)", "passed", "failed", "error", "skipped/xfail", "out of scope",
           "pass rate"]


def build_report(recs: dict[tuple[str, str], dict], top: int | None = None
                 ) -> tuple[str, dict]:
    """The markdown tables (per suite, per file, per failure reason: the ``top`` most common,
    every one when None) and the totals."""
    total, suites, files = Tally(), defaultdict(Tally), defaultdict(Tally)
    reasons: Counter = Counter()
    examples: dict[str, str] = {}
    for (suite, nodeid), rec in sorted(recs.items()):
        total.add(rec)
        suites[suite].add(rec)
        files[f"{suite}: {rec.get('file') or nodeid.split('::')[0]}"].add(rec)
        if outcome(rec) in ("failed", "error"):
            key = normalize(rec.get("reason", "")) or "(no message)"
            reasons[key] += 1
            examples.setdefault(key, f"{suite}: {nodeid}")
    suite_rows = [t.row(s) for s, t in sorted(suites.items())] + [total.row("**all**")]
    file_rows = [t.row(f) for f, t in sorted(files.items())]
    failing = sum(reasons.values())
    listed = reasons.most_common(top)
    reason_rows = [[str(n), f"`{_cell(r)}`", _cell(examples[r])] for r, n in listed]
    rest = failing - sum(n for _, n in listed)
    if rest:
        reason_rows.append([str(rest), f"({len(reasons) - len(listed)} other reasons)", ""])
    text = "\n\n".join([
        "## Per suite\n\n" + markdown_table(HEADERS, suite_rows),
        "## Per file\n\n" + markdown_table(HEADERS, file_rows),
        f"## Failures by reason ({failing} failed or errored, {len(reasons)} reasons)\n\n"
        + markdown_table(["tests", "reason", "example"], reason_rows),
    ])
    totals = {"ran": total.ran, "passed": total.passed, "pass_rate": total.rate(),
              "out_of_scope": total.counts["out_of_scope"], "reasons": len(reasons)}
    return text, totals


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'").replace("\n", " ")


# ---- running the suite ------------------------------------------------------------------------


def stage(dest: Path, mirror: str | None) -> None:
    """Stage the suite into ``dest`` (once) with the shared tool's stage.sh."""
    if (dest / "run.sh").is_file():
        return
    # the arguments first, then what the machine has: a wrong request is named as such anywhere
    if dest.resolve().is_relative_to(ROOT):
        raise SystemExit(f"stage outside the project tree: {dest} is inside {ROOT}")
    if not mirror:
        raise SystemExit(f"{dest} is not staged; set NVF_MIRROR (or --mirror) to a bare git "
                         f"clone of NVIDIA/Fuser to stage it")
    if not (TOOL / "stage.sh").is_file():
        raise SystemExit(f"no nvf_suite tool at {TOOL}")
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["bash", str(TOOL / "stage.sh"), str(dest)], check=True,
                   env={**os.environ, "NVF_MIRROR": mirror, "PYTHON": sys.executable})


def run_suite(dest: Path, out: Path, cpu: bool, select: list[str], workers: int, timeout: int,
              helpers: str, budget: int | None) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "FUSECUT_ROOT": str(ROOT),
           "PYTHONPATH": os.pathsep.join([str(DEVPATH), os.environ.get("PYTHONPATH", "")]),
           "NVF_SUITE_CPU": "1" if cpu else "0", "NVF_SUITE_HELPERS": helpers,
           "NVF_SUITE_WORKERS": str(workers), "NVF_SUITE_TIMEOUT": str(timeout)}
    if select:
        env["NVF_SUITE_SELECT"] = " ".join(select)
    if budget:
        env["NVF_SUITE_BUDGET"] = str(budget)
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["bash", str(dest / "run.sh"), str(dest), str(out)], env=env, check=False)


def device_name(info: dict, cpu: bool) -> str:
    if info.get("gpu") and not cpu:
        return info["gpu"]
    return f"cpu ({cpu_name()})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="map device cuda to the CPU")
    ap.add_argument("--select", nargs="*", default=[],
                    help="test files under tests/<suite>/, e.g. python/test_pointwise.py")
    ap.add_argument("--out", type=Path, help="results JSONL (default: a temporary file)")
    ap.add_argument("--stage", type=Path, default=DEFAULT_STAGE, help="staged suite folder")
    ap.add_argument("--mirror", default=os.environ.get("NVF_MIRROR"),
                    help="bare clone of NVIDIA/Fuser, to stage from")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--timeout", type=int, default=120, help="seconds per test")
    ap.add_argument("--budget", type=int, help="seconds per suite, then the run is cut short")
    ap.add_argument("--helpers", choices=("strict", "core"), default="strict")
    ap.add_argument("--from-jsonl", nargs="+", type=Path,
                    help="build the table from these results instead of running")
    ap.add_argument("--top", type=int, default=0,
                    help="failure reasons listed (default 0: every one, as the table must hold "
                         "every remaining failure)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    a = ap.parse_args(argv)

    if a.from_jsonl:
        paths = list(a.from_jsonl)
    else:
        stage(a.stage, a.mirror)
        out = a.out or Path(tempfile.mkdtemp(prefix="nvf_suite-")) / "results.jsonl"
        run_suite(a.stage, out, a.cpu, a.select, a.workers, a.timeout, a.helpers, a.budget)
        paths = [out]
        print(f"results: {out}")
    recs, info = load_records(paths)
    if not recs:
        print("no test records", file=sys.stderr)
        return 1
    cpu = a.cpu or info.get("cuda") is False
    text, totals = build_report(recs, a.top or None)
    device = device_name(info, cpu)
    mode = "CPU mode (cuda mapped to the CPU)" if cpu else "GPU"
    head = (f"{totals['passed']} of {totals['ran']} in-scope tests pass ({totals['pass_rate']}), "
            f"helpers {a.helpers}, {mode}; {totals['out_of_scope']} out of scope.\n\n"
            f"fusecut commit {info.get('fusecut_commit') or '?'}, torch {info.get('torch', '?')}"
            + (f", selection: {' '.join(a.select)}" if a.select else "") + "\n\n")
    print(head + text)
    if not a.no_write:
        name = "nvfuser-suite" + ("-cpu" if cpu and info.get("gpu") else "")
        path = write_result(name, device, "nvFuser's frontend test suite against fusecut",
                            head + text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
