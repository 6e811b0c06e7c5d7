"""Watching a running service from a test: its state (/readyz) and its processes (/proc), how
fast it answers /healthz while a request runs, and waiting for a condition with a bound.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx


def readyz(url: str) -> dict:
    return httpx.get(f"{url}/readyz", timeout=30).json()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def workers_up(url: str) -> dict:
    """/readyz once every worker runs (the service is ready as soon as one does)."""
    wait_for(lambda: all(w["up"] for w in readyz(url)["workers"]), 60, "the workers are down")
    return readyz(url)


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_until_executing(url: str) -> None:
    """Until a worker has spent 0.3 s of CPU since the call: an execution is running."""
    pids = [w["pid"] for w in workers_up(url)["workers"]]
    before = {pid: cpu_seconds(pid) for pid in pids}
    wait_for(lambda: any(cpu_seconds(p) > before[p] + 0.3 for p in pids), 60,
             "no worker started the execution")


def in_thread(call) -> tuple[threading.Thread, dict]:
    answer: dict = {}
    thread = threading.Thread(target=lambda: answer.update(r=call()))
    thread.start()
    return thread, answer


def healthz_latencies_during(url: str, request) -> tuple[list[float], Any]:
    """Poll /healthz every 20 ms from another process (tests/healthz_poller.py) while
    ``request()`` runs here: (the latencies, what ``request()`` returned). Neither this process's
    sending (100 MB held its GIL for 0.35 s) nor its collector is in the latencies."""
    poller = subprocess.Popen([sys.executable, str(Path(__file__).parents[1] / "healthz_poller.py"),
                               url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert poller.stdout.readline() == "ready\n", poller.stderr.read()
        result = request()
    finally:
        out, err = poller.communicate("stop\n", timeout=60)
    assert poller.returncode == 0, err
    return json.loads(out), result
