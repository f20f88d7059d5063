"""Build a draft or target engine from a model service config (model, cache pool, info)."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from specdec.config import ModelServiceConfig
from specdec.engine.draft import COMBINED, DRAFT_SERVICE_KINDS, MODEL, NGRAM, CombinedDraft, ModelDraft, NgramDraft
from specdec.engine.feature import FeatureDraft
from specdec.engine.kvcache import KVCachePool
from specdec.engine.runner import Runner
from specdec.engine.target import TargetEngine
from specdec.models.load_config import load_config
from specdec.models.resolve import resolve_gguf_file
from specdec.models.spec import parse_model_spec
from specdec.models.tokenizer_apart import describe_apart

if TYPE_CHECKING:
    from specdec.models.kernels import KernelPlan

log = logging.getLogger("specdec.engine")


@dataclass
class ModelBundle:
    """A loaded model service: its engines and what Info reports."""

    role: str
    model_id: str
    engines: dict[str, Any]  # kind -> engine ("target", "model", "ngram", "combined")
    default_kind: str
    info: dict[str, Any] = field(default_factory=dict)
    pool: KVCachePool | None = None
    load_seconds: float = 0.0
    batch_wait_s: float = 0.0  # target: how long a batch waits for its group (BatchQueue)
    inline_max_tokens: int = 0  # calls this small run on the event loop (ModelWorker.run_on_thread)
    loop_forwards: bool = False  # every forward runs on the event loop (forwards_on_loop)
    prefill_chunk_tokens: int = 0  # longer prefills run in chunks of this size (BatchQueue; model drafts)
    prefill_turn_ms: float = 0.0  # target: a long prefill's turn while others decode (BatchQueue)
    kernels: KernelPlan | None = None  # the CPU linear kernels chosen at load (Info metadata, metrics)
    engine: str = "torch"  # the runner's engine, and what it says of itself (Info metadata)
    engine_detail: str = ""


def choose_engine(cfg: ModelServiceConfig) -> str:
    """SPECDEC_ENGINE / --engine as it applies: auto runs a GGUF model on CPU (the embedded default included)
    with llama.cpp where llama-cpp-python is installed, at the GGUF's own precision (--dtype auto), and
    everything else with torch (a --dtype other than auto is torch's). The setting is checked, and lower-cased,
    when the configuration is built (specdec/settings/model_service.py)."""
    if cfg.engine != "auto":
        return cfg.engine
    from specdec.engine.llamacpp_lib import available

    on_cpu = cfg.device == "cpu" or (cfg.device in ("auto", "") and not torch.cuda.is_available())
    if not (on_cpu and parse_model_spec(cfg.model).is_gguf and cfg.dtype in ("auto", "")):
        return "torch"
    if not available():
        log.warning("%s: llama-cpp-python is not installed: running the GGUF with torch", cfg.model)
        return "torch"
    return "llamacpp"


def _load_llamacpp(cfg: ModelServiceConfig) -> tuple[Any, dict[str, Any], float]:
    """A GGUF model on the llama.cpp runner, its tokenizer read from the GGUF: (runner, info, load seconds)."""
    from specdec.engine.llamacpp_runner import LlamaCppRunner, LlamaCppSettings

    spec = parse_model_spec(cfg.model)
    if not spec.is_gguf:
        raise ValueError(f"the llama.cpp engine runs GGUF models; {cfg.model} is not one (use --engine torch)")
    if cfg.device not in ("auto", "", "cpu"):
        raise ValueError(f"the llama.cpp engine runs on the CPU here, not on {cfg.device!r}")
    started = time.perf_counter()
    load_cfg = load_config("cpu", "auto", cfg.cache_dir, cfg.offline)
    path, _ = resolve_gguf_file(spec, load_cfg)
    tok = describe_apart(cfg.model, cfg.cache_dir, load_cfg.offline)  # transformers' GGUF reader stays out
    eos = list(tok.eos_ids)
    torch.set_num_threads(1)  # torch only runs the accept rule here: no OpenMP team beside ggml's
    ll = cfg.llamacpp
    settings = LlamaCppSettings(
        threads=cfg.threads if cfg.threads > 0 else len(os.sched_getaffinity(0)),
        kv_tokens=ll.kv_tokens,
        budget_bytes=cfg.cache_budget_bytes,
        sessions=ll.sessions,
        batch_tokens=ll.batch_tokens,
        ubatch_tokens=ll.ubatch_tokens,
        flash_attn=ll.flash_attn,
        share_min_tokens=cfg.prefix_share_min_tokens,
        idle_tokens=ll.idle_tokens,
        idle_seconds=ll.idle_seconds,
    )
    runner = LlamaCppRunner(path, settings)
    info = dict(
        model_id=cfg.model,
        vocab_size=tok.vocab_size,
        logits_width=runner.vocab_width,
        tokenizer_fingerprint=tok.fingerprint,
        eos_token_ids=eos,
        max_context=runner.max_context,
        special_tokens=tok.special_tokens,
        device="cpu",
        dtype=runner.file_type,
        hidden_size=runner.hidden_size,
        cache_budget_bytes=runner.pool.budget_bytes,
        max_k=cfg.max_k,
    )
    seconds = time.perf_counter() - started
    log.info(
        "%s: llama.cpp (%s kernels, %d threads, %d KV cells, %d sessions) loaded in %.2fs",
        cfg.model,
        runner.lib.cpu_variant or "built-in",
        settings.threads,
        runner.kv_tokens,
        settings.sessions,
        seconds,
    )
    return runner, info, seconds


def forwards_on_loop(
    configured: int, device: str = "cpu", bounded_passes: bool = True, threads: int | None = None
) -> bool:
    """SPECDEC_LOOP_FORWARDS as it applies (-1 auto: on CPU while torch runs more than one thread, in a service
    whose passes are bounded: chunked prefill in a target or a model draft). There a forward on any second
    thread gets an OpenMP team of its own (see ModelWorker.setup), so every forward runs on the event loop's
    thread and none on a model thread: one team, and no hand-off to the model thread and back (two thread
    wake-ups a round). The loop is busy for each pass, so auto leaves a service whose passes are not bounded
    (a feature draft catches up in one call) on its model thread, and a GPU model too (not measured)."""
    if configured >= 0:
        return configured > 0
    threads = torch.get_num_threads() if threads is None else threads
    return bounded_passes and device == "cpu" and threads > 1


def inline_limit(configured: int, loop_forwards: bool = False, threads: int | None = None) -> int:
    """SPECDEC_INLINE_MAX_TOKENS as it applies: small forwards run on the event loop while torch runs ONE
    thread, or when every forward runs there (forwards_on_loop). Otherwise the event loop's thread would
    get an OpenMP team of its own beside the model thread's (see ModelWorker.setup): measured in the
    stack at 2 threads, a decode step took 38.7 ms with small forwards inline vs 22.4 ms with every
    forward on the model thread."""
    threads = torch.get_num_threads() if threads is None else threads
    if configured > 0 and threads > 1 and not loop_forwards:
        log.info("%d engine threads: every forward runs on the model thread (no inline forwards)", threads)
        return 0
    return configured


def _load_runner(
    cfg: ModelServiceConfig, batching: bool = False, keep_hidden: bool = False
) -> tuple[Any, Runner, dict[str, Any], float, KernelPlan | None, int]:
    """The service's model on its engine: (model or None, runner, info, load seconds, kernel plan, threads).
    The torch path is imported only when it runs: a llama.cpp service never loads transformers' model code
    (about 130 MB of its resident memory)."""
    if choose_engine(cfg) == "llamacpp":
        runner, info, seconds = _load_llamacpp(cfg)
        return None, runner, info, seconds, None, runner.settings.threads
    from specdec.engine.torch_loading import load_torch

    model, _, runner, info, seconds, plan = load_torch(cfg, batching=batching, keep_hidden=keep_hidden)
    return model, runner, info, seconds, plan, torch.get_num_threads()


def load_target(cfg: ModelServiceConfig) -> ModelBundle:
    """Load the target model and its verify engine."""
    _, runner, info, seconds, plan, threads = _load_runner(cfg, batching=cfg.max_batch > 1, keep_hidden=cfg.keep_hidden)
    max_hidden_rows = max(1, cfg.max_hidden_bytes // (2 * info["hidden_size"]))  # fp16 on the wire
    engine = TargetEngine(runner, info["max_context"], cfg.max_k, max_hidden_rows)
    info["max_batch"] = cfg.max_batch if runner.batching else 1
    info["keeps_hidden"] = runner.keep_hidden
    on_loop = forwards_on_loop(cfg.loop_forwards, info["device"], cfg.prefill_chunk_tokens > 0, threads)
    return ModelBundle(
        "target",
        cfg.model,
        {"target": engine},
        "target",
        info,
        runner.pool,
        seconds,
        batch_wait_s=cfg.batch_wait_ms / 1000.0,
        inline_max_tokens=inline_limit(cfg.inline_max_tokens, on_loop, threads),
        loop_forwards=on_loop,
        prefill_chunk_tokens=cfg.prefill_chunk_tokens,
        prefill_turn_ms=cfg.prefill_turn_ms,
        kernels=plan,
        engine=runner.engine,
        engine_detail=runner.engine_detail,
    )


def load_draft(cfg: ModelServiceConfig) -> ModelBundle:
    """Load the draft: a model draft (plus n-gram and, for token-only drafts, combined for per-request
    override; `cfg.draft_kind` is the default kind), or n-gram alone."""
    ngram = NgramDraft(cfg.ngram_min_n, cfg.ngram_max_n, cfg.ngram_prefer)
    if cfg.draft_kind == NGRAM:
        info: dict[str, Any] = dict(model_id="ngram", draft_kind=NGRAM, max_k=cfg.max_k, device="cpu")
        return ModelBundle("draft", "ngram", {NGRAM: ngram}, NGRAM, info, inline_max_tokens=cfg.inline_max_tokens)
    if cfg.draft_kind not in DRAFT_SERVICE_KINDS:
        raise ValueError(f"draft kind must be one of {DRAFT_SERVICE_KINDS}, got {cfg.draft_kind!r}")
    model, runner, info, seconds, plan, threads = _load_runner(cfg)
    engines: dict[str, Any] = {NGRAM: ngram}
    if model is not None:  # torch
        from specdec.engine.torch_loading import is_feature_draft
    if model is not None and is_feature_draft(model):  # fed the target's rows every round: no lookup rounds
        if cfg.draft_kind == COMBINED:
            raise ValueError(
                "a feature (EAGLE-style) draft cannot be combined with prompt lookup; use --draft-kind model"
            )
        engines[MODEL] = FeatureDraft(model, runner.pool, info["max_context"], info["eos_token_ids"])
        info["needs_target_hidden"] = True
    else:
        engines[MODEL] = ModelDraft(runner, info["max_context"], info["eos_token_ids"])
        engines[COMBINED] = CombinedDraft(ngram, engines[MODEL])
    info["draft_kind"] = cfg.draft_kind
    chunked = cfg.prefill_chunk_tokens > 0 and MODEL in engines and hasattr(engines[MODEL], "prefill_chunk")
    on_loop = forwards_on_loop(cfg.loop_forwards, info["device"], chunked, threads)
    return ModelBundle(
        "draft",
        cfg.model,
        engines,
        cfg.draft_kind,
        info,
        runner.pool,
        seconds,
        inline_max_tokens=inline_limit(cfg.inline_max_tokens, on_loop, threads),
        loop_forwards=on_loop,
        prefill_chunk_tokens=cfg.prefill_chunk_tokens,
        kernels=plan,
        engine=runner.engine,
        engine_detail=runner.engine_detail,
    )
