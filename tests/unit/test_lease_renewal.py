"""The lease-renewal task ends when its generation ends, even if a Redis call swallows the cancellation.

redis-py's asyncio client can swallow a CancelledError that lands inside a command
(redis/redis-py#2028, #2551). Seen here in a benchmark: a finished generation waited forever
for its renewal task, which kept renewing the lease. The fake store below does what redis-py
can do; with plain `task.cancel(); await task` this test hangs (and fails on its timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from orchestrator.lease import SessionLease
from specdec.config import LeaseConfig

IN_FLIGHT_S = 0.3  # a renewal still running when the generation ends
TEST_TIMEOUT_S = 3.0


class SwallowingStore:
    def __init__(self) -> None:
        self.renewals = 0

    async def renew_lease(self, session_id: str, owner: str, seconds: float) -> float:
        self.renewals += 1
        with contextlib.suppress(asyncio.CancelledError):  # swallowed, as a Redis client can
            await asyncio.sleep(IN_FLIGHT_S)
        return seconds


def lease_with(store: SwallowingStore) -> SessionLease:
    return SessionLease(store, "s1", "orch-test", LeaseConfig(seconds=0.03, stop_wait_s=1.0))  # renew every 10 ms


def test_renewal_stops_even_when_the_store_swallows_the_cancellation():
    store = SwallowingStore()

    async def scenario() -> int:
        lease = lease_with(store)
        async with lease.renewing():
            await asyncio.sleep(0.05)  # a renewal is in flight now
        renewals = store.renewals
        await asyncio.sleep(0.1)  # no renewals after the generation ended
        return store.renewals - renewals

    result: list[int] = []
    # A daemon thread: with the old code the event loop itself never finishes (the task renews forever).
    worker = threading.Thread(target=lambda: result.append(asyncio.run(scenario())), daemon=True)
    worker.start()
    worker.join(TEST_TIMEOUT_S)
    assert result, "the generation never finished: its renewal task did not stop"
    assert store.renewals >= 1
    assert result[0] == 0
