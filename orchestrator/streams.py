"""Round streams, the orchestrator's side: Propose/Verify calls over long-lived bidirectional streams.

A unary call per round pays for a new HTTP/2 stream, its headers and trailers and several thread
wake-ups on both sides each round; a stream that stays open carries only the two messages
(docs/performance.md, "Where the per-round overhead goes"). Per replica and method, RoundStreams keeps
the idle streams; a call takes one (or opens one), writes its request, reads its response and puts
the stream back, so a stream carries one call at a time and concurrent calls use distinct streams.
A stream is not tied to a session: every request names its session.

Semantics are the unary call's (ReplicaPool.call retries, fails over and resends on a context miss
exactly as before):
  * deadline: each call's own, enforced here; a call past it cancels its stream (the service stops
    the work, as for a unary deadline) and fails with DEADLINE_EXCEEDED. The request carries what is
    left of it (timeout_ms) so that the service sheds work it cannot finish in time, as it does with
    a unary call's gRPC deadline;
  * cancellation: a caller cancelled mid-call cancels the stream;
  * a call's error ends its stream with that call's status and trailing metadata (a context miss
    reads the same as on a unary call);
  * a stream the replica ended between calls (it drains, or restarted) fails the call with
    UNAVAILABLE before the request was read (also when the write races the stream's end and gRPC
    fails the send with INTERNAL: the request was not sent); a call that found its stream idle in the pool is then
    tried once more on a new stream before the pool sees the failure.
Only services that say so in ModelInfo.round_streams get streams; the others keep the unary call.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

log = logging.getLogger("specdec.orchestrator")

STREAM_METHODS = {"Propose": "ProposeStream", "Verify": "VerifyStream"}
MS_PER_S = 1000


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """A failure of a streamed call, as the unary call would have raised it."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class StreamEnded(Exception):
    """The replica ended the stream before answering (OK status: it drains; the request was not read)."""


async def call_once_more_if_ended(
    take: Callable[[bool], Awaitable[tuple[Any, bool]]], exchange: Callable[[Any], Awaitable[Any]], deadline: float
) -> Any:
    """One call on a pooled channel (a round stream, a round-lane connection): `take(fresh)` gives
    (channel, whether it was idle in the pool; fresh: after closing the idle ones), `exchange(channel)`
    makes the call. A channel the replica had ended while it sat idle (StreamEnded before an answer) is
    tried once more on a fresh one; otherwise StreamEnded is UNAVAILABLE, as the unary call reads."""
    channel, reused = await take(False)
    try:
        return await exchange(channel)
    except StreamEnded as exc:
        if not reused or asyncio.get_running_loop().time() >= deadline:
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, str(exc)) from None
    channel, _ = await take(True)
    try:
        return await exchange(channel)
    except StreamEnded as exc:
        raise rpc_error(grpc.StatusCode.UNAVAILABLE, str(exc)) from None


class RoundStreams:
    """Idle round streams to one replica, per method (see the module docstring).

    Args:
        stub: the replica's DraftStub / TargetStub.
        metadata: the call metadata every stream opens with (the bearer token).
        idle_max: idle streams kept per method; a call returning one more closes it.
    """

    def __init__(self, stub: Any, metadata: Callable[[], tuple], idle_max: int) -> None:
        self.stub = stub
        self.metadata = metadata
        self.idle_max = idle_max
        self._idle: dict[str, list[grpc.aio.StreamStreamCall]] = {}
        self.opened = 0  # streams opened (a test reads it: calls reuse streams)

    def _take(self, method: str) -> tuple[grpc.aio.StreamStreamCall, bool]:
        """(an idle stream of `method` or a new one, whether it was idle)."""
        idle = self._idle.setdefault(method, [])
        while idle:
            call = idle.pop()
            if not call.done():
                return call, True
        self.opened += 1
        return getattr(self.stub, STREAM_METHODS[method])(metadata=self.metadata()), False

    def _put(self, method: str, call: grpc.aio.StreamStreamCall) -> None:
        idle = self._idle.setdefault(method, [])
        if len(idle) < self.idle_max:
            idle.append(call)
        else:
            call.cancel()

    async def call(self, method: str, request: Any, timeout: float) -> Any:
        """`method`(request) on a round stream, within `timeout` seconds (raises grpc.aio.AioRpcError
        as the unary call would)."""
        deadline = asyncio.get_running_loop().time() + timeout

        async def take(fresh: bool) -> tuple[grpc.aio.StreamStreamCall, bool]:
            if fresh:
                self.close_idle(method)
            return self._take(method)

        return await call_once_more_if_ended(
            take, lambda call: self._exchange(method, call, request, deadline), deadline
        )

    async def _exchange(self, method: str, call: grpc.aio.StreamStreamCall, request: Any, deadline: float) -> Any:
        """Write the request, read its response; the stream goes back to the pool only after a whole call."""
        try:
            async with asyncio.timeout_at(deadline):
                # the service's load shedding reads the call's wait here (a stream has no per-call deadline)
                request.timeout_ms = max(1, math.ceil((deadline - asyncio.get_running_loop().time()) * MS_PER_S))
                try:
                    await call.write(request)
                except asyncio.InvalidStateError:  # the replica ended the stream (OK) before this call
                    raise StreamEnded(f"the replica ended its {method} stream") from None
                except grpc.aio.AioRpcError as exc:
                    # the write raced the replica's end of the stream: gRPC fails the send ("Internal error
                    # from Core", INTERNAL) instead of reporting the stream's OK end; nothing was sent
                    if exc.code() != grpc.StatusCode.INTERNAL:
                        raise
                    raise StreamEnded(f"the {method} stream ended as the request was written") from None
                response = await call.read()
        except TimeoutError:
            call.cancel()
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, f"{method} deadline exceeded (round stream)") from None
        except BaseException:
            call.cancel()
            raise
        if response is grpc.aio.EOF:
            raise StreamEnded(f"the replica ended its {method} stream before answering (draining)")
        self._put(method, call)
        return response

    def close_idle(self, method: str | None = None) -> None:
        """Cancel the idle streams (of one method, or all)."""
        for name in [method] if method else list(self._idle):
            for call in self._idle.pop(name, []):
                call.cancel()
