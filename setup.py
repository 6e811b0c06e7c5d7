"""The package list of the card's rooms, and ``fusecut-thunder.pth`` at the top of the wheel,
where site-packages runs it at start-up (see ``fusecut.thunder.compat``); everything else is in
pyproject.toml.

The repository's top-level rooms install as one package, ``fusecut``: ``clients/`` is its root
(``fusecut``, ``fusecut.thunder``, ...), and ``optimizer/``, ``codegen/``, ``runtime/`` and
``service/`` are ``fusecut.optimizer`` and so on (pyproject.toml's package-dir). Nothing else is
installed at the top level: a user's ``import runtime`` never means us."""

import os
import tomllib

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py

with open("pyproject.toml", "rb") as f:
    ROOMS = tomllib.load(f)["tool"]["setuptools"]["package-dir"]  # package: its room's folder
PTH = "fusecut-thunder.pth"
SOURCE = os.path.join("clients", "thunder", PTH)


def packages() -> list[str]:
    """Every package of each room, named as installed (``optimizer/ir``: fusecut.optimizer.ir);
    folders without an ``__init__.py`` too (``runtime/native``: its .cpp is package data)."""
    return [f"{name}.{sub}" if sub else name for name, folder in ROOMS.items()
            for sub in ["", *find_namespace_packages(folder, exclude=["*__pycache__"])]]


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(SOURCE, os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


setup(packages=packages(), cmdclass={"build_py": BuildPyWithPth})
