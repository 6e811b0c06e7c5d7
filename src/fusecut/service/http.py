"""uvicorn's HTTP protocol with a read timeout (``fusecut serve`` uses it).

uvicorn times out idle keep-alive connections between requests, but not a connection that
never finishes sending one: a client could open a connection, send half a request line or half
a body, and keep the connection (a file descriptor and a task) for as long as it liked; 1,000
such clients held 1,029 descriptors. Here a connection whose request is incomplete and that
sends nothing for ``FUSECUT_READ_TIMEOUT_S`` seconds is answered 408 (if no response has started)
and closed. The clock stops while the service itself holds the body back (flow control) and
while a response is being made.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from fusecut.service.settings import Settings

TIMEOUT_RESPONSE = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/problem+json\r\n"
                    b"connection: close\r\ncontent-length: %d\r\n\r\n%s")
TIMEOUT_BODY = (b'{"type":"about:blank","title":"request timeout","status":408,"detail":"the '
                b'request was not sent in time"}')
_timeout_s: float | None = None


def read_timeout_s() -> float:
    global _timeout_s
    if _timeout_s is None:
        _timeout_s = Settings.from_env().read_timeout_s
    return _timeout_s


class ReadTimeoutProtocol(HttpToolsProtocol):
    """HttpToolsProtocol that drops a connection whose request stalls half-sent."""

    _read_timer: asyncio.TimerHandle | None = None
    _reading = False  # a request (or the first one) has begun and is not yet complete

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._reading = True  # a client that connects owes us a request
        self._arm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._reading or not self.cycle or self.cycle.response_complete:
            self._reading = True
            self._arm()
        super().data_received(data)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading = False
        self._disarm()

    def _arm(self) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(read_timeout_s(), self._timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _timed_out(self) -> None:
        self._read_timer = None
        if not self._reading or self.transport.is_closing():
            return
        if self.flow is not None and self.flow.read_paused:  # we hold the body back, not them
            self._arm()
            return
        cycle = self.cycle
        if cycle is None or cycle.response_complete or not cycle.response_started:
            self.transport.write(TIMEOUT_RESPONSE % (len(TIMEOUT_BODY), TIMEOUT_BODY))
        self.transport.close()
