"""Where the fusecut package's modules live in this repository: the card's rooms at the top
level (clients/ is the package's root, optimizer/ is fusecut.optimizer, ...), mapped into the
one package by pyproject.toml's package-dir. For the tests that read the sources."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# package -> its room's folder: {"fusecut": clients/, "fusecut.optimizer": optimizer/, ...}
ROOMS = {name: ROOT / folder for name, folder in tomllib.loads(
    (ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].items()}


def module_name(path: Path) -> str:
    """The module a source file is: optimizer/ir/builder.py is fusecut.optimizer.ir.builder."""
    path = path.resolve()
    package, room = next((n, r) for n, r in ROOMS.items() if path.is_relative_to(r))
    parts = path.relative_to(room).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join([package, *parts])


def module_path(name: str) -> Path:
    """The source file of a module, e.g. fusecut.service.settings: service/settings.py."""
    package = max((n for n in ROOMS if name == n or name.startswith(f"{n}.")), key=len)
    folder = ROOMS[package].joinpath(*name[len(package):].split(".")[1:])
    return folder / "__init__.py" if folder.is_dir() else folder.with_suffix(".py")


def source_files() -> list[Path]:
    """Every Python file of the package, room by room."""
    return [p for room in ROOMS.values() for p in sorted(room.rglob("*.py"))]


def modules() -> dict[str, Path]:
    """Every module of the package by name."""
    return {module_name(p): p for p in source_files()}
