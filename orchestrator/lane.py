"""The round lane, the orchestrator's side: Propose/Verify over a plain TCP connection to a replica.

The service's side and the wire format are in specdec/server/lane.py. Per replica, RoundLane keeps idle
connections; a call takes one (or opens one: connect + HELLO), writes its request frame, reads the
answer and puts the connection back, so a connection carries one call at a time, as a round stream does.

Semantics are the round stream's (orchestrator/streams.py), so ReplicaPool retries, fails over and
resends on a context miss exactly as before:
  * deadline: each call's own; the request carries what is left of it (timeout_ms); a call past it
    closes its connection (the service cancels the work) and fails with DEADLINE_EXCEEDED;
  * cancellation: a caller cancelled mid-call closes the connection;
  * an ERROR frame raises grpc.aio.AioRpcError with the status and trailing metadata the unary call
    would have had (a context miss reads the same); the connection stays usable;
  * a connection the replica closed before answering (it drains or restarted) fails the call with
    UNAVAILABLE; a call that found it idle in the pool is tried once more on a new connection first.
  * LaneUnreachable: no connection could be opened (refused, timed out, a failed TLS handshake: a
    firewall that only lets gRPC through, a replica that stopped listening). ReplicaPool then makes the call on the round stream and
    leaves the lane alone for `retry_s`, so a blocked lane costs one connect timeout, never an outage.
"""

from __future__ import annotations

import asyncio
import math
import ssl
import time
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import Message

from orchestrator.streams import StreamEnded, call_once_more_if_ended, rpc_error
from specdec import spin
from specdec.server.lane import ERROR, FORWARD_DONE, HELLO, METHOD_KINDS, NOTIFY, OK, FrameBuffer, frame
from specdec.v1 import common_pb2, draft_pb2, target_pb2

MS_PER_S = 1000
RESPONSES: dict[str, type[Message]] = {"Propose": draft_pb2.ProposeResponse, "Verify": target_pb2.VerifyResponse}
CODES = {code.value[0]: code for code in grpc.StatusCode}


class LaneUnreachable(Exception):
    """No round-lane connection could be opened to the replica (the call may go over gRPC instead)."""


def lane_error(status_bytes: bytes) -> grpc.aio.AioRpcError:
    """An ERROR frame's payload as the AioRpcError the unary call would have raised."""
    status = common_pb2.RoundLaneStatus.FromString(status_bytes)
    trailing = grpc.aio.Metadata(*sorted(status.trailing.items()))
    return grpc.aio.AioRpcError(
        CODES.get(status.code, grpc.StatusCode.UNKNOWN), grpc.aio.Metadata(), trailing, status.message
    )


class _Connection(asyncio.Protocol):
    """One TCP connection: frames in, one awaited answer at a time."""

    def __init__(self, max_bytes: int, forward_done: Callable[[], spin.Window | None]) -> None:
        self.frames = FrameBuffer(max_bytes)
        self.forward_done = forward_done  # called on a FORWARD_DONE frame (the answer is on its way)
        self.polling: spin.Window | None = None  # the loop polls for the answer (ended when it comes)
        self.transport: asyncio.Transport | None = None
        self.answer: asyncio.Future | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(StreamEnded("the replica closed its round lane before answering (draining)"))

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.frames.feed(data)
        except ValueError as exc:
            frames = []
            if self.answer is not None and not self.answer.done():
                self.answer.set_exception(rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)))
            self.close()
        for kind, payload in frames:
            if kind == FORWARD_DONE:
                self.polling = self.forward_done()
                continue
            if self.polling is not None:
                self.polling.cancel()
            if self.answer is not None and not self.answer.done():
                self.answer.set_result((kind, payload))

    def send(self, kind: int, payload: bytes) -> asyncio.Future:
        """Write one frame; the future resolves to the answering (kind, payload)."""
        assert self.transport is not None, "a frame is sent on a made connection"
        self.answer = asyncio.get_running_loop().create_future()
        self.transport.write(frame(kind, payload))
        return self.answer

    def usable(self) -> bool:
        return not self.lost and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


ANSWER_WITHIN_S = 0.002  # after FORWARD_DONE the loop polls this long for the answer (specdec.spin)


class RoundLane:
    """Idle round-lane connections to one replica (see the module docstring).

    Args:
        host, port: the replica's lane (its gRPC host, ModelInfo.round_lane_port).
        token: the bearer token ("" = none).
        max_bytes: the largest answer accepted.
        idle_max: idle connections kept; a call returning one more closes it.
        connect_timeout_s: the most a connect + HELLO may take.
        retry_s: after LaneUnreachable, how long calls skip the lane.
        tls: connect over TLS with this context (specdec.server.tls.lane_client_context; None = plain TCP),
            verifying that the replica's certificate names `host`, as the gRPC channel does.
        notify: ask for FORWARD_DONE (the replica says it sends it: ModelInfo.round_lane_forward_done); on
            it the loop polls for the answer (specdec.spin) instead of sleeping until it arrives.
    """

    def __init__(
        self,
        host: str,
        port: int,
        token: str,
        max_bytes: int,
        idle_max: int,
        connect_timeout_s: float,
        retry_s: float,
        tls: ssl.SSLContext | None = None,
        notify: bool = False,
    ) -> None:
        self.host, self.port, self.token, self.max_bytes, self.tls = host, port, token, max_bytes, tls
        self.idle_max, self.connect_timeout_s, self.retry_s = idle_max, connect_timeout_s, retry_s
        self._idle: list[_Connection] = []
        self.opened = 0  # connections opened (tests read it: calls reuse connections)
        self.unreachable_until = 0.0  # time.monotonic() before which calls skip the lane
        self.notify = notify
        self.forward_done = 0  # FORWARD_DONE frames received (tests read it)

    def usable(self) -> bool:
        """Whether calls should try the lane now (not after a failed connect, for retry_s)."""
        return time.monotonic() >= self.unreachable_until

    async def call(self, method: str, request: Any, timeout: float) -> Any:
        """`method`(request) on the lane within `timeout` s (raises grpc.aio.AioRpcError as the unary call
        would, or LaneUnreachable when no connection could be opened)."""
        deadline = asyncio.get_running_loop().time() + timeout
        return await call_once_more_if_ended(
            lambda fresh: self._take(deadline, fresh),
            lambda conn: self._exchange(method, conn, request, deadline),
            deadline,
        )

    async def _take(self, deadline: float, fresh: bool) -> tuple[_Connection, bool]:
        """(an idle connection or a new one, whether it was idle); fresh: close the idle ones first."""
        if fresh:
            self.close_idle()
        while self._idle:
            conn = self._idle.pop()
            if conn.usable():
                return conn, True
        return await self._open(deadline), False

    async def _open(self, deadline: float) -> _Connection:
        """Connect within connect_timeout_s (a replica that does not accept is unreachable), then the TLS
        handshake and HELLO within the call's deadline: a service whose event loop is in a forward
        (forwards_on_loop: up to a prefill chunk) answers them after it, and that is a busy replica, not an
        unreachable one."""
        loop = asyncio.get_running_loop()
        conn = _Connection(self.max_bytes, self._forward_done)
        try:
            async with asyncio.timeout(min(self.connect_timeout_s, max(0.0, deadline - loop.time()))):
                await loop.create_connection(lambda: conn, self.host, self.port)
            async with asyncio.timeout_at(deadline):
                if self.tls is not None:
                    assert conn.transport is not None, "create_connection made the connection"
                    conn.transport = await loop.start_tls(conn.transport, conn, self.tls, server_hostname=self.host)
                kind, payload = await conn.send(HELLO, self.token.encode())
        except (OSError, TimeoutError, StreamEnded) as exc:
            conn.close()
            if isinstance(exc, TimeoutError) and conn.transport is not None and loop.time() >= deadline:
                raise rpc_error(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    "round lane: connected, but HELLO was not answered before the call's deadline",
                ) from None
            self.unreachable_until = time.monotonic() + self.retry_s
            raise LaneUnreachable(f"round lane {self.host}:{self.port}: {type(exc).__name__}: {exc}") from None
        except BaseException:  # cancelled while connecting: leave no connection behind
            conn.close()
            raise
        if kind != OK:
            conn.close()
            raise lane_error(payload)  # e.g. UNAUTHENTICATED: a wrong token is not a network problem
        self.opened += 1
        return conn

    async def _exchange(self, method: str, conn: _Connection, request: Any, deadline: float) -> Any:
        """Write the request, read its answer; the connection goes back to the pool after a whole call."""
        loop = asyncio.get_running_loop()
        request.timeout_ms = max(1, math.ceil((deadline - loop.time()) * MS_PER_S))
        asked = METHOD_KINDS[method] | (NOTIFY if self.notify else 0)
        try:
            async with asyncio.timeout_at(deadline):
                kind, payload = await conn.send(asked, request.SerializeToString())
        except TimeoutError:
            conn.close()
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, f"{method} deadline exceeded (round lane)") from None
        except BaseException:
            conn.close()
            raise
        self._put(conn)
        if kind == OK:
            return RESPONSES[method].FromString(payload)
        if kind == ERROR:
            raise lane_error(payload)
        conn.close()
        raise rpc_error(grpc.StatusCode.INTERNAL, f"round lane: unexpected frame kind {kind} answering {method}")

    def _forward_done(self) -> spin.Window | None:
        self.forward_done += 1
        return spin.expect_soon(ANSWER_WITHIN_S)

    def _put(self, conn: _Connection) -> None:
        if conn.usable() and len(self._idle) < self.idle_max:
            self._idle.append(conn)
        else:
            conn.close()

    def close_idle(self) -> None:
        """Close the idle connections."""
        for conn in self._idle:
            conn.close()
        self._idle.clear()
