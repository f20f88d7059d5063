"""What the draft and target services share: Info, Release, loading, and the serve loop."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any, Callable

import grpc

from specdec.config import ModelServiceConfig
from specdec.engine.loading import ModelBundle
from specdec.engine.worker import ModelWorker
from specdec.errors import Unavailable
from specdec.protocol import PROTOCOL_VERSION
from specdec.server.app import GrpcApp
from specdec.v1 import common_pb2

log = logging.getLogger("specdec.server")


class ModelServiceBase:
    """State and the calls both model servicers have (Info, Release)."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.bundle: ModelBundle | None = None
        self.worker = ModelWorker(role)

    def loaded(self) -> ModelBundle:
        """The loaded bundle, or UNAVAILABLE while the model is still loading."""
        if self.bundle is None:
            raise Unavailable(f"the {self.role} model is still loading")
        return self.bundle

    async def Info(self, request: Any, context: grpc.aio.ServicerContext) -> common_pb2.ModelInfo:
        bundle = self.loaded()
        return common_pb2.ModelInfo(protocol_version=PROTOCOL_VERSION, role=self.role, **bundle.info)

    async def Stats(self, request: Any, context: grpc.aio.ServicerContext) -> common_pb2.ServiceStats:
        state, pool = self.worker.state, self.bundle.pool if self.bundle is not None else None
        out = common_pb2.ServiceStats(calls=state.calls, failures=state.failures, in_flight=state.in_flight,
                                      last_call_ok=state.last_ok, last_error=state.last_error)
        if pool is not None:
            c = pool.counters
            out.MergeFrom(common_pb2.ServiceStats(
                cached_sessions=pool.session_count(), cache_used_bytes=pool.used_bytes(),
                cache_budget_bytes=pool.budget_bytes, cache_hits=c.hits, cache_misses=c.misses,
                cache_rollbacks=c.rollbacks, rolled_back_tokens=c.rolled_back_tokens, cache_evictions=c.evictions,
                computed_tokens=c.computed_tokens, reused_tokens=c.reused_tokens))
        return out

    async def Release(self, request: Any, context: grpc.aio.ServicerContext) -> common_pb2.ReleaseResponse:
        bundle = self.loaded()
        released = bundle.pool.release(request.session_id) if bundle.pool is not None else False
        return common_pb2.ReleaseResponse(released=released)


async def run_model_service(cfg: ModelServiceConfig, servicer: ModelServiceBase, service_name: str,
                            add_to_server: Callable[[Any, grpc.aio.Server], None],
                            load: Callable[[ModelServiceConfig], ModelBundle]) -> None:
    """Bind (NOT_SERVING), load the model off the loop, serve, drain on SIGTERM."""
    tokens = (cfg.server.service_token,) if cfg.server.service_token else ()
    app = GrpcApp(service_name, cfg.server, tokens)
    port = await app.start(lambda server: add_to_server(servicer, server))
    app.install_signal_handlers()
    print(f"specdec {servicer.role} listening on {cfg.server.host}:{port}", file=sys.stderr, flush=True)
    try:
        servicer.bundle = await asyncio.to_thread(load, cfg)
    except Exception:
        app.request_stop()
        await app.run_until_stopped()
        raise
    log.info("%s model %s loaded in %.1fs", servicer.role, servicer.bundle.model_id, servicer.bundle.load_seconds)
    await app.set_serving(True)
    await app.run_until_stopped(on_drain=None)
    servicer.worker.shutdown()
