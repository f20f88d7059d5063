"""`specdec serve orchestrator`: the public gRPC entry point."""

from __future__ import annotations

import asyncio
import logging
import sys
import uuid

from orchestrator.deps import Deps
from orchestrator.hop_delay import delay_hops
from orchestrator.pair import PairMonitor
from orchestrator.prompting import Prompter
from orchestrator.replicas import ReplicaPool
from orchestrator.rounds import RoundRunner
from orchestrator.servicer import SERVICE_NAME, Admission, OrchestratorServicer
from orchestrator.session_store import SessionStore, open_redis
from orchestrator.store_health import StoreProbe
from specdec.config import OrchestratorConfig
from specdec.core.ngram import NgramProposer
from specdec.metrics import serve_metrics
from specdec.models.load_config import load_config
from specdec.models.loader import load_tokenizer
from specdec.models.tokenizer_info import describe_tokenizer
from specdec.server.app import GrpcApp
from specdec.v1 import orchestrator_pb2_grpc

log = logging.getLogger("specdec.orchestrator")
FIRST_PAIR_WAIT_S = 0.5


def local_ngram(cfg: OrchestratorConfig) -> NgramProposer | None:
    """The in-process n-gram drafter, unless disabled (SPECDEC_LOCAL_NGRAM=0)."""
    return NgramProposer(cfg.ngram_min_n, cfg.ngram_max_n, cfg.ngram_prefer) if cfg.local_ngram else None


def build_pools(cfg: OrchestratorConfig) -> tuple[ReplicaPool, ReplicaPool | None]:
    """The target pool (required) and the draft pool (optional: none = target-only decoding)."""
    if not cfg.target_addresses:
        raise SystemExit("specdec orchestrator: no target address (SPECDEC_TARGET_ADDRESSES or --target)")
    target = ReplicaPool("target", cfg.target_addresses, cfg.server, cfg.retry)
    draft = ReplicaPool("draft", cfg.draft_addresses, cfg.server, cfg.retry) if cfg.draft_addresses else None
    if cfg.retry.hop_delay_ms > 0:  # bench and tests only
        for pool in filter(None, (target, draft)):
            delay_hops(pool, cfg.retry.hop_delay_ms)
    return target, draft


async def serve(cfg: OrchestratorConfig) -> None:
    """Load the tokenizer, connect Redis and the pools, serve until SIGTERM."""
    if not cfg.redis_url:
        raise SystemExit("specdec orchestrator: REDIS_URL is not set (specdec up starts an embedded Redis)")
    tokenizer = await asyncio.to_thread(
        load_tokenizer, cfg.tokenizer, load_config(cache_dir=cfg.cache_dir, offline=cfg.offline)
    )
    target, draft = build_pools(cfg)
    probe = StoreProbe(cfg.redis_url, cfg.redis_ping_timeout_s)  # health covers Redis too
    pair = PairMonitor(target, draft, describe_tokenizer(tokenizer), cfg.tokenizer, cfg.health_refresh_s, probe)
    store = SessionStore(open_redis(cfg.redis_url), prefix=cfg.redis_prefix, ttl_seconds=cfg.session_ttl_s)
    deps = Deps(
        cfg=cfg,
        store=store,
        runner=RoundRunner(draft, target, cfg.retry, local_ngram(cfg)),
        prompter=Prompter(tokenizer),
        eos_ids=frozenset(),
        max_context=0,
        owner=f"orch-{uuid.uuid4().hex[:12]}",
        model_name="",
    )
    for pool in (target, draft):
        if pool is not None:
            pool.on_context_resend = deps.metrics.observe_context_resend
    servicer = OrchestratorServicer(deps, pair, Admission(cfg.max_concurrent, metrics=deps.metrics))
    serve_metrics(cfg.server.metrics_port, deps.metrics.registry)
    app = GrpcApp(SERVICE_NAME, cfg.server, cfg.auth_tokens)
    port = await app.start(lambda server: orchestrator_pb2_grpc.add_OrchestratorServicer_to_server(servicer, server))
    app.install_signal_handlers()
    print(f"specdec orchestrator listening on {cfg.server.host}:{port}", file=sys.stderr, flush=True)

    async def on_change(ok: bool) -> None:
        info = pair.target_info()
        if info is not None:
            deps.eos_ids, deps.max_context, deps.model_name = (
                frozenset(info.eos_token_ids),
                info.max_context,
                info.model_id,
            )
        await app.set_serving(ok)

    stop = asyncio.Event()
    monitor = asyncio.create_task(pair.run(stop, on_change))
    await app.run_until_stopped()
    stop.set()
    await monitor
    await probe.close()
    await target.close()
    if draft is not None:
        await draft.close()
    await store.close()
