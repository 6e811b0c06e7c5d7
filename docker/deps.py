"""Print fusecut's dependencies from pyproject.toml, one a line, leaving out those named and
adding those of the extras named.

The CPU image installs fusecut without cuda-python[all]: executions there run on the torch
reference, which needs no NVRTC, and the extra brings about 430 MB of nvidia/* wheels (fusecut
imports cuda only for GPU work).

    python docker/deps.py --without cuda-python --extra postgres > requirements.txt
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path


def dependencies(pyproject: Path, without: set[str], extras: list[str] = ()) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    deps = project["dependencies"] + [d for e in extras
                                      for d in project["optional-dependencies"][e]]
    return [d for d in deps if re.split(r"[\s\[<>=!~;]", d, maxsplit=1)[0] not in without]


if __name__ == "__main__":
    args = sys.argv[1:]
    without = {args[i + 1] for i, a in enumerate(args) if a == "--without"}
    extras = [args[i + 1] for i, a in enumerate(args) if a == "--extra"]
    root = Path(__file__).resolve().parent.parent
    print("\n".join(dependencies(root / "pyproject.toml", without, extras)))
