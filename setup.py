"""Ships ``fusecut-thunder.pth`` at the top of the wheel, where site-packages runs it at start-up
(see ``fusecut.thunder.compat``); everything else is in pyproject.toml."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "fusecut-thunder.pth"
SOURCE = os.path.join("src", "fusecut", "thunder", PTH)


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(SOURCE, os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildPyWithPth})
