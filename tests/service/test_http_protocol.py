"""The service as an HTTP server: a method a route does not take is a 405 naming those it does
(``Allow``), and connections that send half a request are dropped after the read timeout while
slow but steady clients are served.

From the hostile-input reviews: issue 12 and issue 19 (defect 14).
"""

from __future__ import annotations

import os
import socket
import time

import httpx

from tests.server import Server
from tests.service.probes import wait_for
from tests.service.test_service import assert_problem


def test_unsupported_methods_are_405_with_allow(http):
    for method, route, allowed in (("TRACE", "/v1/plan", "POST"), ("DELETE", "/healthz", "GET"),
                                   ("PUT", "/v1/execute", "POST")):
        response = http.request(method, route)
        assert_problem(response, 405)
        assert allowed in response.headers["allow"], (method, route)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_half_sent_requests_are_dropped(tmp_path):
    with Server(tmp_path / "plans.sqlite", read_timeout_s=1) as server:
        port = int(server.url.rsplit(":", 1)[1])
        baseline = open_fds(server.proc.pid)
        halves = [b"", b"GET /healthz HT", b"POST /v1/plan HTTP/1.1\r\nhost: x\r\n",
                  b"POST /v1/plan HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: 100\r\n\r\n{\"definition\": "]
        sockets = []
        for k in range(200):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(halves[k % len(halves)])
            sockets.append(s)
        with httpx.Client(base_url=server.url) as http:  # others are served meanwhile
            assert http.get("/healthz").status_code == 200
        time.sleep(1.5)  # the read timeout, and a margin for timers on a busy machine
        deadline = time.monotonic() + 10
        for s in sockets:
            s.settimeout(max(deadline - time.monotonic(), 0.01))
            answer = b""
            while chunk := s.recv(4096):  # the server closes the connection: b""
                answer += chunk
            assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:100]
            s.close()
        wait_for(lambda: open_fds(server.proc.pid) <= baseline + 2, 5,
                 "the dropped connections' descriptors stayed open")
        # a slow but steady client is not dropped: 2.5 s, a byte every 0.5 s
        with socket.create_connection(("127.0.0.1", port)) as s:
            request = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
            for k in range(0, len(request), 7):
                s.sendall(request[k:k + 7])
                time.sleep(0.5)
            s.settimeout(10)
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
