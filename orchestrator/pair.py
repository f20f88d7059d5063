"""Watches the draft and target pools (discovery, Info, the tokenizer check) and the session store.

The orchestrator refuses a replica whose tokenizer differs from the target's
(and a target whose tokenizer differs from the orchestrator's own). While no
compatible pair is available, health is NOT_SERVING and requests get
FAILED_PRECONDITION with a message naming both models and what differs. While
no target replica answers at all (they died, or are restarting), requests get
UNAVAILABLE instead: retrying later (or elsewhere) helps.

Every refresh_s the pools are re-resolved and every replica marked unhealthy
(a failed call, a failed Info) is asked for Info again: a replica that is
back is routed to again from the next round on (how a killed draft "comes
back" after the session ran degraded, k = 0).

In the same pass the session store is PINGed (orchestrator/store_health.py, with its own
deadline): while Redis is down, unreachable or refuses this instance's credentials, health is
NOT_SERVING (readiness probes route elsewhere) and requests get UNAVAILABLE naming the
Redis problem; the first pass where it answers again turns health back to SERVING.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from orchestrator.replicas import ReplicaPool
from orchestrator.store_health import StoreProbe
from specdec.errors import FailedPrecondition, SpecDecError, Unavailable
from specdec.models.tokenizer_info import TokenizerInfo
from specdec.v1 import orchestrator_pb2 as pb

log = logging.getLogger("specdec.orchestrator")


class PairMonitor:
    """Keeps the pools fresh and says whether a compatible draft/target pair (and, with `store`,
    the session store) is available. `refresh_s`: the pause between passes (OrchestratorConfig.health_refresh_s)."""

    def __init__(
        self,
        target: ReplicaPool,
        draft: ReplicaPool | None,
        tokenizer: TokenizerInfo,
        tokenizer_name: str,
        refresh_s: float,
        store: StoreProbe | None = None,
    ) -> None:
        self.target, self.draft, self.store = target, draft, store
        self.tokenizer, self.tokenizer_name = tokenizer, tokenizer_name
        self.refresh_s = refresh_s
        self._problem = "no target replica has answered yet"
        self._transient = True
        self.checked = asyncio.Event()  # set once the first pass over the pools finished

    async def wait_checked(self, timeout_s: float) -> None:
        """Wait (at most timeout_s) for the first pass over the pools, so that a request racing
        the orchestrator's start gets the real verdict instead of 'not answered yet'."""
        if not self.checked.is_set() and timeout_s > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.checked.wait(), timeout=timeout_s)

    def problem(self) -> str:
        """Why requests cannot be served now ('' when they can): the store's problem, then the pair's."""
        store = self.store.problem if self.store is not None else ""
        return "; ".join(p for p in (store, self._problem) if p)

    def problem_error(self) -> SpecDecError | None:
        """The error a request gets now: None, UNAVAILABLE (nothing answers: replicas or Redis) or
        FAILED_PRECONDITION (incompatible pair, which retrying does not fix)."""
        problem = self.problem()
        if not problem:
            return None
        return (FailedPrecondition if self._problem and not self._transient else Unavailable)(problem)

    async def refresh(self) -> None:
        """One pass: discovery + Info + compatibility over both pools, and a PING of the session store
        alongside (sets `checked`, even when it fails)."""
        ping = asyncio.ensure_future(self.store.check()) if self.store is not None else None
        try:
            await self._refresh()
        finally:
            if ping is not None:
                await ping
            self.checked.set()

    async def _refresh(self) -> None:
        await self.target.refresh()
        self.target.check_compatible(self.tokenizer, f"orchestrator tokenizer {self.tokenizer_name}")
        targets = self.target.usable()
        if self.draft is not None:
            await self.draft.refresh()
            if targets:
                t = targets[0].info
                assert t is not None, "usable replicas have Info"
                ref = TokenizerInfo(
                    vocab_size=t.vocab_size, fingerprint=t.tokenizer_fingerprint, special_tokens=dict(t.special_tokens)
                )
                self.draft.check_compatible(ref, f"target {t.model_id}")
                self.draft.check_features(t)
        self._problem = self._diagnose()

    def _diagnose(self) -> str:
        self._transient = not any(r.incompatible for r in self.target.replicas.values())
        if not self.target.usable():
            errors = [r.error for r in self.target.replicas.values() if r.error]
            return "; ".join(errors) or "no target replica is reachable"
        self._transient = False
        if self.draft is not None and self.draft.replicas and not self.draft.usable():
            incompatible = [r.error for r in self.draft.replicas.values() if r.error and "differ" in r.error]
            if incompatible and len(incompatible) == len(self.draft.replicas):
                return "; ".join(incompatible)
        return ""

    async def run(self, stop: asyncio.Event, on_change: Callable[[bool], Awaitable[None]]) -> None:
        """Refresh every refresh_s until stop; report serving/not serving to on_change."""
        while not stop.is_set():
            try:
                await self.refresh()
            except Exception as exc:  # noqa: BLE001 - discovery errors must not kill the loop
                self._problem, self._transient = f"replica discovery failed: {exc}", True
                log.warning(self._problem)
            await on_change(not self.problem())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.refresh_s)

    def target_info(self):
        usable = self.target.usable()
        return usable[0].info if usable else None

    async def release_session(self, session_id: str) -> None:
        await self.target.release_session(session_id)
        if self.draft is not None:
            await self.draft.release_session(session_id)

    def replica_statuses(self) -> list[pb.ReplicaStatus]:
        pools = [self.target] + ([self.draft] if self.draft is not None else [])
        return [
            pb.ReplicaStatus(
                address=r.address,
                role=pool.role,
                healthy=not r.error and r.info is not None and r.address not in pool.set.unhealthy,
                error=r.error,
                in_flight=pool.set.in_flight(r.address),
                info=r.info,
            )
            for pool in pools
            for r in pool.replicas.values()
        ]
