"""The real nvFuser as a benchmark peer: importing it, defining a corpus case through it, and a
first call (nvFuser compiles there) with a time budget.

On the GPU box, ``source .nvf/setup.sh`` (see ../shared/tools/nvfuser-anchor.sh) makes
``nvfuser_direct`` and ``nvfuser_anchor`` importable; anywhere else ``load_nvfuser`` answers None
with the reason, and the benchmark leaves the nvFuser columns out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def describe(exc: BaseException, limit: int = 100) -> str:
    """``Type: first line of the message``, short enough for a table cell."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclass
class NvFuser:
    """nvfuser_direct, reached through the anchor that runs repro files with it."""

    anchor: Any
    version: str

    def define(self, path: Path) -> tuple[Any, list[Any]]:
        """(nvFuser FusionDefinition, the repro's input tensors) of a repro file."""
        return self.anchor.load(str(path))


def load_nvfuser() -> tuple[NvFuser | None, str]:
    """The nvFuser peer, or None and why it is unavailable."""
    try:
        import nvfuser_anchor
        import nvfuser_direct
    except Exception as exc:  # ImportError, or a shared library that fails to load (OSError)
        return None, (f"nvfuser_direct does not import here ({describe(exc)}); on the GPU box "
                      f"run `source .nvf/setup.sh` first")
    return NvFuser(nvfuser_anchor, str(getattr(nvfuser_direct, "__version__", "unknown"))), ""


@dataclass
class FirstCall:
    ok: bool
    seconds: float
    error: str = ""
    finished: bool = True  # False: the call is still running in ``thread``
    thread: threading.Thread | None = None


def first_call(fn: Callable[[], object], budget_s: float | None) -> FirstCall:
    """Run ``fn`` once (a first call compiles), waiting at most ``budget_s`` seconds for it.

    The call runs in a daemon thread so that the wait can end; a call still running after the
    budget is left behind (``finished`` False) and the caller must not use that system again,
    since it keeps the CPU and, when it ends, the GPU busy. (A compiler that holds the GIL
    throughout can only be seen to overrun once it returns: then ``ok`` is True and ``seconds``
    says how long it took.)"""
    box: dict[str, BaseException] = {}

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # reported to the caller, never raised in the thread
            box["error"] = exc

    start = time.perf_counter()
    if budget_s is None:
        target()
    else:
        thread = threading.Thread(target=target, name="first-call", daemon=True)
        thread.start()
        thread.join(budget_s)
        if thread.is_alive():
            return FirstCall(False, time.perf_counter() - start,
                             f"first call still running after {budget_s:.0f} s", finished=False,
                             thread=thread)
    elapsed = time.perf_counter() - start
    if "error" in box:
        return FirstCall(False, elapsed, describe(box["error"]))
    return FirstCall(True, elapsed)
