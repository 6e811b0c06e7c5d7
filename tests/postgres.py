"""A real PostgreSQL for tests: Debian's ``postgresql`` package, a cluster made by initdb in a
temporary directory, served by pg_ctl on a free loopback port.

initdb refuses to run as root: as root (CI), the cluster belongs to the package's ``postgres``
user (or ``nobody``) and the tools run through ``runuser``. CI installs the package (.ci/run);
there a missing binary fails the test, elsewhere it skips, saying why.
"""

from __future__ import annotations

import glob
import os
import pwd
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tests.helpers import require_installed
from tests.server import free_port


def binaries() -> Path | None:
    """The directory of initdb and pg_ctl: Debian's newest, or whatever is on PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def require_binaries() -> Path:
    return require_installed(binaries(), "PostgreSQL", "postgresql")


class Postgres:
    """``start()``, ``stop()`` (a fast shutdown: clients are disconnected) and ``start()``
    again; ``url(database)`` for clients; ``create_database(name)``."""

    def __init__(self, bin_dir: Path):
        self.bin = bin_dir
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="fusecut-pg-"))  # not under root's 0700 dirs
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.user = None
        if os.geteuid() == 0:
            name = "postgres" if _user_exists("postgres") else "nobody"
            self.user = pwd.getpwnam(name)
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--no-sync", "--no-instructions")

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        command = [str(self.bin / tool), *args]
        if self.user is not None:
            command = ["runuser", "-u", self.user.pw_name, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120,
                                cwd=self.root)
        if check and result.returncode != 0:
            raise RuntimeError(f"{tool} failed: {result.stdout[-2000:]}{result.stderr[-2000:]}"
                               f"{self.log.read_text()[-2000:] if self.log.exists() else ''}")
        return result

    def start(self) -> Postgres:
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                   f"-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                   f"-c max_connections=200 -c shared_buffers=32MB")
        self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.log),
                  "-o", options)
        self._watch()
        return self

    def _watch(self) -> None:
        """A watchdog that stops the server and removes its directory once this process is
        gone, however it went (a test run killed by a timeout runs no finalizer)."""
        if getattr(self, "watchdog", None) is not None and self.watchdog.poll() is None:
            return
        stop = [str(self.bin / "pg_ctl"), "stop", "-m", "immediate", "-D", str(self.data)]
        if self.user is not None:
            stop = ["runuser", "-u", self.user.pw_name, "--", *stop]
        script = (f"while kill -0 {os.getpid()} 2>/dev/null; do sleep 1; done; "
                  f"{shlex.join(stop)} >/dev/null 2>&1; rm -rf {shlex.quote(str(self.root))}")
        self.watchdog = subprocess.Popen(["sh", "-c", script], start_new_session=True,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        self._run("pg_ctl", "stop", "-w", "-t", "60", "-m", "fast", "-D", str(self.data),
                  check=False)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def wait_accepting(self, timeout: float = 30) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(self.url(), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
        if getattr(self, "watchdog", None) is not None:
            self.watchdog.kill()
            self.watchdog.wait(5)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False
