"""Shared bits of the benchmark scripts: where results go, and how a table is written."""

from __future__ import annotations

import datetime
import os
import platform
import re
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
CORPUS = Path(__file__).parent.parent / "tests" / "corpus"
ROOT = Path(__file__).resolve().parent.parent
# A source tree's fusecut without an install: a folder holding only a link named fusecut to
# clients/ (the package's root finds the other rooms itself; see clients/__init__.py).
DEVPATH = ROOT / "tools" / "devpath"


def source_pythonpath(*after: str) -> str:
    """PYTHONPATH for a child process that runs this source tree without an install: the
    repository (benchmarks.*, tests.*) and the dev path (fusecut), then ``after``."""
    return os.pathsep.join(p for p in (str(ROOT), str(DEVPATH), *after) if p)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def result_path(name: str, device: str) -> Path:
    """A file of its own for one run: ``NAME-DEVICE-DATE.md``, then ``-2``, ``-3`` for later runs
    the same day on the same device, so that a run never overwrites an earlier run's figures."""
    date = datetime.date.today().isoformat()
    slug = re.sub(r"[^A-Za-z0-9]+", "-", device).strip("-").lower()[:40]
    path = RESULTS / f"{name}-{slug}-{date}.md"
    n = 2
    while path.exists():
        path = RESULTS / f"{name}-{slug}-{date}-{n}.md"
        n += 1
    return path


class RunResults:
    """One run's results file. Its first write picks a path of its own (``result_path``); later
    writes, the partial tables of a run that saves as it goes, replace that file and no other."""

    def __init__(self, name: str, device: str, title: str):
        self.name, self.device, self.title = name, device, title
        self.path: Path | None = None

    def write(self, table: str, notes: str = "") -> Path:
        RESULTS.mkdir(parents=True, exist_ok=True)
        self.path = self.path or result_path(self.name, self.device)
        date = datetime.date.today().isoformat()
        self.path.write_text(f"# {self.title}\n\nDevice: {self.device}\nDate: {date}\n\n{table}\n\n"
                             f"{notes}".rstrip() + "\n")
        return self.path


def write_result(name: str, device: str, title: str, table: str, notes: str = "") -> Path:
    """A run's table, written once."""
    return RunResults(name, device, title).write(table, notes)


def wait_ready(url: str, proc=None, timeout: float = 120.0) -> None:
    """Wait until the service at ``url`` answers /readyz with 200 (SystemExit if it does not, or
    if ``proc`` exits first)."""
    import time

    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the server at {url} exited")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    if proc is not None:
        proc.kill()
    raise SystemExit(f"the server at {url} did not start")
