"""SPECDEC_HOP_DELAY_MS (bench and tests only): a wrapper installed at start around the replica pools' calls,
delaying the request and the answer; a pool without it is called directly."""

from __future__ import annotations

import asyncio
import time

from orchestrator.hop_delay import delay_hops


class Pool:
    async def call(self, *args, **kwargs):
        return ("answer", "replica", 0)


def test_each_call_waits_the_delay_on_both_hops():
    pool = Pool()
    delay_hops(pool, 20.0)
    started = time.perf_counter()
    assert asyncio.run(pool.call("s", "Verify", None, 1.0)) == ("answer", "replica", 0)
    assert time.perf_counter() - started >= 0.04
    assert "call" not in vars(Pool())  # an undelayed pool keeps its own method
