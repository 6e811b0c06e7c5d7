"""Helper processes of the service: started alike, and dying with it.

The service runs its GPU worker and its planner processes as plain subprocesses (``python -m
<module> <fd> <parent pid>``) talking over a socket pair: no ``multiprocessing`` start method,
so no re-import of the caller's ``__main__``, no semaphores and no resource tracker to leak.

If the service is killed outright (SIGKILL, the OOM killer), nothing runs to stop its helpers:
they lived on under PID 1, holding their memory. A helper calls ``become_child`` first thing and
exits as soon as the process that started it is gone, even in the middle of a job. It watches
the parent's pid from a thread rather than using Linux's ``PR_SET_PDEATHSIG``, which follows the
*thread* that started the child: the service starts helpers from short-lived threads, whose exit
would kill a healthy helper.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

POLL_S = 0.2  # how often a helper looks for its parent


def child_env() -> dict[str, str]:
    """A helper imports fusecut from where this process found it: an installed package's
    folder above (site-packages), or a source checkout's dev path (tools/devpath, holding only
    a link named fusecut to clients/), never a package's own folder, whose modules (e.g.
    service/http.py) would shadow the standard library's."""
    env = dict(os.environ)
    package = Path(sys.modules["fusecut"].__file__).resolve().parent  # clients/ in a checkout
    root = package.parent
    devpath = root / "tools" / "devpath"
    where = str(devpath if package.name != "fusecut" and devpath.is_dir() else root)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (where, env.get("PYTHONPATH")) if p)
    return env


def start_child(module: str, env: dict[str, str] | None = None
                ) -> tuple[subprocess.Popen, Connection]:
    """``python -m module <fd> <our pid>``, and our end of its socket pair; ``env`` adds to
    its environment (CUDA_VISIBLE_DEVICES pins a worker to a GPU)."""
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen([sys.executable, "-m", module, str(theirs.fileno()),
                             str(os.getpid())], pass_fds=[theirs.fileno()],
                            env={**child_env(), **(env or {})})
    theirs.close()
    return proc, Connection(ours.detach())


def become_child(argv: list[str]) -> Connection:
    """In a helper started by ``start_child``: exit when the parent does, leave Ctrl-C to the
    parent (which stops its helpers in order), and return the connection to the parent."""
    fd, parent_pid = int(argv[1]), int(argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent_pid)
    return Connection(fd)


def die_with_parent(parent_pid: int) -> None:
    """Exit (status 1, at once, without cleanup) when ``parent_pid`` is no longer the parent."""
    if os.getppid() != parent_pid:  # it is gone already
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(POLL_S)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="fusecut-lifeline").start()


def reap(proc: subprocess.Popen, conn: Connection | None, grace_s: float = 0.0) -> None:
    """Stop a helper: close its connection (it exits on end of file), wait ``grace_s`` for it,
    then kill it; its exit status is collected either way."""
    if conn is not None:
        conn.close()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
