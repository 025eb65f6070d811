"""A broadcast wake-up for coroutines that wait on replication progress.

In: `notify()` from whatever moved (an append, fetched batches, a higher high watermark, a role or
ISR change). Out: every coroutine blocked in `wait(timeout)` resumes (long-polling fetches, acks=all
produces, a controlled shutdown) and checks its own condition again; the wake-up carries no data.
"""

from __future__ import annotations

import asyncio


class Signal:
    """Wakes every waiter (long-polling fetches, acks=all produces) on any change."""

    def __init__(self) -> None:
        self._waiters: set[asyncio.Future] = set()

    def notify(self) -> None:
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(None)
        self._waiters.clear()

    async def wait(self, timeout: float) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._waiters.add(fut)
        try:
            # asyncio.wait, not wait_for: Python 3.11's wait_for can swallow a cancellation that
            # races with the future's completion, and a shutdown must be able to cancel every waiter.
            await asyncio.wait([fut], timeout=max(timeout, 0))
        finally:
            self._waiters.discard(fut)
