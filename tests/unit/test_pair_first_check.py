"""A request that races the orchestrator's start waits for the first pool check."""

from __future__ import annotations

import asyncio
import time

from orchestrator.pair import PairMonitor


def make_monitor() -> PairMonitor:
    return PairMonitor(target=None, draft=None, tokenizer=None, tokenizer_name="t", refresh_s=1.0)


def test_wait_returns_as_soon_as_the_first_check_is_done():
    async def scenario() -> float:
        monitor = make_monitor()
        asyncio.get_running_loop().call_later(0.05, monitor.checked.set)
        start = time.monotonic()
        await monitor.wait_checked(timeout_s=5.0)
        return time.monotonic() - start

    assert asyncio.run(scenario()) < 2.0


def test_wait_is_bounded_when_the_check_never_finishes():
    async def scenario() -> tuple[float, str]:
        monitor = make_monitor()
        start = time.monotonic()
        await monitor.wait_checked(timeout_s=0.1)
        return time.monotonic() - start, str(monitor.problem_error())

    waited, problem = asyncio.run(scenario())
    assert 0.09 <= waited < 2.0
    assert "no target replica has answered yet" in problem
