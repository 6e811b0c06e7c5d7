"""``nvfuser.nvfuser_version.Version`` under fusecut: a release version that compares with
another or with a string (``version() > "0.0.0"``), as nvFuser's does.

nvFuser's Python API exposes it at ``nvfuser.nvfuser_version`` (and
``nvfuser_direct.nvfuser_direct_version``), so programs written against nvFuser that check the
version find it here under the same module name.
"""

from __future__ import annotations

import functools
import re


@functools.total_ordering
class Version:
    """``major.minor.patch`` (a local or pre-release suffix after ``+``/``-``/a letter is kept
    in ``str`` but not compared)."""

    def __init__(self, text: str):
        match = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(text))
        if match is None:
            raise ValueError(f"not a version: {text!r}")
        self.text = str(text).strip()
        self.release = tuple(int(p) for p in match.group(1).split("."))

    def _key(self) -> tuple[int, ...]:
        r = self.release
        return r + (0,) * (3 - len(r)) if len(r) < 3 else r

    @staticmethod
    def _other(other: object) -> Version | None:
        if isinstance(other, Version):
            return other
        if isinstance(other, str):
            return Version(other)
        return None

    def __eq__(self, other: object) -> bool:
        o = self._other(other)
        return NotImplemented if o is None else self._key() == o._key()

    def __lt__(self, other: object) -> bool:
        o = self._other(other)
        return NotImplemented if o is None else self._key() < o._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Version({self.text!r})"


def version() -> Version:
    """fusecut's version, as a Version."""
    from fusecut.version import __version__

    return Version(__version__)
