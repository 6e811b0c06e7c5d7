"""Admission: how many jobs of a kind run at once, how many may wait, and for how long.

Without bounds a burst of executions queued without end behind one slow one (a tiny execute
waited 17.9 s behind a 20.9 s one). A ``Gate`` runs ``slots`` jobs at a time and lets at most
``queue`` more wait, each at most ``wait_s``; past that the answer is 503 with ``Retry-After``.
Optionally no client (its API key, or its address) holds more than ``per_client`` of the running
and waiting jobs: 429 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fusecut.service.problems import Problem


class Gate:
    def __init__(self, what: str, slots: int, queue: int, wait_s: float, per_client: int = 0,
                 retry_after_s: int = 1):
        self.what, self.slots, self.queue, self.wait_s = what, slots, queue, wait_s
        self.per_client, self.retry_after_s = per_client, retry_after_s
        self._free = asyncio.Semaphore(slots)
        self.waiting = 0
        self._by_client: Counter[str] = Counter()

    def _refuse(self, status: int, detail: str) -> Problem:
        return Problem(status, "too many requests" if status == 429 else "busy", detail,
                       headers={"Retry-After": str(self.retry_after_s)})

    @asynccontextmanager
    async def slot(self, client: str) -> AsyncIterator[None]:
        """Hold one of the slots for the block, or raise a 429 or 503 Problem."""
        if self.per_client and self._by_client[client] >= self.per_client:
            raise self._refuse(429, f"this client already has {self.per_client} {self.what}(s) "
                                    f"running or waiting; retry when one is done")
        if self._free.locked() and self.waiting >= self.queue:
            raise self._refuse(503, f"{self.slots} {self.what}(s) are running and {self.waiting} "
                                    f"waiting, the most this service queues; retry later")
        self._by_client[client] += 1
        self.waiting += 1
        try:
            try:
                await asyncio.wait_for(self._free.acquire(), self.wait_s)
            except TimeoutError:
                raise self._refuse(503, f"no {self.what} slot came free within "
                                        f"{self.wait_s:g} s; retry later") from None
            finally:
                self.waiting -= 1
            try:
                yield
            finally:
                self._free.release()
        finally:
            self._by_client[client] -= 1
            if not self._by_client[client]:
                del self._by_client[client]
