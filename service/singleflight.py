"""Single-flight: concurrent identical requests in one process share one computation.

Replicas in other processes may still compute the same plan at the same moment; the cache then
stores it once (INSERT ... ON CONFLICT DO NOTHING).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    def __init__(self) -> None:
        self._running: dict[str, asyncio.Future[T]] = {}

    def __len__(self) -> int:
        return len(self._running)

    async def run(self, key: str, compute: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
        """(``compute()``'s result, whether it was shared from a call already running). A
        failure reaches every caller waiting on it; if the call that computes is cancelled
        (its client went away), a waiting caller computes instead."""
        while True:
            running = self._running.get(key)
            if running is None:
                break
            try:
                return await asyncio.shield(running), True
            except asyncio.CancelledError:
                if not running.cancelled():
                    raise  # this caller was cancelled, not the computation
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieve)
        self._running[key] = future
        try:
            result = await compute()
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as e:
            future.set_exception(e)
            raise
        else:
            future.set_result(result)
            return result, False
        finally:
            del self._running[key]


def _retrieve(future: asyncio.Future) -> None:
    """Mark a failure as seen: with no caller waiting, asyncio would log it as never retrieved."""
    if not future.cancelled():
        future.exception()
