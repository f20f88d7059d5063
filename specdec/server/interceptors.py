"""The interceptors every service installs: error mapping and bearer-token auth."""

from __future__ import annotations

import hmac
import logging
from typing import Any, Awaitable, Callable, Iterable

import grpc

from specdec.errors import SpecDecError

log = logging.getLogger("specdec.server")

# Methods that never need a token: probes and reflection.
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


async def _abort_for(exc: Exception, context: grpc.aio.ServicerContext, method: str) -> None:
    """Abort with the status of a SpecDecError; anything else is logged and becomes INTERNAL."""
    metadata: tuple[tuple[str, str], ...] = ()
    if isinstance(exc, SpecDecError):
        code, message, metadata = exc.code, str(exc), exc.trailing_metadata()
    else:
        log.exception("unhandled error in %s", method)
        code, message = grpc.StatusCode.INTERNAL, f"internal error in {method}: {type(exc).__name__}: {exc}"
    await context.abort(code, message, metadata)


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
        if handler.stream_stream is not None:  # round streams: a call's error ends the stream with its status
            return handler._replace(stream_stream=_wrap_stream(handler.stream_stream, details.method))
        return handler


def _deny(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    async def abort(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)
    return grpc.unary_unary_rpc_method_handler(abort)


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Requires `authorization: Bearer <token>` matching one of the configured tokens."""

    def __init__(self, tokens: Iterable[str]) -> None:
        self._tokens = tuple(t for t in tokens if t)

    def _allowed(self, metadata: Iterable[tuple[str, Any]]) -> bool:
        for key, value in metadata or ():
            if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
                presented = value[len("Bearer "):].encode()
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
        if handler.response_streaming:
            async def abort_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
                yield  # pragma: no cover - makes this an async generator
            if handler.request_streaming:
                return grpc.stream_stream_rpc_method_handler(abort_stream)
            return grpc.unary_stream_rpc_method_handler(abort_stream)
        return _deny(grpc.StatusCode.UNAUTHENTICATED, message)
