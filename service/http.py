"""uvicorn's HTTP protocol with deadlines and bounds on what a request may send before the app
sees it (``fusecut serve`` uses it).

uvicorn times out idle keep-alive connections between requests, but not a connection that
never finishes sending one: a client could open a connection, send half a request line or half
a body, and keep the connection (a file descriptor and a task) for as long as it liked; 1,000
such clients held 1,029 descriptors. Here, in the middle of a request (the protocol's settings
are ``service.settings``'s):

- a connection that sends nothing for ``FUSECUT_READ_TIMEOUT_S`` is answered 408 and closed;
- one sending a byte at a time is not saved by it (issue 32: with a 2 s read timeout, 50/50
  connections sending a byte every 0.8 s lived 30 s, and 1,100 of them pinned all 1,024
  descriptors): the request line and headers must all arrive within
  ``FUSECUT_HEADER_TIMEOUT_S`` of their first byte, and a body at ``FUSECUT_MIN_BODY_RATE``
  bytes a second on average once ``FUSECUT_READ_TIMEOUT_S`` of grace has passed (as Apache's
  mod_reqtimeout does), else 408;
- the headers may number ``FUSECUT_MAX_HEADER_COUNT`` and take ``FUSECUT_MAX_HEADER_BYTES``
  (request line included), else 431, before any of it reaches the app or its API key check (one
  request of 6M headers, 79 MB, grew the service by 1.5 GB and stalled /healthz for 5 s);
- a chunked body must average ``MIN_CHUNK_BYTES`` a chunk once it has sent ``FREE_CHUNKS``
  chunks, else 400 and close: each chunk costs a parser callback and a message to the app, so
  bodies sent a byte a chunk (~8 MB/s from six connections) pushed /healthz's p99 from 40 ms to
  0.5-1 s while the same bytes in plain bodies cost nothing (issue 45);
- at most ``FUSECUT_MAX_CONNECTIONS`` connections are open at once: past that a new one is
  answered 503 and closed, so that descriptors are never exhausted (the process's soft limit on
  open files is raised to its hard limit at start, and the cap kept under it).

The clocks stop while the service itself holds the body back (flow control) and once the
request is complete (its response is being made).
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from fusecut.service.settings import Settings

log = logging.getLogger("fusecut.service")
FD_RESERVE = 128  # descriptors kept for everything but client connections (cache, helpers)
FREE_CHUNKS = 256  # a chunked body's chunks that may be of any size (a client's first writes)
MIN_CHUNK_BYTES = 1024  # what a chunked body's chunks must average past those
_limits: Limits | None = None


def _response(status: int, reason: str, title: str, detail: str) -> bytes:
    body = json.dumps({"type": "about:blank", "title": title, "status": status,
                       "detail": detail}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/problem+json\r\n"
            f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body


class Limits:
    """The protocol's settings, read once per process."""

    def __init__(self, settings: Settings):
        self.read_timeout_s = settings.read_timeout_s
        self.header_timeout_s = settings.header_timeout_s
        self.min_body_rate = settings.min_body_rate
        self.max_header_count = settings.max_header_count
        self.max_header_bytes = settings.max_header_bytes
        self.max_connections = min(settings.max_connections, open_files_limit() - FD_RESERVE)
        self.timeout_response = _response(408, "Request Timeout", "request timeout",
                                          "the request was not sent in time")
        self.chunks_response = _response(400, "Bad Request", "chunks too small", (
            f"a chunked body must average at least {MIN_CHUNK_BYTES} bytes a chunk past its "
            f"first {FREE_CHUNKS} chunks"))
        self.busy_response = _response(503, "Service Unavailable", "busy", (
            f"the service has {self.max_connections} connections open, the most it keeps; "
            f"retry later"))

    def headers_response(self, what: str) -> bytes:
        return _response(431, "Request Header Fields Too Large",
                         "request header fields too large",
                         f"the request's headers are over the limit of {what}")


def open_files_limit() -> int:
    """The soft limit on open files, first raised to the hard limit (as far as 1M)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1 << 20
    wanted = min(wanted, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def limits() -> Limits:
    global _limits
    if _limits is None:
        _limits = Limits(Settings.from_env())
    return _limits


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request that is over a limit (httptools
    raises it on as an HttpParserCallbackError, which uvicorn answers with
    ``send_400_response``)."""


class ReadTimeoutProtocol(HttpToolsProtocol):
    """HttpToolsProtocol that drops a connection whose request is sent too slowly, whose
    headers are too many or too long, or that would pass the connection cap."""

    _read_timer: asyncio.TimerHandle | None = None
    _reading = False  # a request (or the first one) has begun and is not yet complete
    _refusal: bytes | None = None  # the answer to a request over a limit, sent on closing
    _last = 0.0  # when data last came
    _head_start: float | None = None  # when the request's first byte came
    _head_bytes = 0  # what the request line and headers took so far
    _header_count = 0
    _body_start: float | None = None  # when the headers were complete
    _body_bytes = 0
    _chunks = 0  # chunks of the body so far (chunked transfer encoding)

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._limits = limits()
        if len(self.connections) > self._limits.max_connections:
            log.warning("%d connections open: refusing another (FUSECUT_MAX_CONNECTIONS)",
                        len(self.connections) - 1)
            transport.write(self._limits.busy_response)
            transport.close()
            return
        self._reading = True  # a client that connects owes us a request
        self._begin(time.monotonic())

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        if not self._reading:  # the next request begins
            self._reading = True
            self._begin(now)
        self._last = now
        if self._body_start is None:  # still in the head: bounded as it arrives
            self._head_bytes += len(data)
        self._arm()
        super().data_received(data)  # a callback's refusal comes back as send_400_response
        if self._refusal is None and self._body_start is None and self._reading and \
                self._head_bytes > self._limits.max_header_bytes:
            self._refuse(self._limits.headers_response(
                f"{self._limits.max_header_bytes} bytes"))

    def send_400_response(self, msg: str) -> None:
        if self._refusal is not None:  # a callback refused the request: say why
            self._send_refusal()
            return
        super().send_400_response(msg)

    # ---- parser callbacks ----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_count = 0
        if not self._reading:  # a request pipelined behind one that ended in this chunk
            self._reading = True
            self._begin(time.monotonic())

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self._limits.max_header_count:
            self._refusal = self._limits.headers_response(
                f"{self._limits.max_header_count} headers")
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._body_start = time.monotonic()
        super().on_headers_complete()

    def on_chunk_header(self) -> None:
        self._chunks += 1
        sent = self._chunks - 1  # chunks complete (this one may be the last, empty one)
        if sent > FREE_CHUNKS and self._body_bytes < MIN_CHUNK_BYTES * sent:
            self._refusal = self._limits.chunks_response
            raise _Refused

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading = False
        self._disarm()

    # ---- the clocks ----------------------------------------------------------------------------

    def _begin(self, now: float) -> None:
        self._last = self._head_start = now
        self._head_bytes = self._body_bytes = self._chunks = 0
        self._body_start = None
        self._arm()

    def _deadline(self) -> float:
        """When the request in progress is late: silent too long, its head not complete in
        time, or its body behind the minimum rate."""
        lim = self._limits
        silence = self._last + lim.read_timeout_s
        if self._body_start is None:
            late = self._head_start + lim.header_timeout_s
        else:
            late = self._body_start + lim.read_timeout_s + self._body_bytes / lim.min_body_rate
        return min(silence, late)

    def _arm(self) -> None:
        self._disarm()
        self._read_timer = self.loop.call_at(self._deadline(), self._timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _timed_out(self) -> None:
        self._read_timer = None
        if not self._reading or self.transport.is_closing():
            return
        now = time.monotonic()
        if self.flow is not None and self.flow.read_paused:  # we hold the body back, not them
            if self._body_start is not None:  # the pause does not count against their rate
                self._body_start += now - max(self._last, self._body_start)
            self._last = now
            self._arm()
            return
        if now < self._deadline():  # data came since the timer was set
            self._arm()
            return
        cycle = self.cycle
        if cycle is None or cycle.response_complete or not cycle.response_started:
            self.transport.write(self._limits.timeout_response)
        self.transport.close()

    # ---- refusals ------------------------------------------------------------------------------

    def _refuse(self, response: bytes) -> None:
        self._refusal = response
        self._send_refusal()

    def _send_refusal(self) -> None:
        """Answer a request over a limit (unless its response has begun) and close."""
        self._reading = False
        self._disarm()
        cycle = self.cycle
        if not self.transport.is_closing():
            if cycle is None or cycle.response_complete or not cycle.response_started:
                self.transport.write(self._refusal)
            self.transport.close()
