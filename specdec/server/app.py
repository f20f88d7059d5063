"""One way to run a gRPC service: grpc.aio, health, reflection, interceptors, drain.

Life of a service:
  1. `start()` binds the port with health NOT_SERVING (probes answer at once),
  2. the caller loads its model (slow) and calls `set_serving(True)`,
  3. SIGTERM/SIGINT -> health NOT_SERVING, new RPCs refused (UNAVAILABLE: the
     orchestrator retries them on another replica, a client on another orchestrator),
     in-flight RPCs get `drain_seconds` to finish, then the server stops and the process
     exits. The server keeps running while it drains (DrainGate answers new calls):
     grpc's own stop would cancel a call that arrives meanwhile (CANCELLED: our orchestrator
     retries that too since the call never ran, but general gRPC clients do not).

Requests are parsed by StrictParseInterceptor, not by gRPC: a message that does not
parse (e.g. a proto3 string field holding bad UTF-8) is INVALID_ARGUMENT with the
parser's message, where grpc-python would answer UNKNOWN.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from specdec.config import ServerConfig
from specdec.errors import InvalidArgument
from specdec.server.interceptors import DrainGate, ErrorMappingInterceptor, TokenAuthInterceptor
from specdec.server.tls import server_credentials

# Health service name that answers SERVING while the process runs (Kubernetes liveness): readiness ("")
# follows the model load and, in the orchestrator, its dependencies (replica pair, Redis); a
# dependency outage must take a pod out of rotation, never restart it.
LIVENESS_SERVICE = "specdec.liveness"
log = logging.getLogger("specdec.server")

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def grpc_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """Channel/server options shared by clients and servers."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]


def _parse(parse: Callable[[bytes], Any], raw: bytes, method: str) -> Any:
    try:
        return parse(raw)
    except DecodeError as exc:
        raise InvalidArgument(f"malformed {method} request: {exc}") from None


class StrictParseInterceptor(grpc.aio.ServerInterceptor):
    """Parses requests itself (those of unary-request methods) so that a malformed one is INVALID_ARGUMENT,
    not UNKNOWN.

    Installed inside ErrorMappingInterceptor, which maps the InvalidArgument it raises.
    """

    async def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        parse, method = handler.request_deserializer, details.method
        if handler.request_streaming:
            return handler
        if handler.unary_unary is not None and inspect.iscoroutinefunction(handler.unary_unary):
            behavior = handler.unary_unary

            async def unary(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
                return await behavior(_parse(parse, raw, method), context)

            return handler._replace(request_deserializer=None, unary_unary=unary)
        if handler.unary_stream is not None and inspect.isasyncgenfunction(handler.unary_stream):
            stream_behavior = handler.unary_stream

            async def stream(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
                async for item in stream_behavior(_parse(parse, raw, method), context):
                    yield item

            return handler._replace(request_deserializer=None, unary_stream=stream)
        return handler


@dataclass
class GrpcApp:
    """A grpc.aio server with the house scaffolding.

    Args:
        name: the service's full name for health and reflection, e.g. "specdec.v1.Target".
        cfg: address, message size, drain time, TLS.
        auth_tokens: bearer tokens accepted (empty = no auth).
    """

    name: str
    cfg: ServerConfig
    auth_tokens: Sequence[str] = ()
    server: grpc.aio.Server = field(init=False)
    health: HealthServicer = field(init=False)
    port: int = field(init=False, default=0)
    gate: DrainGate = field(init=False)
    _stopping: asyncio.Event = field(init=False)

    def __post_init__(self) -> None:
        self.gate = DrainGate()
        interceptors = [ErrorMappingInterceptor(), StrictParseInterceptor()]
        if self.auth_tokens:
            interceptors.insert(0, TokenAuthInterceptor(self.auth_tokens))
        interceptors.insert(0, self.gate)
        self.server = grpc.aio.server(interceptors=interceptors, options=grpc_options(self.cfg.max_message_bytes))
        self.health = HealthServicer()
        self._stopping = asyncio.Event()

    async def start(self, register: Callable[[grpc.aio.Server], None]) -> int:
        """Register the servicer, health and reflection; bind; start NOT_SERVING. Returns the port."""
        register(self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = (self.name, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, self.server)
        address = f"{self.cfg.host}:{self.cfg.port}"
        creds = server_credentials(self.cfg.tls)
        self.port = self.server.add_secure_port(address, creds) if creds else self.server.add_insecure_port(address)
        if self.port == 0:
            raise RuntimeError(f"could not bind {address}")
        await self.server.start()
        await self.set_serving(False)
        await self.health.set(LIVENESS_SERVICE, SERVING)
        log.info("%s listening on %s:%d%s", self.name, self.cfg.host, self.port, " (TLS)" if creds else "")
        return self.port

    async def set_serving(self, serving: bool) -> None:
        """Set the health status of the service and of the server as a whole ("")."""
        status = SERVING if serving and not self._stopping.is_set() else NOT_SERVING
        for service in ("", self.name):
            await self.health.set(service, status)

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT start a graceful drain."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)

    async def run_until_stopped(self, on_drain: Callable[[], None] | None = None) -> None:
        """Block until a signal, then drain: NOT_SERVING, refuse new RPCs, wait for in-flight ones."""
        await self._stopping.wait()
        log.info("%s draining (up to %.0fs)", self.name, self.cfg.drain_seconds)
        self.gate.close()
        await self.health.enter_graceful_shutdown()
        if on_drain is not None:
            on_drain()
        started = time.monotonic()
        try:
            await asyncio.wait_for(self.gate.wait_idle(), timeout=self.cfg.drain_seconds)
        except asyncio.TimeoutError:
            log.warning(
                "%s: %d calls still in flight after %.0fs; cancelling them",
                self.name,
                self.gate.in_flight,
                self.cfg.drain_seconds,
            )
        left = max(0.0, self.cfg.drain_seconds - (time.monotonic() - started))
        await self.server.stop(grace=left)
        log.info("%s stopped", self.name)

    def request_stop(self) -> None:
        """Start the drain from code (tests, CLI)."""
        self._stopping.set()
