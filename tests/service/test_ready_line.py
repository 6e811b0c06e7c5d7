"""``fusecut serve`` says when it is ready, and where to look (issue 45, new-user item 9:
"Application startup complete" came 3-19 s before /readyz said ready, and no line said when
it did, or pointed to /docs and /dashboard)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx

from benchmarks.common import source_pythonpath
from tests.server import ROOT, free_port


def test_serve_logs_one_line_once_readyz_says_ready(tmp_path):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=source_pythonpath())
    log = tmp_path / "serve.log"
    proc = subprocess.Popen([sys.executable, "-m", "fusecut.cli", "serve", "--port", str(port),
                             "--db", str(tmp_path / "plans.sqlite")], env=env, cwd=ROOT,
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while "is ready" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10)
        assert ready.status_code == 200 and ready.json()["status"] == "ready", ready.text
        text = log.read_text()
        lines = [line for line in text.splitlines() if "is ready" in line]
        assert len(lines) == 1 and "/docs" in lines[0] and "/dashboard" in lines[0], text
        assert text.index("Application startup complete") < text.index("is ready"), text
    finally:
        proc.terminate()
        proc.wait(30)
