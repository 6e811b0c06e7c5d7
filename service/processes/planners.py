"""The planner processes: CPU work on untrusted input (parsing, planning, serializing, rendering)
runs here, never on the service's event loop, and a job can be cancelled.

Each planner is a plain subprocess (``service.processes.children``) that runs one job at a time: the
service sends ``(fn, args)``, the planner answers ``("done", result)`` or ``("error",
traceback)``, and before that, once a planning job knows its time limit, ``("deadline",
seconds)``. A job whose client went away, or that runs past its deadline (the time limit it
announced plus ``Settings.plan_grace_s``; before it announces one, the longest limit allowed),
is cancelled: its planner is killed and a fresh one takes its place, so a runaway solver
never keeps a core after its client has given up.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from subprocess import Popen
from typing import Any

from starlette.concurrency import run_in_threadpool

from fusecut.service.processes.children import become_child, reap, start_child

log = logging.getLogger("fusecut.service")
CHECK_S = 0.25  # how often a waiting job looks at its client and its deadline


class PlannerCrashed(RuntimeError):
    """The planner process died (out of memory?) while running the job."""


class PlannerFailed(RuntimeError):
    """The job raised an unexpected error (a fusecut bug); the traceback went to the log."""


class JobCancelled(RuntimeError):
    """The job was cancelled: its client went away, or it ran past its deadline."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason  # "disconnected" or "deadline"


@dataclass
class _Planner:
    proc: Popen
    conn: Connection


class PlannerPool:
    """Planner processes, started as jobs need them and kept for the next; the caller bounds
    how many jobs run at once."""

    def __init__(self, start_timeout_s: float = 120.0):
        self.start_timeout_s = start_timeout_s
        self._idle: list[_Planner] = []
        self._all: set[int] = set()  # pids of the planners alive
        self._lock = threading.Lock()  # _idle and _all: spares are started from threads

    @property
    def pids(self) -> list[int]:
        self._prune()
        with self._lock:
            return sorted(self._all)

    def _prune(self) -> int:
        """Reap the idle planners that died (killed, out of memory) and start one in place of
        each: a dead one must not be handed a job (each was a 503 "planner crashed", and it
        stayed a zombie). Returns how many were dead."""
        with self._lock:
            dead = [p for p in self._idle if p.proc.poll() is not None]  # poll() reaps
            self._idle = [p for p in self._idle if p not in dead]
            for planner in dead:
                self._all.discard(planner.proc.pid)
        for planner in dead:
            log.warning("planner process %d died idle (exit code %s); replaced",
                        planner.proc.pid, planner.proc.returncode)
            planner.conn.close()
            self.start()
        return len(dead)

    def start(self) -> None:
        """Start one planner in the background: the first job need not wait for its imports."""
        threading.Thread(target=self._spare, daemon=True, name="fusecut-planner-start").start()

    def stop(self) -> None:
        """Stop the idle planners (each exits when its connection closes); a busy one is
        killed with its job when the service's process ends, as it watches for that."""
        with self._lock:
            idle, self._idle = self._idle, []
        for planner in idle:
            reap(planner.proc, planner.conn, grace_s=2.0)
            self._forget(planner)

    async def run(self, fn: Callable[..., Any], *args: Any, deadline_s: float, grace_s: float,
                  cancelled: Callable[[], Awaitable[bool]] | None = None) -> Any:
        """``fn(*args)`` in a planner: its result, or JobCancelled, PlannerCrashed or
        PlannerFailed. The job is cancelled ``deadline_s`` from now, or ``grace_s`` past the
        time limit it announces, or when ``cancelled()`` says its client went away."""
        planner = await self._handed(fn, args)
        finished = False
        try:
            deadline = time.monotonic() + deadline_s
            while True:
                if await run_in_threadpool(planner.conn.poll, CHECK_S):
                    kind, value = await run_in_threadpool(planner.conn.recv)
                    if kind == "deadline":
                        deadline = time.monotonic() + value + grace_s
                        continue
                    finished = True
                    if kind == "error":
                        log.error("a planner job failed:\n%s", value)
                        raise PlannerFailed(value.strip().splitlines()[-1])
                    return value
                if time.monotonic() > deadline:
                    raise JobCancelled("deadline")
                if cancelled is not None and await cancelled():
                    raise JobCancelled("disconnected")
        except (EOFError, OSError):
            raise PlannerCrashed(f"the planner process died (exit code "
                                 f"{planner.proc.poll()})") from None
        finally:
            if finished:
                with self._lock:
                    self._idle.append(planner)
            else:  # cancelled, crashed, or this task was: the planner's state is unknown
                planner.proc.kill()
                self._forget(planner)
                threading.Thread(target=reap, args=(planner.proc, planner.conn), daemon=True,
                                 name="fusecut-planner-reap").start()
                self.start()  # a replacement, ready for the next job

    async def _handed(self, fn: Callable[..., Any], args: tuple) -> _Planner:
        """A planner that took the job ``(fn, args)``: one that died idle since it was looked
        at refuses it (a broken pipe) and the next one takes it."""
        for _ in range(3):
            planner = await self._take()
            try:
                await run_in_threadpool(planner.conn.send, (fn, args))  # pickling: a thread
                return planner
            except (EOFError, OSError):
                self._forget(planner)
                threading.Thread(target=reap, args=(planner.proc, planner.conn), daemon=True,
                                 name="fusecut-planner-reap").start()
            except BaseException:  # the job did not pickle (or this task was cancelled)
                planner.proc.kill()  # (part of it may have been sent)
                self._forget(planner)
                threading.Thread(target=reap, args=(planner.proc, planner.conn), daemon=True,
                                 name="fusecut-planner-reap").start()
                self.start()
                raise
        raise PlannerCrashed("planner processes die as they start (out of memory?)")

    async def _take(self) -> _Planner:
        """An idle planner that runs (the dead are reaped and replaced), else a new one."""
        self._prune()
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return await run_in_threadpool(self._spawn)

    def _spare(self) -> None:
        try:
            planner = self._spawn()
        except PlannerCrashed as e:
            log.error("could not start a planner process: %s", e)
            return
        with self._lock:
            self._idle.append(planner)

    def _spawn(self) -> _Planner:
        proc, conn = start_child("fusecut.service.processes.planners")
        if not conn.poll(self.start_timeout_s):
            reap(proc, conn)
            raise PlannerCrashed("a planner process did not start")
        try:
            conn.recv()  # its hello: imports done
        except (EOFError, OSError):
            reap(proc, conn)
            raise PlannerCrashed(f"a planner process exited with code {proc.wait()}") from None
        planner = _Planner(proc, conn)
        with self._lock:
            self._all.add(proc.pid)
        return planner

    def _forget(self, planner: _Planner) -> None:
        with self._lock:
            self._all.discard(planner.proc.pid)


# ---- in the planner process ---------------------------------------------------------------------

_job: Connection | None = None  # the connection of the job running, in a planner process


def announce_time_limit(seconds: float) -> None:
    """Tell the service this job's time limit (its deadline is this plus the grace). Does
    nothing outside a planner process."""
    if _job is not None:
        _job.send(("deadline", seconds))


def _main(conn: Connection) -> None:
    global _job
    conn.send(("ready", os.getpid()))
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):
            return
        except Exception:  # a job this process cannot decode: say so, keep serving
            conn.send(("error", traceback.format_exc()))
            continue
        _job = conn
        try:
            answer = ("done", fn(*args))
        except Exception:
            answer = ("error", traceback.format_exc())
        finally:
            _job = None
        try:
            conn.send(answer)
        except (EOFError, OSError):
            return
        except Exception:  # a result that does not pickle: a bug, reported as one
            conn.send(("error", traceback.format_exc()))


if __name__ == "__main__":
    # by its module's name: jobs find announce_time_limit there, not in __main__
    from fusecut.service.processes.planners import _main as main

    main(become_child(sys.argv))
