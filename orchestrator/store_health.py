"""Is the session store (Redis) usable? One PING per health refresh, bounded by a deadline.

The orchestrator cannot serve a single request without Redis, so its health (orchestrator/pair.py's
PairMonitor, which sets the gRPC health service) is NOT_SERVING while the PING fails: Redis down,
unreachable, too slow to answer within OrchestratorConfig.redis_ping_timeout_s, or refusing this
instance's credentials (wrong password, no password, ACL). The probe has its own client with
socket timeouts of the ping's deadline and no retry but one, at once, of a connection Redis had
closed (a pooled connection left over from before a Redis restart, or closed by an idle timeout,
must not turn health NOT_SERVING for a pass): one check never takes much longer than that deadline
(the session store's client retries with backoff and waits longer, per call).
"""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError

log = logging.getLogger("specdec.orchestrator")

STALE_CONNECTION_RETRIES = 1  # a closed connection is retried once, at once; a timeout never
BACKSTOP_FACTOR = 2.0  # connect + read are each bounded by the timeout; asyncio's bound covers both


class StoreProbe:
    """PINGs Redis at `url`; `check()` says what is wrong ('' when it answers).

    Args:
        url: the session store's Redis URL (same host, credentials and TLS as the store).
        timeout_s: the deadline of one PING (connect included).
    """

    def __init__(self, url: str, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError("the Redis ping timeout must be positive")
        self.timeout_s = timeout_s
        retry = Retry(NoBackoff(), STALE_CONNECTION_RETRIES, supported_errors=(RedisConnectionError,))
        self._redis: aioredis.Redis = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=retry
        )
        self.problem = ""

    async def check(self) -> str:
        """PING once; remember and return the problem ('' = Redis answered)."""
        problem = await self._ping()
        if problem != self.problem:
            if problem:
                log.warning("health: NOT_SERVING: %s", problem)
            else:
                log.info("health: session store (Redis) answers again (was: %s)", self.problem)
        self.problem = problem
        return problem

    async def _ping(self) -> str:
        try:
            await asyncio.wait_for(self._redis.ping(), timeout=self.timeout_s * BACKSTOP_FACTOR)
        except AuthenticationError as exc:
            return f"session store (Redis) refused this orchestrator's credentials: {exc}"
        except asyncio.TimeoutError:
            return f"session store (Redis) unavailable: no answer to PING within {self.timeout_s:g} s"
        except (RedisError, OSError) as exc:
            return f"session store (Redis) unavailable: {type(exc).__name__}: {exc}"
        return ""

    async def close(self) -> None:
        await self._redis.aclose()
