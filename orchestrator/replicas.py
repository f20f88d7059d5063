"""The orchestrator's view of the draft and target pools: channels, Info, routing, retries.

Each pool discovers its replicas (static list or DNS), asks each one for Info
when it first sees it, and routes a session's calls by rendezvous hashing on
the session id (so the replica holding the session's KV cache keeps getting
it). A call that fails with UNAVAILABLE marks the replica unhealthy and is
retried on the session's next choice: routing is a cache hint, never needed for
correctness: a replica that never saw the session answers a delta-form call with a
context miss and gets the whole token context at once (orchestrator/delta.py), and a
replica without the session's KV cache rebuilds it from that context.

Only UNAVAILABLE is retried (with linear backoff, never past the call's
deadline). Any other failure of a replica reaches the client as the status in
DOWNSTREAM_ERRORS (e.g. a replica's DEADLINE_EXCEEDED stays DEADLINE_EXCEEDED,
an unexpected INTERNAL becomes UNAVAILABLE: a dependency failed, retrying helps).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from orchestrator.delta import ContextSend, is_context_miss
from specdec.config import RetryConfig, ServerConfig
from specdec.errors import (
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    SpecDecError,
    Unavailable,
)
from specdec.models.tokenizer_info import TokenizerInfo, compare_tokenizers
from specdec.routing import ReplicaSet, RoutingConfig, make_resolver
from specdec.server.app import grpc_options
from specdec.server.tls import channel_credentials
from specdec.v1 import common_pb2, draft_pb2_grpc, target_pb2_grpc

log = logging.getLogger("specdec.orchestrator")

# UNAVAILABLE: a replica down or draining; CANCELLED: a replica whose server stopped with the call in it
# (grpc's stop cancels calls that reach it between its drain and its exit). Our own cancellations never
# arrive as a status (the awaiting task raises asyncio.CancelledError), so both mean: try another replica.
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
MS_PER_S = 1000
STUBS = {"draft": draft_pb2_grpc.DraftStub, "target": target_pb2_grpc.TargetStub}
DOWNSTREAM_ERRORS: dict[grpc.StatusCode, type[SpecDecError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
}


def downstream_error(role: str, address: str, method: str, exc: grpc.aio.AioRpcError) -> SpecDecError:
    """A replica's failure as the error the orchestrator's client sees (UNAVAILABLE by default)."""
    kind = DOWNSTREAM_ERRORS.get(exc.code(), Unavailable)
    return kind(f"{role} replica {address} failed {method}: {exc.code().name}: {exc.details()}")


@dataclass
class Replica:
    """One model-service process as the orchestrator sees it."""

    address: str
    channel: grpc.aio.Channel
    stub: Any
    info: common_pb2.ModelInfo | None = None
    error: str = ""  # why it cannot be used (incompatible tokenizer, Info failed)
    incompatible: bool = False  # the error is a tokenizer mismatch (not transient)


@dataclass
class ReplicaPool:
    """A pool of draft or target replicas behind one address spec."""

    role: str
    addresses: str
    server_cfg: ServerConfig
    retry: RetryConfig
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    replicas: dict[str, Replica] = field(default_factory=dict)
    set: ReplicaSet = field(init=False)
    # called with the role each time a replica's context miss makes a call resend the whole context
    on_context_resend: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        self.set = ReplicaSet(make_resolver(self.addresses), self.routing)

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        token = self.server_cfg.service_token
        return (("authorization", f"Bearer {token}"),) if token else ()

    def _connect(self, address: str) -> Replica:
        creds = channel_credentials(self.server_cfg.tls)  # the orchestrator's own cert doubles as its client cert
        opts = grpc_options(self.server_cfg.max_message_bytes) + [
            ("grpc.initial_reconnect_backoff_ms", int(self.retry.reconnect_initial_s * MS_PER_S)),
            ("grpc.min_reconnect_backoff_ms", int(self.retry.reconnect_initial_s * MS_PER_S)),
            ("grpc.max_reconnect_backoff_ms", int(self.retry.reconnect_max_s * MS_PER_S)),
        ]
        channel = (
            grpc.aio.secure_channel(address, creds, options=opts)
            if creds
            else grpc.aio.insecure_channel(address, options=opts)
        )
        return Replica(address, channel, STUBS[self.role](channel))

    async def refresh(self) -> None:
        """Re-resolve the pool; connect to new replicas and ask them for Info."""
        await self.set.refresh()
        for address in self.set.replicas:
            if address not in self.replicas:
                self.replicas[address] = self._connect(address)
        for address in list(self.replicas):
            if address not in self.set.replicas:
                await self.replicas.pop(address).channel.close()
        stale = [r for r in self.replicas.values() if r.info is None or r.address in self.set.unhealthy]
        await asyncio.gather(*(self._fetch_info(r) for r in stale))

    async def _fetch_info(self, replica: Replica) -> None:
        try:
            replica.info = await replica.stub.Info(
                common_pb2.InfoRequest(), timeout=self.retry.connect_timeout_s, metadata=self._metadata()
            )
            replica.error = ""
            self.set.mark_healthy(replica.address)
        except grpc.aio.AioRpcError as exc:
            replica.error = f"{self.role} replica {replica.address}: {exc.code().name}: {exc.details()}"
            self.set.mark_unhealthy(replica.address)

    def usable(self) -> list[Replica]:
        """Replicas with Info and no compatibility error."""
        return [r for r in self.replicas.values() if r.info is not None and not r.error]

    def check_compatible(self, reference: TokenizerInfo, reference_name: str) -> None:
        """Mark replicas whose tokenizer differs from the reference (n-gram drafts are always compatible)."""
        for r in self.replicas.values():
            if r.info is None or not r.info.tokenizer_fingerprint:
                continue
            theirs = TokenizerInfo(
                vocab_size=r.info.vocab_size,
                fingerprint=r.info.tokenizer_fingerprint,
                special_tokens=dict(r.info.special_tokens),
            )
            problem = compare_tokenizers(
                reference, theirs, reference_name, f"{self.role} {r.info.model_id} at {r.address}"
            )
            if problem or r.incompatible:
                r.error = problem or ""
            r.incompatible = bool(problem)
            if problem:
                self.set.mark_unhealthy(r.address)
                log.error("refusing %s", problem)

    def check_features(self, target: Any) -> None:
        """Mark feature-draft replicas the target cannot feed (no kept hidden states, another hidden size)."""
        for r in self.replicas.values():
            if r.info is None or not r.info.needs_target_hidden or r.incompatible:
                continue
            if target.keeps_hidden and target.hidden_size == r.info.hidden_size:
                continue
            r.error = (
                f"hidden states differ: feature draft {r.info.model_id} at {r.address} needs the target's "
                f"hidden states of size {r.info.hidden_size}; target {target.model_id} has size "
                f"{target.hidden_size} and {'keeps' if target.keeps_hidden else 'does not keep'} them "
                "(SPECDEC_KEEP_HIDDEN)"
            )
            r.incompatible = True
            self.set.mark_unhealthy(r.address)
            log.error("refusing %s", r.error)

    async def call(
        self, session_id: str, method: str, request: Any, timeout: float, context: ContextSend | None = None
    ) -> tuple[Any, str, int]:
        """Call `method` on the session's replica, retrying UNAVAILABLE on the next choices.

        `timeout` bounds the whole call, retries and backoff included. With `context`, the request's
        context fields are filled per replica (the delta form where the replica holds the prefix;
        orchestrator/delta.py) and a replica's context miss is answered by resending the whole context.
        Returns (response, replica address, retries). Raises Unavailable when no replica answers,
        another SpecDecError (DOWNSTREAM_ERRORS) when a replica fails otherwise.
        """
        errors: list[str] = []
        deadline = time.monotonic() + timeout
        for attempt in range(self.retry.attempts):
            address = self.set.pick(session_id)
            replica = self.replicas.get(address) if address else None
            left = deadline - time.monotonic()
            if address is None or replica is None or replica.error or left <= 0:
                break
            self.set.acquire(address)
            try:
                response = await self._send(replica, method, request, left, context)
                return response, address, attempt
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in RETRYABLE:
                    raise downstream_error(self.role, address, method, exc) from None
                errors.append(f"{address}: {exc.details()}")
                self.set.mark_unhealthy(address)
            finally:
                self.set.release(address)
            await asyncio.sleep(min(self.retry.backoff_s * (attempt + 1), max(0.0, deadline - time.monotonic())))
        raise Unavailable(f"no {self.role} replica could serve the call ({'; '.join(errors) or 'none available'})")

    async def _invoke(self, replica: Replica, method: str, request: Any, timeout: float) -> Any:
        """One unary call to one replica."""
        return await getattr(replica.stub, method)(request, timeout=timeout, metadata=self._metadata())

    async def _send(
        self, replica: Replica, method: str, request: Any, timeout: float, context: ContextSend | None
    ) -> Any:
        """One call to one replica; a context miss is resent at once with the whole context."""
        if context is None:
            return await self._invoke(replica, method, request, timeout)
        deadline = time.monotonic() + timeout
        context.fill(request, replica.address, replica.info)
        try:
            response = await self._invoke(replica, method, request, timeout)
        except grpc.aio.AioRpcError as exc:
            if not is_context_miss(exc) or not request.HasField("prefix_hash"):
                context.forget(replica.address)
                raise
            context.missed(replica.address)
            if self.on_context_resend is not None:
                self.on_context_resend(self.role)
            log.info(
                "%s replica %s did not hold session %s's context (%s): resending it whole",
                self.role,
                replica.address,
                request.session_id,
                exc.details(),
            )
            context.fill(request, replica.address, replica.info)
            try:
                response = await self._invoke(replica, method, request, max(0.0, deadline - time.monotonic()))
            except grpc.aio.AioRpcError:
                context.forget(replica.address)
                raise
        context.confirm(replica.address)
        return response

    async def release_session(self, session_id: str) -> None:
        """Best effort: tell every usable replica to drop the session's cache."""
        req = common_pb2.ReleaseRequest(session_id=session_id)
        calls = [
            r.stub.Release(req, timeout=self.retry.connect_timeout_s, metadata=self._metadata()) for r in self.usable()
        ]
        await asyncio.gather(*calls, return_exceptions=True)

    async def close(self) -> None:
        for r in self.replicas.values():
            await r.channel.close()
