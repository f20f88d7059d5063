"""The interceptors every service installs: drain gate, error mapping and bearer-token auth."""

from __future__ import annotations

import asyncio
import hmac
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc

from specdec.errors import SpecDecError

log = logging.getLogger("specdec.server")

# Methods that never need a token: probes and reflection.
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def status_of(exc: Exception, method: str) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """(code, message, trailing metadata) a call that raised `exc` ends with: a SpecDecError's own status;
    anything else is logged and becomes INTERNAL."""
    if isinstance(exc, SpecDecError):
        return exc.code, str(exc), exc.trailing_metadata()
    log.error("unhandled error in %s", method, exc_info=exc)
    return grpc.StatusCode.INTERNAL, f"internal error in {method}: {type(exc).__name__}: {exc}", ()


async def _abort_for(exc: Exception, context: grpc.aio.ServicerContext, method: str) -> None:
    """Abort with the status of a SpecDecError; anything else is logged and becomes INTERNAL."""
    await context.abort(*status_of(exc, method))


def _wrap_unary(behavior: Callable[..., Awaitable[Any]], method: str) -> Callable[..., Awaitable[Any]]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behavior(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001 - the one place that turns surprises into a status
            await _abort_for(exc, context, method)

    return handler


def _wrap_stream(behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            async for item in behavior(request, context):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001
            await _abort_for(exc, context, method)

    return handler


class ErrorMappingInterceptor(grpc.aio.ServerInterceptor):
    """Maps SpecDecError subclasses to their status code; anything else to INTERNAL."""

    async def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=_wrap_unary(handler.unary_unary, details.method))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=_wrap_stream(handler.unary_stream, details.method))
        return handler


def _refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that aborts every call with `code` and `message`."""

    async def abort(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    async def abort_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)
        yield  # pragma: no cover - makes this an async generator

    if handler.response_streaming:  # requests are left unparsed (raw bytes): a refusal never reads them
        if handler.request_streaming:
            return grpc.stream_stream_rpc_method_handler(abort_stream)
        return grpc.unary_stream_rpc_method_handler(abort_stream)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(abort)
    return grpc.unary_unary_rpc_method_handler(abort)


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Requires `authorization: Bearer <token>` matching one of the configured tokens."""

    def __init__(self, tokens: Iterable[str]) -> None:
        self._tokens = tuple(t for t in tokens if t)

    def _allowed(self, metadata: Iterable[tuple[str, Any]]) -> bool:
        for key, value in metadata or ():
            if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
                presented = value[len("Bearer ") :].encode()
                return any(hmac.compare_digest(presented, t.encode()) for t in self._tokens)
        return False

    async def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails) -> Any:
        if not self._tokens or details.method.startswith(OPEN_METHOD_PREFIXES):
            return await continuation(details)
        if self._allowed(details.invocation_metadata):
            return await continuation(details)
        handler = await continuation(details)
        if handler is None:
            return None
        message = "missing or invalid bearer token (metadata 'authorization: Bearer <token>')"
        return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED, message)


DRAINING_MESSAGE = "this replica is draining (shutting down); retry on another replica"


class DrainGate(grpc.aio.ServerInterceptor):
    """Counts the RPCs in flight and, once `close()` is called, refuses new ones with UNAVAILABLE.

    grpc's own `server.stop(grace)` cancels a call that arrives while it runs (the caller sees CANCELLED, which
    general gRPC clients do not retry; our orchestrator does, orchestrator/replicas.py RETRYABLE, for the calls
    that still slip between `wait_idle()` and the stop), so the server keeps running while it drains: new
    calls are answered UNAVAILABLE by this gate, and `stop` is called once `wait_idle()` returns. Health and
    reflection pass untouched and uncounted (a probe must see NOT_SERVING; a Health.Watch stream must not hold
    the drain).
    """

    def __init__(self) -> None:
        self.closed = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def close(self) -> None:
        """Refuse every new call from now on."""
        self.closed = True

    async def wait_idle(self) -> None:
        """Return once no counted call is in flight."""
        await self._idle.wait()

    def enter(self) -> None:
        """Count a call as in flight until leave()."""
        self._in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    def _counted(self, behavior: Callable[..., Any]) -> Callable[..., Any] | None:
        if inspect.isasyncgenfunction(behavior):

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                self.enter()
                try:
                    async for item in behavior(request, context):
                        yield item
                finally:
                    self.leave()

            return stream
        if inspect.iscoroutinefunction(behavior):

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                self.enter()
                try:
                    return await behavior(request, context)
                finally:
                    self.leave()

            return unary
        return None

    async def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_METHOD_PREFIXES):
            return handler
        if self.closed:
            return _refusal(handler, grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE)
        for kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            behavior = getattr(handler, kind)
            counted = self._counted(behavior) if behavior is not None else None
            if counted is not None:
                return handler._replace(**{kind: counted})
        return handler
