"""What the draft and target services share: Info, Release, loading, health, and the serve loop.

Health tells the truth (NOT_SERVING):
  * while the model loads (GrpcApp starts NOT_SERVING),
  * while the model worker's last forward failed (back to SERVING after the next success),
  * while a forward has run longer than HealthConfig.wedged_s (the worker is wedged; where every forward
    runs on the event loop, ModelWorker.use_the_loop, the health call itself waits for the forward, and a
    probe's timeout says the same),
  * while draining after SIGTERM (GrpcApp).

Observable counters (no proto change): every Info reply carries the worker's counters as
trailing metadata (WORKER_METADATA_PREFIX + calls / failures / in-flight / last-ok / inline-calls ...), which
the reliability tests read to prove that rejected or cancelled requests did no model work, and
the CPU linear kernels chosen at load (KERNEL_METADATA_KEY, KERNEL_SOURCE_KEY).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable
from typing import Any

import grpc
import torch

from specdec.config import DEFAULT_CONTEXT_STORE_TOKENS, HealthConfig, ModelServiceConfig
from specdec.engine.contexts import ContextStore
from specdec.engine.faults import inject_faults
from specdec.engine.loading import ModelBundle
from specdec.engine.worker import ModelWorker, WorkerState
from specdec.errors import Unavailable
from specdec.metrics import model_service_registry, serve_metrics
from specdec.protocol import PROTOCOL_VERSION
from specdec.server.app import GrpcApp
from specdec.v1 import common_pb2

log = logging.getLogger("specdec.server")

WORKER_METADATA_PREFIX = "specdec-worker-"
KERNEL_METADATA_KEY = "specdec-linear-kernels"
KERNEL_SOURCE_KEY = "specdec-linear-kernels-source"
ENGINE_METADATA_KEY = "specdec-engine"  # "torch" or "llamacpp;cpu=haswell,threads=2,kv=8192"


def worker_metadata(state: WorkerState) -> tuple[tuple[str, str], ...]:
    """The worker's counters as gRPC metadata pairs."""
    values = {
        "calls": state.calls,
        "failures": state.failures,
        "in-flight": state.in_flight,
        "last-ok": int(state.last_ok),
        "batches": state.batches,
        "batched-calls": state.batched_calls,
        "inline-calls": state.inline_calls,
    }
    return tuple((WORKER_METADATA_PREFIX + name, str(value)) for name, value in values.items())


def kernel_metadata(plan: Any) -> tuple[tuple[str, str], ...]:
    """The CPU linear kernels chosen at load as Info trailing metadata (ModelInfo has no field for
    them): KERNEL_METADATA_KEY = "1=im_onednn,2-5=onednn,..." and KERNEL_SOURCE_KEY = measured |
    cache | env | default | fallback."""
    if plan is None:
        return ()
    bands = ",".join(f"{band}={kernel}" for band, kernel in plan.by_band().items())
    return (KERNEL_METADATA_KEY, bands), (KERNEL_SOURCE_KEY, plan.source)


def worker_healthy(state: WorkerState, cfg: HealthConfig) -> bool:
    """False when the last forward failed or the current one runs past cfg.wedged_s."""
    wedged = cfg.wedged_s > 0 and state.busy_for() > cfg.wedged_s
    return state.last_ok and not wedged


class ModelServiceBase:
    """State and the calls both model servicers have (Info, Release)."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.bundle: ModelBundle | None = None
        self.worker = ModelWorker(role)
        self.context_store_tokens = DEFAULT_CONTEXT_STORE_TOKENS
        self._contexts: ContextStore | None = None

    def context_store(self) -> ContextStore:
        """The sessions' contexts held for delta rounds (created once the model is loaded)."""
        if self._contexts is None:
            width = self.loaded().info.get("logits_width", 0)
            self._contexts = ContextStore(self.context_store_tokens, width)
        return self._contexts

    def loaded(self) -> ModelBundle:
        """The loaded bundle, or UNAVAILABLE while the model is still loading."""
        if self.bundle is None:
            raise Unavailable(f"the {self.role} model is still loading")
        return self.bundle

    async def Info(self, request: Any, context: grpc.aio.ServicerContext) -> common_pb2.ModelInfo:
        bundle = self.loaded()
        engine = ";".join(filter(None, (bundle.engine, bundle.engine_detail)))
        context.set_trailing_metadata(
            worker_metadata(self.worker.state) + kernel_metadata(bundle.kernels) + ((ENGINE_METADATA_KEY, engine),)
        )
        return common_pb2.ModelInfo(
            protocol_version=PROTOCOL_VERSION,
            role=self.role,
            **bundle.info,
            context_delta=self.context_store_tokens > 0,
            context_store_tokens=self.context_store_tokens,
        )

    async def Stats(self, request: Any, context: grpc.aio.ServicerContext) -> common_pb2.ServiceStats:
        state, pool = self.worker.state, self.bundle.pool if self.bundle is not None else None
        out = common_pb2.ServiceStats(
            calls=state.calls,
            failures=state.failures,
            in_flight=state.in_flight,
            last_call_ok=state.last_ok,
            last_error=state.last_error,
            batches=state.batches,
            batched_calls=state.batched_calls,
        )
        if pool is not None:
            c = pool.counters
            out.MergeFrom(
                common_pb2.ServiceStats(
                    cached_sessions=pool.session_count(),
                    cache_used_bytes=pool.used_bytes(),
                    cache_budget_bytes=pool.budget_bytes,
                    cache_hits=c.hits,
                    cache_misses=c.misses,
                    cache_rollbacks=c.rollbacks,
                    rolled_back_tokens=c.rolled_back_tokens,
                    cache_evictions=c.evictions,
                    computed_tokens=c.computed_tokens,
                    reused_tokens=c.reused_tokens,
                )
            )
        if self._contexts is not None:
            ctx = self._contexts.counters
            out.MergeFrom(
                common_pb2.ServiceStats(
                    context_hits=ctx.hits, context_misses=ctx.misses, context_evictions=ctx.evictions
                )
            )
        return out

    async def Release(self, request: Any, context: grpc.aio.ServicerContext) -> common_pb2.ReleaseResponse:
        bundle = self.loaded()
        released = bundle.pool.release(request.session_id) if bundle.pool is not None else False
        released = self.context_store().release(request.session_id) or released
        return common_pb2.ReleaseResponse(released=released)


async def watch_health(app: GrpcApp, worker: ModelWorker, cfg: HealthConfig, stop: asyncio.Event) -> None:
    """Flip health between SERVING and NOT_SERVING as the worker fails and recovers."""
    serving = True
    while not stop.is_set():
        healthy = worker_healthy(worker.state, cfg)
        if healthy != serving:
            serving = healthy
            log.warning(
                "%s health -> %s%s",
                app.name,
                "SERVING" if healthy else "NOT_SERVING",
                "" if healthy else f" (last error: {worker.state.last_error or 'forward running too long'})",
            )
            await app.set_serving(healthy)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=cfg.poll_s)


async def run_model_service(
    cfg: ModelServiceConfig,
    servicer: ModelServiceBase,
    service_name: str,
    add_to_server: Callable[[Any, grpc.aio.Server], None],
    load: Callable[[ModelServiceConfig], ModelBundle],
) -> None:
    """Bind (NOT_SERVING), load the model off the loop, serve, drain on SIGTERM."""
    tokens = (cfg.server.service_token,) if cfg.server.service_token else ()
    app = GrpcApp(service_name, cfg.server, tokens)
    if cfg.health.fault_file:  # testing only
        inject_faults(servicer.worker, cfg.health.fault_file)
    servicer.context_store_tokens = cfg.context_store_tokens
    port = await app.start(lambda server: add_to_server(servicer, server))
    app.install_signal_handlers()
    print(f"specdec {servicer.role} listening on {cfg.server.host}:{port}", file=sys.stderr, flush=True)
    try:
        servicer.bundle = await servicer.worker.setup(lambda: load(cfg))
    except Exception:
        app.request_stop()
        await app.run_until_stopped()
        raise
    log.info("%s model %s loaded in %.1fs", servicer.role, servicer.bundle.model_id, servicer.bundle.load_seconds)
    bundle = servicer.bundle
    assert bundle is not None, "the model was loaded above"
    settle_threads(cfg, bundle, servicer)
    serve_metrics(
        cfg.server.metrics_port,
        model_service_registry(
            servicer.role, lambda: servicer.worker.state, lambda: bundle.pool, lambda: bundle.kernels
        ),
    )
    await app.set_serving(True)
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch_health(app, servicer.worker, cfg.health, stop))
    await app.run_until_stopped(on_drain=stop.set)
    await watcher
    servicer.worker.shutdown()


def settle_threads(cfg: ModelServiceConfig, bundle: ModelBundle, servicer: ModelServiceBase) -> None:
    """What the loaded model's torch threads decide: forwards on the event loop (the model thread exits)."""
    if cfg.threads > 0:  # on this, the event loop's, thread too: the model was loaded on another, and a thread
        torch.set_num_threads(cfg.threads)  # that ran torch before (a forked service's) keeps its own team size
    if bundle.loop_forwards:
        servicer.worker.use_the_loop()
