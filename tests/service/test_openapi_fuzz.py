"""schemathesis against the running service's OpenAPI document (issue 12): every check on, about
100 s of generated requests. Fails on any 5xx, any response that does not match the document
(status, media type, schema, headers) and any body that is not what it claims to be."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.server import Server

CONFIG = Path(__file__).parents[1] / "fuzz" / "schemathesis.toml"
BUDGET_S = 100


def test_schemathesis_finds_nothing(tmp_path):
    cli = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or \
        shutil.which("schemathesis")
    assert cli, "schemathesis is a dev dependency: pip install -e '.[dev]'"
    with Server(tmp_path / "plans.sqlite", default_time_limit_s=1) as server:
        run = subprocess.run(
            [cli, "--config-file", str(CONFIG), "run", f"{server.url}/openapi.json",
             "--checks", "all", "--max-time", str(BUDGET_S), "--seed", "20261122",
             "--request-timeout", "30", "--generation-database", "none", "--no-color"],
            capture_output=True, text=True, timeout=BUDGET_S + 60, cwd=tmp_path)
        assert server.proc.poll() is None, "the service died under the fuzzer"
    assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "failed" not in run.stdout.split("SUMMARY")[-1]
