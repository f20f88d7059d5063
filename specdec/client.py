"""Python client of the orchestrator (specdec.v1.Orchestrator over gRPC): sync and async.

    from specdec.client import Client
    with Client("127.0.0.1:50050") as c:
        r = c.generate("Once upon a time", max_new_tokens=32, k=3)
        print(r.text, r.finish_reason, r.stats["mean_accepted_length"])
        for chunk in c.stream(messages=[{"role": "user", "content": "Hi"}]):
            print(chunk.text, end="", flush=True)

    async with AsyncClient("127.0.0.1:50050", token="...", tls=True, ca="ca.pem") as c:
        r = await c.generate(prompt, temperature=0.7, seed=1)
        async for chunk in c.stream(prompt):
            ...

Parameters left out stay UNSET in the GenerateRequest, so the server's defaults
table (specdec/params.py) applies: temperature 0 (greedy) unless given.

Deadlines: `timeout` (seconds) bounds the whole call, retries included.
Retries: on UNAVAILABLE the call is retried with exponential backoff (`retries`
times). Every call carries a request id (one is made up when not given), so a
retried Generate is the same generation, and a retried stream RESUMES it: the
retry sends `resume_offset` = completion tokens already received, and chunks
are never delivered twice. A resumable call also needs a session id: when none
is given and retries are on, the client makes one up and sets `create_session`
(a brand-new session, exactly what the server does for a request without one).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from specdec.client_results import (
    Chunk,
    ClientError,
    GenerateResult,
    StreamResume,
    Usage,
    collect,
    result_from_response,
)
from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import orchestrator_pb2_grpc

__all__ = [
    "AsyncClient",
    "Chunk",
    "Client",
    "ClientError",
    "GenerateResult",
    "Usage",
    "build_request",
    "collect",
    "result_from_response",
]

DEFAULT_RETRIES = 3
DEFAULT_BACKOFF_S = 0.2
MAX_BACKOFF_S = 5.0
RETRY_CODES = frozenset({grpc.StatusCode.UNAVAILABLE})

# keyword -> where it goes in the GenerateRequest ("" = top level, "sampling" = SamplingParams)
_REQUEST_FIELDS = (
    "max_new_tokens",
    "k",
    "draft_kind",
    "trace",
    "ignore_eos",
    "min_tokens",
    "logprobs",
    "add_generation_prompt",
    "max_rounds",
    "session_id",
    "create_session",
    "request_id",
    "resume_offset",
)
_SAMPLING_FIELDS = (
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "draft_top_n",
)


def _messages(messages: Iterable[Any]) -> list[tuple[str, str]]:
    out = []
    for m in messages:
        if isinstance(m, Mapping):
            out.append((m["role"], m["content"]))
        elif isinstance(m, Sequence) and len(m) == 2:
            out.append((m[0], m[1]))
        else:
            out.append((m.role, m.content))
    return out


def build_request(
    prompt: str | None = None,
    *,
    messages: Iterable[Any] | None = None,
    stop: str | Sequence[str] | None = None,
    **params: Any,
) -> pb.GenerateRequest:
    """A GenerateRequest; parameters that are None or not given stay unset (server defaults)."""
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of prompt or messages")
    unknown = set(params) - set(_REQUEST_FIELDS) - set(_SAMPLING_FIELDS)
    if unknown:
        raise TypeError(f"unknown generation parameter(s): {', '.join(sorted(unknown))}")
    req = pb.GenerateRequest()
    if prompt is not None:
        req.prompt = prompt
    else:
        req.messages.SetInParent()
        for role, content in _messages(messages or ()):
            req.messages.messages.add(role=role, content=content)
    if stop:
        req.stop.extend([stop] if isinstance(stop, str) else list(stop))
    for name, value in params.items():
        if value is not None:
            setattr(req.sampling if name in _SAMPLING_FIELDS else req, name, value)
    return req


@dataclass
class _Common:
    address: str
    token: str | None = None
    tls: bool = False
    ca: str | bytes | None = None  # CA certificate (path or PEM bytes); None = system roots
    cert: str | bytes | None = None  # client certificate + key for mTLS
    key: str | bytes | None = None
    timeout: float | None = 600.0  # default deadline of a call (seconds), retries included
    retries: int = DEFAULT_RETRIES
    backoff: float = DEFAULT_BACKOFF_S
    max_message_bytes: int = 4 * 1024 * 1024

    def _credentials(self) -> grpc.ChannelCredentials:
        def read(x: str | bytes | None) -> bytes | None:
            return None if x is None else x if isinstance(x, bytes) else open(x, "rb").read()

        return grpc.ssl_channel_credentials(read(self.ca), read(self.key), read(self.cert))

    def _options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
        ]

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def _prepare(self, prompt: str | None, messages: Any, stream: bool, params: dict[str, Any]) -> pb.GenerateRequest:
        req = build_request(prompt, messages=messages, **params)
        if self.retries > 0:
            if not req.HasField("request_id"):
                req.request_id = uuid.uuid4().hex
            if not req.HasField("session_id"):
                req.session_id, req.create_session = uuid.uuid4().hex, True
        return req

    def _deadline(self, timeout: float | None) -> float | None:
        t = self.timeout if timeout is None else timeout
        return None if t is None else time.monotonic() + t

    def _delay(self, attempt: int, deadline: float | None, exc: grpc.RpcError) -> float:
        """Seconds to wait before retry `attempt` (1-based); raises when no retry is left."""
        code = exc.code()
        if code not in RETRY_CODES or attempt > self.retries:
            raise ClientError(code, exc.details() or "", attempt) from None
        delay = min(MAX_BACKOFF_S, self.backoff * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
        if deadline is not None and time.monotonic() + delay >= deadline:
            raise ClientError(code, exc.details() or "", attempt) from None
        return delay

    @staticmethod
    def _left(deadline: float | None) -> float | None:
        if deadline is None:
            return None
        left = deadline - time.monotonic()
        if left <= 0:
            raise ClientError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")
        return left


class Client(_Common):
    """Synchronous client. `Client(address, token=None, tls=False, ca=None, timeout=600, retries=3)`."""

    def __init__(self, address: str, **kwargs: Any) -> None:
        super().__init__(address, **kwargs)
        opts = self._options()
        self.channel = (
            grpc.secure_channel(address, self._credentials(), opts)
            if self.tls
            else grpc.insecure_channel(address, opts)
        )
        self.stub = orchestrator_pb2_grpc.OrchestratorStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unary(self, method: Any, request: Any, timeout: float | None) -> tuple[Any, int]:
        deadline, attempt = self._deadline(timeout), 0
        while True:
            attempt += 1
            try:
                return method(request, timeout=self._left(deadline), metadata=self._metadata()), attempt
            except grpc.RpcError as exc:
                time.sleep(self._delay(attempt, deadline, exc))

    def generate(
        self, prompt: str | None = None, *, messages: Any = None, timeout: float | None = None, **params: Any
    ) -> GenerateResult:
        """One whole generation (Generate). Unset params take the server's defaults."""
        req = self._prepare(prompt, messages, False, params)
        resp, attempts = self._unary(self.stub.Generate, req, timeout)
        return result_from_response(resp, attempts)

    def stream(
        self, prompt: str | None = None, *, messages: Any = None, timeout: float | None = None, **params: Any
    ) -> Iterator[Chunk]:
        """The generation as it happens (GenerateStream), resumed after UNAVAILABLE without repeats."""
        state = StreamResume(self._prepare(prompt, messages, True, params))
        deadline, attempt = self._deadline(timeout), 0
        while not state.done:
            attempt += 1
            call = self.stub.GenerateStream(
                state.next_request(), timeout=self._left(deadline), metadata=self._metadata()
            )
            try:
                for c in call:
                    chunk = state.accept(c)
                    if chunk is not None:
                        yield chunk
                if not state.done:
                    raise ClientError(grpc.StatusCode.INTERNAL, "the stream ended without a final chunk")
            except grpc.RpcError as exc:
                time.sleep(self._delay(attempt, deadline, exc))
            finally:
                call.cancel()

    def status(self, timeout: float | None = None) -> pb.StatusResponse:
        return self._unary(self.stub.Status, pb.StatusRequest(), timeout)[0]

    def get_session(self, session_id: str, timeout: float | None = None) -> pb.SessionInfo:
        return self._unary(self.stub.GetSession, pb.SessionRequest(session_id=session_id), timeout)[0]

    def delete_session(self, session_id: str, timeout: float | None = None) -> pb.SessionInfo:
        return self._unary(self.stub.DeleteSession, pb.SessionRequest(session_id=session_id), timeout)[0]


class AsyncClient(_Common):
    """asyncio client (grpc.aio), same options and semantics as Client."""

    def __init__(self, address: str, **kwargs: Any) -> None:
        super().__init__(address, **kwargs)
        opts = self._options()
        self.channel = (
            grpc.aio.secure_channel(address, self._credentials(), opts)
            if self.tls
            else grpc.aio.insecure_channel(address, opts)
        )
        self.stub = orchestrator_pb2_grpc.OrchestratorStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _unary(self, method: Any, request: Any, timeout: float | None) -> tuple[Any, int]:
        deadline, attempt = self._deadline(timeout), 0
        while True:
            attempt += 1
            try:
                return await method(request, timeout=self._left(deadline), metadata=self._metadata()), attempt
            except grpc.aio.AioRpcError as exc:
                await asyncio.sleep(self._delay(attempt, deadline, exc))

    async def generate(
        self, prompt: str | None = None, *, messages: Any = None, timeout: float | None = None, **params: Any
    ) -> GenerateResult:
        req = self._prepare(prompt, messages, False, params)
        resp, attempts = await self._unary(self.stub.Generate, req, timeout)
        return result_from_response(resp, attempts)

    async def stream(
        self, prompt: str | None = None, *, messages: Any = None, timeout: float | None = None, **params: Any
    ) -> AsyncIterator[Chunk]:
        state = StreamResume(self._prepare(prompt, messages, True, params))
        deadline, attempt = self._deadline(timeout), 0
        while not state.done:
            attempt += 1
            call = self.stub.GenerateStream(
                state.next_request(), timeout=self._left(deadline), metadata=self._metadata()
            )
            try:
                async for c in call:
                    chunk = state.accept(c)
                    if chunk is not None:
                        yield chunk
                if not state.done:
                    raise ClientError(grpc.StatusCode.INTERNAL, "the stream ended without a final chunk")
            except grpc.aio.AioRpcError as exc:
                await asyncio.sleep(self._delay(attempt, deadline, exc))
            finally:
                call.cancel()

    async def status(self, timeout: float | None = None) -> pb.StatusResponse:
        return (await self._unary(self.stub.Status, pb.StatusRequest(), timeout))[0]

    async def get_session(self, session_id: str, timeout: float | None = None) -> pb.SessionInfo:
        return (await self._unary(self.stub.GetSession, pb.SessionRequest(session_id=session_id), timeout))[0]

    async def delete_session(self, session_id: str, timeout: float | None = None) -> pb.SessionInfo:
        return (await self._unary(self.stub.DeleteSession, pb.SessionRequest(session_id=session_id), timeout))[0]
