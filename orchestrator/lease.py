"""Holding a session while a generation runs: this instance's lease (renewed in the background,
checked before every round, freed at once after a failure), and session-store failures as the gRPC
statuses the client should see. The rules are in orchestrator/generation.py's docstring.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator

from orchestrator.idempotency import reused
from orchestrator.session_store import SessionStore
from orchestrator.session_types import (
    LeaseLost,
    RequestReused,
    SessionBusy,
    SessionExists,
    SessionNotFound,
    StoreUnavailable,
    VersionConflict,
)
from specdec.config import LeaseConfig
from specdec.errors import Aborted, AlreadyExists, NotFound, Unavailable

log = logging.getLogger("specdec.orchestrator")


@contextlib.contextmanager
def store_errors() -> Iterator[None]:
    """Session-store failures as the gRPC statuses the client should see."""
    try:
        yield
    except StoreUnavailable as exc:
        raise Unavailable(f"session store (Redis) unavailable: {exc}") from None
    except SessionNotFound as exc:
        raise NotFound(f"{exc}; pass create_session=true to create it") from None
    except SessionExists as exc:
        raise AlreadyExists(str(exc)) from None
    except RequestReused as exc:
        raise reused(exc.session_id, exc.request_id) from None
    except (VersionConflict, LeaseLost, SessionBusy) as exc:
        raise Aborted(str(exc)) from None


class SessionLease:
    """This orchestrator instance's lease on one session during one generation.

    Args:
        store: the session store.
        session_id: the session.
        owner: this instance's owner id.
        cfg: lease length, renewal period and waits.
    """

    def __init__(self, store: SessionStore, session_id: str, owner: str, cfg: LeaseConfig) -> None:
        self.store, self.session_id, self.owner, self.cfg = store, session_id, owner, cfg
        self.lost = ""  # set by the renewer when another instance took the session over

    @contextlib.asynccontextmanager
    async def renewing(self) -> AsyncIterator[None]:
        """Renew the lease every LeaseConfig.renew_s while the block runs.

        The renewal task is stopped by an event, not by cancellation alone: redis-py's
        asyncio client can swallow a CancelledError that lands inside a command
        (redis/redis-py#2028, #2551), and a task that never ends would hang the request
        (seen here: a finished generation waiting forever while its lease kept renewing).
        """
        stop = asyncio.Event()
        task = asyncio.create_task(self._renew_until(stop))
        try:
            yield
        finally:
            stop.set()
            task.cancel()  # cuts the sleep short; `stop` ends the loop if the cancellation is swallowed
            await asyncio.wait({task}, timeout=self.cfg.stop_wait_s)

    async def _renew_until(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.cfg.renew_s)
            if stop.is_set():
                return
            try:
                await self.store.renew_lease(self.session_id, self.owner, self.cfg.seconds)
            except LeaseLost as exc:
                self.lost = str(exc)
                return
            except (StoreUnavailable, SessionNotFound) as exc:
                log.warning("could not renew the lease of session %s: %s", self.session_id, exc)

    def check(self) -> None:
        """Raise Aborted when the renewer saw another instance take the session over."""
        if self.lost:
            raise Aborted(f"this orchestrator lost the session's lease, another instance owns it: {self.lost}")

    async def release_after_failure(self) -> None:
        """A failed generation: free the lease at once (the request stays resumable with the same
        request_id), or raise Aborted when another instance owns the session now."""
        try:
            await self.store.renew_lease(self.session_id, self.owner, self.cfg.release_s)
        except LeaseLost as exc:
            raise Aborted(f"this orchestrator lost the session's lease, another instance owns it: {exc}") from None
        except (StoreUnavailable, SessionNotFound) as exc:
            log.warning("could not release the lease of session %s: %s", self.session_id, exc)
