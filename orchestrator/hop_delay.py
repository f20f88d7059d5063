"""A fixed delay on each hop of the orchestrator's draft and target calls (SPECDEC_HOP_DELAY_MS): for the bench
and tests only, to measure a distant draft or target. Installed at start where set, as a wrapper around the
replica pools' calls, so an orchestrator without it runs no check at all."""

from __future__ import annotations

import asyncio
from typing import Any

from orchestrator.replicas import ReplicaPool

MS_PER_S = 1000.0


def delay_hops(pool: ReplicaPool, delay_ms: float) -> None:
    """Make each of `pool`'s calls wait `delay_ms` before the request and again before the answer returns."""
    call = pool.call

    async def delayed_call(*args: Any, **kwargs: Any) -> tuple[Any, str, int]:
        await asyncio.sleep(delay_ms / MS_PER_S)
        result = await call(*args, **kwargs)
        await asyncio.sleep(delay_ms / MS_PER_S)
        return result

    pool.call = delayed_call  # type: ignore[method-assign]  # the bench/test-only wrapper, installed once at start
