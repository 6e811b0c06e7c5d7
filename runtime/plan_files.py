"""Plans on disk: what a second process of the same script gets instead of planning again.

A training script planned every region of its model in its first process; the next run (a
restart, the next epoch's script, a notebook kernel restarted) asks for the same plans. The
engine keeps its plans here as their JSON, one file each, named by a digest of fusecut's
version, the fusion's content id, the input metadata and the options, so a file is only ever
read for exactly the plan it holds (``restore_plan`` checks the fusion id again and rebuilds
the plan without solving: the planner is deterministic, the restored plan is the one it would
make). Compiled kernels already live on disk beside them (``runtime.compile``).

Writes go to a temporary file renamed into place (two processes writing one plan leave one
whole file). A file that cannot be read or written is skipped, said once in the log: plans on
disk are a shortcut, never a reason for a step to fail. They live in the kernel cache's folder
(``FUSECUT_CACHE_DIR``, under ``plans/``), so one setting empties or moves both;
``FUSECUT_PLANS_ON_DISK=false`` turns them off.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import queue
import tempfile
import threading
import time
from pathlib import Path

from fusecut.environment import flag, path
from fusecut.optimizer.errors import FusecutError
from fusecut.optimizer.ir.fusion import Fusion
from fusecut.optimizer.ir.inputs import InputMeta
from fusecut.optimizer.ir.wire import canonical_json, meta_to_json
from fusecut.optimizer.plan.plan import Plan
from fusecut.optimizer.plan.restore import restore_plan
from fusecut.version import __version__

log = logging.getLogger("fusecut.runtime")
_warned: set[str] = set()


def enabled() -> bool:
    return flag("FUSECUT_PLANS_ON_DISK")


def plan_file(fusion_id: str, metas: list[InputMeta], options: str) -> Path:
    """Where the plan of this fusion, metadata and options lives (``options``: the engine's
    canonical options key)."""
    key = canonical_json({"fusecut": __version__, "fusion": fusion_id,
                          "inputs": [meta_to_json(m) for m in metas], "options": options})
    digest = hashlib.sha256(key.encode()).hexdigest()
    return path("FUSECUT_CACHE_DIR") / "plans" / digest[:2] / f"{digest}.json"


def load(where: Path, fusion: Fusion, metas: list[InputMeta]) -> Plan | None:
    """The plan in ``where``, rebuilt for ``fusion``; None when there is none (or it cannot be
    read: then it is planned again)."""
    try:
        data = json.loads(where.read_text())
        return restore_plan(fusion, list(metas), data)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, FusecutError) as e:
        _say_once(f"a plan on disk ({where}) was not used: {type(e).__name__}: {e}")
        return None


_pending: queue.Queue = queue.Queue()
_writer: threading.Thread | None = None
_writer_lock = threading.Lock()


def save_later(where: Path, plan: Plan) -> None:
    """Write ``plan`` to ``where`` on a background thread: rendering a plan's JSON costs about
    a fifth of a greedy plan's time, which the step that planned it should not wait for. What is
    still queued at exit is written then (for at most ``EXIT_WAIT_S``)."""
    global _writer
    _pending.put((where, plan))
    with _writer_lock:
        if _writer is None:
            _writer = threading.Thread(target=_write_pending, name="fusecut-plan-files",
                                       daemon=True)
            _writer.start()
            atexit.register(flush, EXIT_WAIT_S)


EXIT_WAIT_S = 10.0


def _write_pending() -> None:
    while True:
        where, plan = _pending.get()
        try:
            save(where, plan)
        finally:
            _pending.task_done()


def flush(timeout: float | None = None) -> None:
    """Wait until every queued plan is written (at most ``timeout`` seconds)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while _pending.unfinished_tasks:
        if deadline is not None and time.monotonic() > deadline:
            return
        time.sleep(0.01)


def save(where: Path, plan: Plan) -> None:
    """Write ``plan``'s JSON to ``where`` (whole or not at all)."""
    temporary = None
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=where.parent, prefix=".plan-", suffix=".json")
        with os.fdopen(fd, "w") as out:
            json.dump(plan.to_json(), out)
        os.replace(temporary, where)
    except OSError as e:
        _say_once(f"plans are not kept on disk in {where.parent}: {e}")
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)


def _say_once(message: str) -> None:
    head = message.split(":")[0]
    if head not in _warned:
        _warned.add(head)
        log.warning("fusecut: %s", message)
