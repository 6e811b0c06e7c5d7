"""``tools/device-env.sh``: what a command on the lent GPU machine sources, where fusecut runs
from its source tree with no install. torch.compile finds ``backend="fusecut"`` only through
installed entry points: the script writes them from pyproject.toml into the site it puts on
PYTHONPATH (without them the six GPU tests of the Hugging Face models failed on 2026-11-29)."""

from __future__ import annotations

import ast
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import importlib.metadata as m, fusecut, fusecut.optimizer
print([f"{e.name}={e.value}" for e in m.entry_points(group="torch_dynamo_backends")])
print(fusecut.__file__)
print(fusecut.optimizer.__file__)
"""


def test_sourced_it_gives_fusecut_from_the_source_tree_with_its_entry_points(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()  # none carried: nothing to install
    script = (f'DEVICE_SITE="{tmp_path / "site"}" DEVICE_WHEELS="{wheels}"; '
              f". tools/device-env.sh && cd {tmp_path} && python3 -S -c '{PROBE}'")
    done = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    points, package, optimizer = done.stdout.strip().splitlines()
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    want = [f"{k}={v}" for k, v in declared["torch_dynamo_backends"].items()]
    assert ast.literal_eval(points) == want
    assert Path(package).resolve() == ROOT / "clients" / "__init__.py"
    assert Path(optimizer).resolve() == ROOT / "optimizer" / "__init__.py"
