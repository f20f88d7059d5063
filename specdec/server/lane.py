"""The round lane, the service's side: Propose/Verify calls over a plain TCP connection, no gRPC.

Why: a round is one call to the target (and one to the draft), and on a small CPU VM most of a call's
cost outside the forward is gRPC's thread crossings, not bytes: each message passes gRPC's event-engine
thread and the asyncio poller before it reaches the event loop, on both sides, and every thread that
slept through the forward costs a wake-up (docs/performance.md, "Where the per-round overhead goes").
The lane delivers a frame straight to the event loop that answers it (one wake-up), the way vLLM's
engine core and SGLang's scheduler take requests over plain sockets rather than RPC. gRPC stays the
service's API: Info, Release, Stats, health, reflection, and Propose/Verify for every caller that does
not use the lane. The lane carries the same request and response messages as the round streams.

Wire format (docs/protocol.md, "Round lane"): frames of HEADER (payload length, kind) + payload.
  * A connection opens with HELLO (payload: the bearer token, empty without auth), answered OK, or
    ERROR (UNAUTHENTICATED) and closed; one that says nothing for hello_timeout_s is closed.
  * Then one call at a time: PROPOSE or VERIFY with the serialized request (its timeout_ms set, as on a
    round stream), answered OK with the serialized response or ERROR with a RoundLaneStatus (the status
    and trailing metadata the unary call would have ended with). An error does not end the connection.
  * A request kind with the NOTIFY bit set asks for a FORWARD_DONE frame (no payload) the moment the
    call's forward has finished, before its answer is built (services that say so in
    ModelInfo.round_lane_forward_done): the caller starts polling for the answer then (specdec.spin), so
    its wake-up overlaps the accept rule instead of following it.
  * The caller cancels a call (deadline, cancellation) by closing the connection: the handler is cancelled.
  * Draining: no new connections; idle ones are closed at once, a call in flight is answered and then
    its connection closed; a request that arrives meanwhile is answered UNAVAILABLE (never run). The
    calls count in the service's DrainGate, so the process stops only once they are answered.
TLS: with TLS on (cert + key), the lane speaks TLS with the gRPC port's certificate and rules (client
certificates required when a CA is configured: mTLS), so it never carries a round in the clear; the TLS
handshake must finish within hello_timeout_s.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import inspect
import logging
import ssl
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from specdec import spin
from specdec.errors import InvalidArgument
from specdec.server.interceptors import DRAINING_MESSAGE, DrainGate, status_of
from specdec.v1 import common_pb2

log = logging.getLogger("specdec.server")

HEADER = struct.Struct("<IB")  # payload length in bytes, frame kind
HELLO_TIMEOUT_S = 10.0  # a connection that has not said HELLO by then is closed
NEXT_CALL_WITHIN_S = 0.002  # after an answer the loop polls this long for the next round (specdec.spin)
RESULT_WITHIN_S = 0.002  # after a forward the loop polls this long for the model thread's result
HELLO, PROPOSE, VERIFY, OK, ERROR, FORWARD_DONE = 1, 2, 3, 4, 5, 6
NOTIFY = 0x80  # request kind bit: send FORWARD_DONE when the call's forward has finished
METHOD_KINDS = {"Propose": PROPOSE, "Verify": VERIFY}


def call_arrival(context: Any) -> float:
    """time.perf_counter() when a call reached the service: its frame's read for a round-lane call, now (the
    handler starting) for a gRPC call. ComputeStats.service_ms counts from it."""
    received = context.received if isinstance(context, LaneCallContext) else None
    return received if received is not None else time.perf_counter()


def ms_since(started: float) -> float:
    """Milliseconds from `started` (time.perf_counter()) to now."""
    return (time.perf_counter() - started) * 1000.0


def frame(kind: int, payload: bytes = b"") -> bytes:
    """One frame: header + payload."""
    return HEADER.pack(len(payload), kind) + payload


FORWARD_DONE_FRAME = frame(FORWARD_DONE)


def error_frame(code: grpc.StatusCode, message: str, trailing: tuple[tuple[str, str], ...] = ()) -> bytes:
    """An ERROR frame carrying the status a failed call ends with."""
    status = common_pb2.RoundLaneStatus(code=code.value[0], message=message, trailing=dict(trailing))
    return frame(ERROR, status.SerializeToString())


class FrameBuffer:
    """Splits received bytes into (kind, payload) frames; a frame over `max_bytes` is refused."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._data = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The whole frames `data` completes (raises ValueError for a frame over the limit)."""
        self._data += data
        frames = []
        while len(self._data) >= HEADER.size:
            size, kind = HEADER.unpack_from(self._data)
            if size > self.max_bytes:
                raise ValueError(f"a {size}-byte round-lane frame is over the {self.max_bytes}-byte limit")
            end = HEADER.size + size
            if len(self._data) < end:
                break
            frames.append((kind, bytes(self._data[HEADER.size : end])))
            del self._data[:end]
        return frames


class LaneCallContext:
    """What a servicer method reads from its gRPC context, for a call that came over the lane: no
    per-call deadline besides the request's own timeout_ms (see specdec.server.streams.call_timeout_s).

    forward_done: for a call that asked (NOTIFY), what the engine calls, on any thread, once the call's
    forward has finished (None: nobody asked).
    received: time.perf_counter() when the event loop read the call's frame (None: not known).
    """

    def __init__(self, forward_done: Callable[[], None] | None = None, received: float | None = None) -> None:
        self.forward_done = forward_done
        self.received = received

    def time_remaining(self) -> float | None:
        return None


@dataclass(frozen=True)
class LaneMethod:
    """A method the lane serves: its request parser and the servicer's handler.

    now: the handler's form that may answer at once (TargetServicer.verify_now): returns the response, or an
    awaitable of it for a call it could not answer at once; then the frame is answered without a task.
    """

    name: str
    parse: Callable[[bytes], Any]
    handle: Callable[[Any, Any], Awaitable[Any]]
    now: Callable[[Any, Any], Any] | None = None


class RoundLaneServer:
    """Serves `methods` (frame kind -> LaneMethod) on a TCP port (see the module docstring).

    Args:
        methods: what PROPOSE / VERIFY frames run.
        gate: the service's DrainGate (calls count as in flight; closed = draining).
        token: the bearer token a HELLO must carry ("" = no auth).
        max_bytes: the largest frame accepted (the service's max message size).
        hello_timeout_s: how long a new connection may take to say HELLO.
        forward_done: honour the NOTIFY bit (the service's handlers call LaneCallContext.forward_done).
    """

    def __init__(
        self,
        methods: dict[int, LaneMethod],
        gate: DrainGate,
        token: str,
        max_bytes: int,
        hello_timeout_s: float = HELLO_TIMEOUT_S,
        forward_done: bool = False,
    ) -> None:
        self.methods, self.gate, self.token, self.max_bytes = methods, gate, token, max_bytes
        self.forward_done = forward_done  # honours NOTIFY (the service's engine calls forward_done)
        self.hello_timeout_s = hello_timeout_s
        self.port = 0
        self.calls = 0  # calls answered (ServiceStats.lane_calls)
        self.forward_done_frames = 0  # FORWARD_DONE frames sent (ServiceStats.lane_forward_done)
        self.connections: set[_LaneConnection] = set()
        self._server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> int:
        """Listen on host:port (0: any free port), over TLS with `tls` (specdec.server.tls.lane_server_context);
        returns the port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _LaneConnection(self),
            host,
            port,
            ssl=tls,
            ssl_handshake_timeout=self.hello_timeout_s if tls else None,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def close(self) -> None:
        """Drain: stop listening and close the idle connections (calls in flight close theirs when answered)."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            if conn.call is None:
                conn.transport.close()

    def authorized(self, presented: bytes) -> bool:
        return not self.token or hmac.compare_digest(presented, self.token.encode())

    def answer_now(self, kind: int, payload: bytes, context: LaneCallContext) -> bytes | Awaitable[bytes]:
        """The OK or ERROR frame for one call when it was answered at once (LaneMethod.now), else an awaitable
        of it."""
        method = self.methods.get(kind)
        self.calls += 1
        try:
            if method is None:
                raise InvalidArgument(f"round lane: unknown frame kind {kind}")
            try:
                request = method.parse(payload)
            except DecodeError as exc:
                raise InvalidArgument(f"malformed {method.name} request: {exc}") from None
            response = method.now(request, context) if method.now is not None else method.handle(request, context)
            if inspect.isawaitable(response):
                return self._answer_later(method.name, response)
            return frame(OK, response.SerializeToString())
        except Exception as exc:  # noqa: BLE001 - every failure is answered with its status, as gRPC would
            return error_frame(*status_of(exc, f"round lane {method.name if method else kind}"))

    @staticmethod
    async def _answer_later(name: str, response: Awaitable[Any]) -> bytes:
        try:
            return frame(OK, (await response).SerializeToString())
        except Exception as exc:  # noqa: BLE001 - as in answer_now
            return error_frame(*status_of(exc, f"round lane {name}"))


class _LaneConnection(asyncio.Protocol):
    """One caller's connection: HELLO, then one call at a time."""

    def __init__(self, lane: RoundLaneServer) -> None:
        self.lane = lane
        self.frames = FrameBuffer(lane.max_bytes)
        self.greeted = False  # said HELLO with an accepted token
        self.call: asyncio.Task | None = None  # the call being answered, when it waits (see _frame)
        self.answering = False  # a call was read and is not answered yet (at once or by self.call)
        self.started = 0  # calls started on this connection
        self.polling: spin.Window | None = None  # the loop polls for this connection's next request / result
        self.transport: asyncio.Transport
        self._hello_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.loop, self.loop_thread = asyncio.get_running_loop(), threading.get_ident()
        self.lane.connections.add(self)
        self._hello_timer = asyncio.get_running_loop().call_later(self.lane.hello_timeout_s, self._hello_overdue)

    def _hello_overdue(self) -> None:
        if not self.greeted:
            self._refuse(
                grpc.StatusCode.UNAUTHENTICATED,
                f"no HELLO frame within {self.lane.hello_timeout_s:.0f} s of connecting",
            )

    def connection_lost(self, exc: Exception | None) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        self.lane.connections.discard(self)
        if self.call is not None:  # the caller went away mid-call (deadline, cancel): stop the work
            self.call.cancel()

    def data_received(self, data: bytes) -> None:
        received = time.perf_counter()
        try:
            frames = self.frames.feed(data)
        except ValueError as exc:
            self._refuse(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            return
        for kind, payload in frames:
            if self.transport.is_closing():
                return
            self._frame(kind, payload, received)

    def _frame(self, kind: int, payload: bytes, received: float) -> None:
        if kind == HELLO:
            if self.lane.authorized(payload):
                self.greeted = True
                self.transport.write(frame(OK))
            else:
                self._refuse(
                    grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token (the round lane's HELLO frame)"
                )
        elif not self.greeted:
            self._refuse(grpc.StatusCode.UNAUTHENTICATED, "a round-lane connection opens with a HELLO frame")
        elif self.answering:
            self._refuse(grpc.StatusCode.INVALID_ARGUMENT, "round lane: a second call before the first was answered")
        elif self.lane.gate.closed:
            self._refuse(grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE)  # never run: the caller retries elsewhere
        else:
            if self.polling is not None:
                self.polling.cancel()
            self.started += 1
            asks = kind & NOTIFY and self.lane.forward_done
            notify = functools.partial(self._forward_done, self.started) if asks else None
            self.answering = True
            self.lane.gate.enter()  # in flight until answered, here or in the task below (no gap a drain sees)
            answer: bytes | Awaitable[bytes] = b""
            try:
                answer = self.lane.answer_now(kind & ~NOTIFY, payload, LaneCallContext(notify, received))
            finally:
                if isinstance(answer, bytes):
                    self.lane.gate.leave()
            if isinstance(answer, bytes):
                self._send(answer)
            else:
                self.call = asyncio.get_running_loop().create_task(self._run(answer))

    async def _run(self, answer: Awaitable[bytes]) -> None:
        try:
            sent = await answer
        finally:
            self.lane.gate.leave()
        self._send(sent)

    def _send(self, answer: bytes) -> None:
        """Send a call's answer (the connection is free for the next call)."""
        self.call, self.answering = None, False
        if not self.transport.is_closing():
            if self.polling is not None:
                self.polling.cancel()
            self.transport.write(answer)
            self.polling = spin.expect_soon(NEXT_CALL_WITHIN_S)  # the caller's next round follows at once
            if self.lane.gate.closed:  # draining: this connection has carried its last call
                self.transport.close()

    def _forward_done(self, call: int) -> None:
        """Tell the caller that call number `call` has finished its forward (from the loop's thread or,
        through the loop, the model thread's); the loop then polls for the result instead of sleeping
        until it is handed over."""
        if threading.get_ident() != self.loop_thread:
            self.loop.call_soon_threadsafe(self._forward_done, call)
            return
        if self.answering and self.started == call and not self.transport.is_closing():
            self.transport.write(FORWARD_DONE_FRAME)
            self.lane.forward_done_frames += 1
            self.polling = spin.expect_soon(RESULT_WITHIN_S)

    def _refuse(self, code: grpc.StatusCode, message: str) -> None:
        """Answer with an ERROR frame and close the connection."""
        log.info("round lane: %s: %s", code.name, message)
        self.transport.write(error_frame(code, message))
        self.transport.close()
