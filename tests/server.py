"""A real fusecut service for tests: ``fusecut serve`` in a subprocess on a free loopback port
(``Server``), or an app the test made (``create_app`` with its own settings, worker or routes)
served by uvicorn in a thread (``ThreadServer``)."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import uvicorn

from benchmarks.common import source_pythonpath

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """Start with ``start()``; ``url`` is its base URL; ``stop()`` shuts it down gracefully."""

    def __init__(self, db_path: Path, workers: int = 1, tls: tuple[Path, Path] | None = None,
                 wrap: list[str] | None = None, **settings: object):
        self.db_path = db_path
        self.workers = workers
        self.tls = tls  # (certificate, key): serve HTTPS
        self.wrap = wrap or []  # a command the server runs under (unshare, taskset)
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = source_pythonpath(self.env.get("PYTHONPATH", ""))
        self.env["FUSECUT_DEFAULT_TIME_LIMIT_S"] = "2"
        for key, value in settings.items():
            self.env[f"FUSECUT_{key.upper()}"] = str(value)
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.log = db_path.parent / f"server-{id(self)}.log"

    def start(self, timeout: float = 90.0) -> Server:
        return self.launch().wait_ready(timeout)

    def launch(self) -> Server:
        """Start the process without waiting for it (several start at once)."""
        port = free_port()
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"
        command = [*self.wrap, sys.executable, "-m", "fusecut.cli", "serve", "--port", str(port),
                   "--db", str(self.db_path), "--workers", str(self.workers),
                   "--log-level", "warning"]
        if self.tls:
            command += ["--ssl-certfile", str(self.tls[0]), "--ssl-keyfile", str(self.tls[1])]
        self.proc = subprocess.Popen(command, env=self.env, stdout=open(self.log, "wb"),
                                     stderr=subprocess.STDOUT, cwd=ROOT)
        return self

    def wait_ready(self, timeout: float = 90.0) -> Server:
        verify: bool | ssl.SSLContext = True
        if self.tls:
            verify = ssl.create_default_context(cafile=str(self.tls[0]))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited: {self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2,
                             verify=verify).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the server did not become ready: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ThreadServer:
    """uvicorn serving ``app`` in a thread on a free loopback port."""

    def __init__(self, app):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(20)
