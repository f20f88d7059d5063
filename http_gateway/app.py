"""The aiohttp application: OpenAI-compatible endpoints in front of the orchestrator's gRPC API.

Every generation is one orchestrator `Generate` / `GenerateStream` call, so the
HTTP front shares the one round loop (orchestrator/generation.py); this module
only translates (http_gateway/openai_schema.py, with the wire models of
http_gateway/protocol.py) and forwards. Every error, on every path, is one shape
(http_gateway/errors.py).

  POST /v1/completions        prompt -> GenerateRequest.prompt
  POST /v1/chat/completions   messages -> GenerateRequest.messages (the orchestrator applies the chat template)
  GET  /v1/models             the orchestrator's target model (Status) and the alias "specdec"
  GET  /health                200 when the orchestrator's health service says SERVING, else 503
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc

from http_gateway import choices, errors
from http_gateway import openai_schema as schema
from http_gateway import protocol as wire
from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import orchestrator_pb2_grpc

log = logging.getLogger("specdec.http")

GATEWAY_KEY: web.AppKey[Gateway] = web.AppKey("gateway")
STATUS_TIMEOUT_S = 5.0
HEALTH_TIMEOUT_S = 2.0
MODEL_CACHE_S = 5.0
HTTP_ERROR_MIN = 400
INVALID_API_KEY = "invalid_api_key"
MODEL_NOT_FOUND = "model_not_found"


@dataclass
class GatewayConfig:
    """Where the orchestrator is and how to talk to it; what this gateway accepts."""

    orchestrator: str = "127.0.0.1:50050"
    host: str = "127.0.0.1"
    port: int = 8000
    auth_tokens: tuple[str, ...] = ()  # non-empty: require `Authorization: Bearer <one of them>`
    tls: bool = False  # TLS to the orchestrator
    tls_ca: str = ""  # CA file for the orchestrator's certificate (default: system roots)
    request_timeout_s: float = 600.0  # gRPC deadline of one generation
    max_message_bytes: int = 4 * 1024 * 1024
    max_body_bytes: int = 4 * 1024 * 1024
    max_n: int = 16  # OpenAI `n`: choices per request, each one generation


@dataclass
class Gateway:
    """State shared by the handlers: the channel to the orchestrator and the served model id."""

    cfg: GatewayConfig
    channel: grpc.aio.Channel | None = None
    stub: orchestrator_pb2_grpc.OrchestratorStub | None = None
    _model: str = ""
    _model_at: float = 0.0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def open(self) -> None:
        options = [
            ("grpc.max_send_message_length", self.cfg.max_message_bytes),
            ("grpc.max_receive_message_length", self.cfg.max_message_bytes),
        ]
        if self.cfg.tls:
            ca = Path(self.cfg.tls_ca).read_bytes() if self.cfg.tls_ca else None  # noqa: ASYNC240 - once, at start
            self.channel = grpc.aio.secure_channel(self.cfg.orchestrator, grpc.ssl_channel_credentials(ca), options)
        else:
            self.channel = grpc.aio.insecure_channel(self.cfg.orchestrator, options)
        self.stub = orchestrator_pb2_grpc.OrchestratorStub(self.channel)

    @property
    def orchestrator(self) -> orchestrator_pb2_grpc.OrchestratorStub:
        """The orchestrator's stub (the gateway opened its channel at start)."""
        assert self.stub is not None, "Gateway.open() ran at start"
        return self.stub

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()

    # -- auth ------------------------------------------------------------------------------------

    def metadata(self, request: web.Request) -> tuple[tuple[str, str], ...]:
        """Check the bearer token (when tokens are configured) and forward it as gRPC metadata."""
        header = request.headers.get("Authorization", "")
        if not (header.isascii() and header.isprintable()):  # gRPC metadata is printable ASCII
            raise errors.api_error(
                401, "malformed Authorization header (expected 'Bearer <token>', ASCII)", code=INVALID_API_KEY
            )
        token = header[len("Bearer ") :] if header.startswith("Bearer ") else ""
        if self.cfg.auth_tokens and not any(
            hmac.compare_digest(token.encode(), t.encode()) for t in self.cfg.auth_tokens
        ):
            raise errors.api_error(
                401, "missing or invalid bearer token (header 'Authorization: Bearer <token>')", code=INVALID_API_KEY
            )
        return (("authorization", f"Bearer {token}"),) if token else ()

    # -- model -----------------------------------------------------------------------------------

    async def served_model(self, metadata: tuple[tuple[str, str], ...], refresh: bool = False) -> str:
        """The orchestrator's target model id (Status), cached for a few seconds."""
        async with self._lock:
            if refresh or not self._model or time.monotonic() - self._model_at > MODEL_CACHE_S:
                status = await self.orchestrator.Status(pb.StatusRequest(), timeout=STATUS_TIMEOUT_S, metadata=metadata)
                self._model, self._model_at = status.target_model, time.monotonic()
            return self._model

    async def check_model(self, requested: str, metadata: tuple[tuple[str, str], ...]) -> str:
        """The model id to report; 404 model_not_found unless `requested` is the served id or the alias."""
        served = await self.served_model(metadata)
        if not schema.model_matches(requested, served):
            served = await self.served_model(metadata, refresh=True)
        if not schema.model_matches(requested, served):
            raise errors.api_error(
                404,
                f"The model '{requested}' does not exist; this server serves '{served}' (alias '{schema.MODEL_ALIAS}')",
                "model",
                MODEL_NOT_FOUND,
            )
        return served or schema.MODEL_ALIAS

    async def starts_session(self, req: pb.GenerateRequest, metadata: tuple[tuple[str, str], ...]) -> bool:
        """True when this request creates its session (it does not exist yet), or is a retry of the request
        that created it (same request_id, still the only turn): then it carries the whole conversation."""
        try:
            info = await self.orchestrator.GetSession(
                pb.SessionRequest(session_id=req.session_id), timeout=STATUS_TIMEOUT_S, metadata=metadata
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return True
            raise
        return info.turns <= 1 and info.request_id == req.request_id


def _json(body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        text=json.dumps(body, ensure_ascii=False), status=status, headers=headers, content_type="application/json"
    )


def _error_response(err: errors.ApiError) -> web.Response:
    return _json(err.body(), err.status)


def _sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n".encode()


@web.middleware
async def errors_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """ApiError and gRPC errors as OpenAI error objects with the mapped HTTP status."""
    try:
        return await handler(request)
    except errors.ApiError as err:
        return _error_response(err)
    except grpc.aio.AioRpcError as exc:
        return _error_response(errors.from_grpc(exc.code(), exc.details()))
    except web.HTTPException as exc:  # aiohttp's own: unknown path 404, method 405, body too large 413
        if exc.status >= HTTP_ERROR_MIN:
            return _error_response(errors.api_error(exc.status, exc.reason))
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:  # noqa: BLE001 - the one place that turns surprises into a 500 error object
        log.exception("unhandled error in %s %s", request.method, request.path)
        return _error_response(errors.api_error(500, f"internal error: {type(exc).__name__}: {exc}"))


async def _body(request: web.Request) -> Any:
    raw = await request.read()  # over GatewayConfig.max_body_bytes: HTTPRequestEntityTooLarge -> 413
    try:
        return json.loads(raw.decode("utf-8"))  # JSON is UTF-8 (RFC 8259), whatever charset the header names
    except UnicodeDecodeError:
        raise errors.bad_request("the request body is not valid UTF-8") from None
    except RecursionError:
        raise errors.bad_request("the request body is nested too deeply") from None
    except ValueError:  # json.JSONDecodeError too
        raise errors.bad_request("the request body is not valid JSON") from None


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    gw: Gateway = request.app[GATEWAY_KEY]
    metadata = gw.metadata(request)
    parsed = schema.parse_request(
        await _body(request), chat=chat, session_header=request.headers.get(schema.SESSION_HEADER)
    )
    if parsed.n > gw.cfg.max_n:
        raise errors.bad_request(f"'n' must be at most {gw.cfg.max_n} on this server, got {parsed.n}", "n")
    if parsed.user:
        log.info("request from user %r", parsed.user)
    try:
        return await _answer(request, gw, parsed, metadata)
    except grpc.aio.AioRpcError as exc:  # before the answer started: the field it names becomes `param`
        raise errors.from_grpc(exc.code(), exc.details(), parsed.params) from None


async def _answer(
    request: web.Request, gw: Gateway, parsed: schema.Parsed, metadata: tuple[tuple[str, str], ...]
) -> web.StreamResponse:
    model = await gw.check_model(parsed.model, metadata)
    req = parsed.request
    # A session that does not exist yet gets the whole conversation, not only the last message.
    if parsed.chat and parsed.session_id and req.create_session and await gw.starts_session(req, metadata):
        del req.messages.messages[:]
        for m in parsed.all_messages:
            req.messages.messages.add(role=m["role"], content=m["content"])
    if parsed.stream:
        return await _stream(request, gw, parsed, model, metadata)
    calls = [
        gw.orchestrator.Generate(r, timeout=gw.cfg.request_timeout_s, metadata=metadata)
        for r in choices.choice_requests(req, parsed.n)
    ]
    resps = await _all_choices(calls, calls)
    body = choices.merged_body([schema.response_body(parsed, resp, model) for resp in resps])
    return _json(body, headers={schema.SESSION_HEADER: resps[0].session_id} if parsed.n == 1 else None)


async def _all_choices(awaitables: list[Any], calls: list[Any]) -> list[Any]:
    """The results of the choices' awaitables, run concurrently. The first failure (in choice order) is
    raised itself, so a refused admission stays a 429, and every call is cancelled: no choice runs on
    for an answer that will not be sent."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    for task in tasks:
        task.add_done_callback(_retrieved)
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()
        return [task.result() for task in tasks]
    except BaseException:
        for call, task in zip(calls, tasks, strict=True):
            call.cancel()
            task.cancel()
        raise


def _retrieved(task: asyncio.Future) -> None:
    """Marks a cancelled sibling's error as seen (asyncio would log it as never retrieved)."""
    if not task.cancelled():
        task.exception()


async def _first_chunk(it: Any) -> pb.GenerateChunk:
    """A stream's first message (awaited before the 200 is sent, so start errors keep their status)."""
    try:
        return await it.__anext__()
    except StopAsyncIteration:
        raise errors.api_error(502, "the orchestrator closed the stream without a result") from None


async def _merged(iters: list[Any], firsts: list[pb.GenerateChunk]) -> Any:
    """(choice index, chunk) from every stream in arrival order; a stream's error is raised here."""
    if len(iters) == 1:  # one stream: no tasks, no queue
        yield 0, firsts[0]
        async for chunk in _rest(iters[0]):
            yield 0, chunk
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int) -> None:
        queue.put_nowait((i, firsts[i]))
        try:
            async for chunk in _rest(iters[i]):
                queue.put_nowait((i, chunk))
            queue.put_nowait((i, None))
        except Exception as exc:  # noqa: BLE001 - handed to the reader, which raises it (else it would wait forever)
            queue.put_nowait((i, exc))

    pumps = [asyncio.ensure_future(pump(i)) for i in range(len(iters))]
    try:
        running = len(iters)
        while running:
            i, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item is None:
                running -= 1
            else:
                yield i, item
    finally:
        for p in pumps:
            p.cancel()


async def _rest(it: Any) -> Any:
    """The rest of a stream whose first message was taken (an async iterator over the call's messages)."""
    while True:
        try:
            yield await it.__anext__()
        except StopAsyncIteration:
            return


async def _stream(
    request: web.Request, gw: Gateway, parsed: schema.Parsed, model: str, metadata: tuple[tuple[str, str], ...]
) -> web.StreamResponse:
    """Server-Sent Events, the choices' chunks interleaved as they come. Each stream's first gRPC message
    is awaited before the 200 is sent, so errors the orchestrator raises at the start (validation, unknown
    session, overload) keep their HTTP status."""
    calls = [
        gw.orchestrator.GenerateStream(r, timeout=gw.cfg.request_timeout_s, metadata=metadata)
        for r in choices.choice_requests(parsed.request, parsed.n)
    ]
    iters = [call.__aiter__() for call in calls]
    firsts = await _all_choices([_first_chunk(it) for it in iters], calls)
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
    if parsed.n == 1 and firsts[0].session_id:
        response.headers[schema.SESSION_HEADER] = firsts[0].session_id
    stream_id = schema.stream_id(parsed, firsts[0].request_id)
    writers = [
        schema.ChunkWriter(parsed, model, id=stream_id, index=i, usage_chunk=parsed.n == 1) for i in range(parsed.n)
    ]
    usages: dict[int, dict[str, Any]] = {}
    try:
        await response.prepare(request)
        async with contextlib.aclosing(_merged(iters, firsts)) as merged:
            async for i, chunk in merged:
                for body in writers[i].chunks(chunk):
                    await response.write(_sse(body))
                if chunk.HasField("finish_reason"):
                    usages[i] = schema.usage(chunk.usage)
        if parsed.n > 1 and parsed.include_usage:
            await response.write(_sse(writers[0].usage_body([usages[i] for i in sorted(usages)])))
        await response.write(_sse("[DONE]"))
    except grpc.aio.AioRpcError as exc:  # mid-stream: the status is sent already; an error event ends it
        log.warning("stream failed: %s: %s", exc.code().name, exc.details())
        await response.write(_sse(errors.from_grpc(exc.code(), exc.details(), parsed.params).body()))
    except (ConnectionResetError, asyncio.CancelledError):  # the client went away: stop the generations
        for call in calls:
            call.cancel()
        raise
    finally:
        for call in calls:
            if not call.done():
                call.cancel()
    await response.write_eof()
    return response


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def models(request: web.Request) -> web.Response:
    gw: Gateway = request.app[GATEWAY_KEY]
    served = await gw.served_model(gw.metadata(request), refresh=True)
    data = [wire.ModelCard(id=mid) for mid in dict.fromkeys([served, schema.MODEL_ALIAS]) if mid]
    return _json(wire.ModelList(data=data).model_dump())


async def health(request: web.Request) -> web.Response:
    """200 when the orchestrator is SERVING (no auth: probes)."""
    gw: Gateway = request.app[GATEWAY_KEY]
    try:
        reply = await health_pb2_grpc.HealthStub(gw.channel).Check(
            health_pb2.HealthCheckRequest(), timeout=HEALTH_TIMEOUT_S
        )
        state = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    except grpc.aio.AioRpcError as exc:
        state = f"{exc.code().name}: {exc.details()}"
    ok = state == "SERVING"
    return _json(
        {"status": "ok" if ok else "unavailable", "orchestrator": gw.cfg.orchestrator, "orchestrator_health": state},
        200 if ok else 503,
    )


def build_app(cfg: GatewayConfig) -> web.Application:
    """The aiohttp application (the channel opens on startup, closes on cleanup)."""
    app = web.Application(middlewares=[errors_middleware], client_max_size=cfg.max_body_bytes)
    gateway = Gateway(cfg)
    app[GATEWAY_KEY] = gateway

    async def on_startup(_: web.Application) -> None:
        await gateway.open()

    async def on_cleanup(_: web.Application) -> None:
        await gateway.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    return app
