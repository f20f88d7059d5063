"""`specdec bench`: our stack against itself (k = 0, a sweep of k, the server default) and against
Hugging Face (target-only and assisted generation), on the same prompts, in one run.

Order: for each repeat, for each prompt, every configuration once (A B C ... A B C ...), so slow
drift of the machine (other load, thermal) hits every configuration alike; medians over the
repeats with min/max are reported (:mod:`specdec.bench.report`).

Every configuration is greedy with ``ignore_eos`` and the same ``max_new_tokens``, so each
generates the same number of tokens; the token ids of every configuration are compared with
our k = 0 (and HF target-only), and a difference is classified as a near-tie or not by the
target's top-2 logit gap at the first differing position.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from specdec.bench.identity import identity_report
from specdec.bench.machine import machine_info, peak_rss_bytes
from specdec.bench.plan import (
    HF_ASSISTED,
    WARMUP_TOKENS,
    BenchArgs,
    Config,
    Prompt,
    RunRecord,
    adaptive_supported,
    load_prompts,
    make_configs,
)
from specdec.bench.stack_client import StackClient, round_dict, stats_dict
from specdec.params import MODEL_DRAFT_KINDS

DEFAULT_K = (2, 4, 8, 12)
# Defaults sized for `make bench` on the 2-core machine (see bench/README.md for the estimate).
DEFAULT_MAX_NEW_TOKENS = 64
DEFAULT_REPEATS = 2
DEFAULT_PROMPTS_PER_SET = 5
QUICK = {"prompts_per_set": 1, "max_new_tokens": 24, "repeats": 1, "verify_reps": 2}


def run(args: BenchArgs) -> dict[str, Any]:
    """The whole bench: the HF anchors loaded, our stack measured on every configuration, v(n)
    measured in process, then the report (with the llama.cpp anchor when asked)."""
    from specdec.bench import report
    from specdec.engine.kvcache import kv_bytes_per_token
    from specdec.params import DEFAULTS

    t_start = time.perf_counter()
    phases: dict[str, float] = {}
    machine = machine_info()
    adaptive_cap = (args.adaptive_cap or max(args.ks, default=0)) if args.with_adaptive and adaptive_supported() else 0
    configs = make_configs(args.ks, args.with_default_k, args.with_hf, adaptive_cap)
    prompts = load_prompts(args.prompts, args.prompts_per_set, Path(args.prompts_dir))
    hf, hf_settings, configs = _load_hf(args, prompts, configs, phases)
    with contextlib.ExitStack() as held:
        anchors = _open_anchors(args, held, phases)
        records, rss, stats_error = _measure_stack(args, hf, prompts, configs, phases, list(anchors.values()))
        anchor_results = {name: a.result() for name, a in anchors.items()}
    probe = _engine_probe(args)
    verify_hf, verify, layout, c = _measure_verify_costs(args, hf, phases, probe)
    rss["bench (HF in-process)"] = peak_rss_bytes(os.getpid())
    identity = identity_report(records, prompts, configs, hf, probe.top2_gap if probe is not None else None)
    settings = _settings(args, prompts, configs, hf, adaptive_cap, layout)
    settings["engine"], settings["engine_option"] = ("llamacpp" if probe is not None else "torch"), args.engine
    if probe is not None:  # the target's weights as served (HF's own anchors keep hf_dtype)
        settings["dtype"], settings["hf_dtype"] = probe.runner.file_type, hf.dtype
    settings["generations"] = {"measured": len(records), "planned": args.repeats * len(prompts) * len(configs)}
    result = report.build(
        records,
        configs,
        prompts,
        settings=settings,
        machine=machine,
        hf_settings=hf_settings.record(),
        verify=verify,
        draft_step_cost=c,
        identity=identity,
        rss=rss,
        kv_per_token_model={"target": kv_bytes_per_token(hf.model.config, 4)},
        default_k=DEFAULTS["k"],
        stats_error=stats_error,
    )
    if verify is not verify_hf:
        result["verify_cost_hf_layout"] = {k: v for k, v in verify_hf.items() if k != "kv_bytes_per_token_measured"}
    if hasattr(os, "getloadavg"):
        result["machine"]["load_avg_at_end"] = list(os.getloadavg())
    result.update(anchor_results)
    if "llama_server" in result:
        from specdec.bench.llama_server import server_identity

        result["identity_vs_llama_server"] = server_identity(
            records,
            prompts,
            result["llama_server"],
            probe.top2_gap if probe is not None else None,
            probe.is_eog if probe is not None else None,
        )
    if probe is not None:
        probe.close()
    phases["total_s"] = time.perf_counter() - t_start
    result["runtime_s"] = {k: round(v, 1) for k, v in phases.items()}
    return result


def _load_hf(
    args: BenchArgs, prompts: list[Prompt], configs: list[Config], phases: dict[str, float]
) -> tuple[Any, Any, list[Config]]:
    """The in-process HF model (anchors, chat template, v(n)); the prompts get their ids from its
    template. Returns (hf, its settings, the configurations HF can run)."""
    from specdec.bench.hf_baselines import HFBaselines, HFSettings

    hf_settings = HFSettings(
        draft_kind=args.draft_kind,
        prompt_lookup_num_tokens=args.hf_lookup_tokens,
        max_matching_ngram_size=args.hf_ngram_size,
        assistant_model=args.draft_model,
    )
    t0 = time.perf_counter()
    hf = HFBaselines(args.target_model, args.threads, hf_settings, "float32" if args.dtype == "auto" else args.dtype)
    if not hf.can_assist:  # HF has no assisted generation with a feature (EAGLE-style) draft
        configs = [c for c in configs if c.name != HF_ASSISTED]
    for p in prompts:
        p.ids = hf.chat_ids(p.user)
    phases["hf_load_s"] = time.perf_counter() - t0
    return hf, hf_settings, configs


def _measure_stack(
    args: BenchArgs,
    hf: Any,
    prompts: list[Prompt],
    configs: list[Config],
    phases: dict[str, float],
    anchors: Sequence[Anchor] = (),
) -> tuple[list[RunRecord], dict[str, dict[str, Any]], str]:
    """Every (repeat, prompt, configuration) once, interleaved, on one local stack, each prompt then on the
    llama.cpp anchors. Returns (records, peak RSS per process, the stats error if the services' stats failed)."""
    from tqdm import tqdm

    from specdec.launcher import LocalStack, StackConfig

    hop_env = {"SPECDEC_HOP_DELAY_MS": str(args.hop_delay_ms)} if args.hop_delay_ms > 0 else {}
    stack = LocalStack(
        StackConfig(
            target_model=args.target_model,
            draft_kind=args.draft_kind,
            draft_model=args.draft_model,
            threads=args.threads,
            dtype=args.dtype,
            engine=args.engine,
            extra_env=hop_env,
        )
    )
    records: list[RunRecord] = []
    t0 = time.perf_counter()
    try:
        stack.start()
        phases["stack_start_s"] = time.perf_counter() - t0
        client = StackClient(stack)
        try:
            t0 = time.perf_counter()
            _warm_up(client, hf, prompts, configs)
            for anchor in anchors:
                anchor.warm_up(prompts[0].ids)
            phases["warmup_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            total = args.repeats * len(prompts) * len(configs)
            with tqdm(total=total, desc="bench", unit="gen", disable=not args.progress, file=sys.stderr) as bar:

                def one(p: Prompt, cfg: Config, rep: int) -> RunRecord:
                    bar.set_postfix_str(f"rep {rep + 1} {p.set}/{p.id} {cfg.name}", refresh=False)
                    record = _one(client, hf, p, cfg, rep, args.max_new_tokens)
                    bar.update()
                    return record

                records = measure_loop(one, prompts, configs, args.repeats, args.time_budget_s, anchors=anchors)
            phases["measure_s"] = time.perf_counter() - t0
            rss = {proc.role: peak_rss_bytes(proc.popen.pid) for proc in stack.procs}
            redis_proc = getattr(stack.redis, "_proc", None)
            if redis_proc is not None:
                rss["redis"] = peak_rss_bytes(redis_proc.pid)
        finally:
            stats_error = client.stats_error
            client.close()
    finally:
        stack.stop()
    return records, rss, stats_error


def measure_loop(
    one: Callable[[Prompt, Config, int], RunRecord],
    prompts: list[Prompt],
    configs: list[Config],
    repeats: int,
    budget_s: float = 0.0,
    clock: Callable[[], float] = time.perf_counter,
    anchors: Sequence[Anchor] = (),
) -> list[RunRecord]:
    """Every (repeat, prompt, configuration) once through `one`: for each repeat, the prompt sets taken
    in turn (one prompt of each, then the next), every configuration on each prompt (A B C .. A B C ..),
    then the prompt on each anchor. With a budget (seconds, > 0), no prompt is started once it is spent;
    the prompts measured so far have every configuration, so the ratios of a stopped run compare like with like."""
    order = interleave_sets(prompts)
    records: list[RunRecord] = []
    start = clock()
    for rep in range(repeats):
        for p in order:
            if budget_s > 0 and records and clock() - start >= budget_s:
                return records
            records.extend(one(p, cfg, rep) for cfg in configs)
            for anchor in anchors:
                anchor.measure(p)
    return records


def interleave_sets(prompts: list[Prompt]) -> list[Prompt]:
    """The prompts with the sets taken in turn (g1 o1 g2 o2 ..), each set in its own order."""
    by_set: dict[str, list[Prompt]] = {}
    for p in prompts:
        by_set.setdefault(p.set, []).append(p)
    columns = list(by_set.values())
    return [col[i] for i in range(max(map(len, columns), default=0)) for col in columns if i < len(col)]


def _engine_probe(args: BenchArgs) -> Any:
    """The target's GGUF on an in-process llama.cpp runner where the target service ran llama.cpp, else None."""
    from specdec.config import ModelServiceConfig
    from specdec.engine.loading import choose_engine

    cfg = ModelServiceConfig(role="target", model=args.target_model, engine=args.engine, dtype=args.dtype)
    if choose_engine(cfg) != "llamacpp":
        return None
    from specdec.bench.llamacpp import LlamaCppProbe, target_gguf

    return LlamaCppProbe(str(target_gguf(args.target_model)), args.threads)


class Anchor(Protocol):
    """llama.cpp as the CPU user runs it, measured inside the bench's loop (specdec/bench/llamacpp.py,
    specdec/bench/llama_server.py): each prompt right after our configurations ran it."""

    def warm_up(self, ids: Sequence[int]) -> None: ...

    def measure(self, p: Prompt) -> None: ...

    def result(self) -> dict[str, Any]: ...


def _open_anchors(args: BenchArgs, held: contextlib.ExitStack, phases: dict[str, float]) -> dict[str, Anchor]:
    """The anchors asked for, started (held open by `held`): result key -> anchor."""
    from specdec.bench.llama_server import ServerAnchors
    from specdec.bench.llamacpp import LibraryAnchor, target_gguf

    t0 = time.perf_counter()
    anchors: dict[str, Anchor] = {}
    if args.with_llamacpp:
        anchors["llamacpp"] = held.enter_context(LibraryAnchor(args.target_model, args.threads, args.max_new_tokens))
    if args.with_llama_server:
        server = ServerAnchors(
            target_gguf(args.target_model),
            args.threads,
            args.max_new_tokens,
            args.llama_server_configs,
            args.llama_server,
        )
        anchors["llama_server"] = held.enter_context(server)
    phases["anchors_start_s"] = time.perf_counter() - t0
    return anchors


def _measure_verify_costs(
    args: BenchArgs, hf: Any, phases: dict[str, float], probe: Any = None
) -> tuple[dict, dict, str, float]:
    """v(n) in process after the stack stopped: HF's layout, the services' layout (or engine: `probe`, the
    llama.cpp runner), and the draft's step cost c relative to the target as served.
    Returns (verify_hf, verify, layout, c)."""
    from tqdm import tqdm

    from specdec.params import DEFAULTS

    t0 = time.perf_counter()
    default_k = DEFAULTS["k"] if isinstance(DEFAULTS["k"], int) else 0
    n_max = max(list(args.ks) + [default_k]) + 1
    with tqdm(total=1, desc="verify cost v(n)", disable=not args.progress, file=sys.stderr) as bar:
        verify_hf = hf.verify_costs(n_max, args.verify_context, args.verify_reps)
        if probe is not None:
            verify, layout = probe.verify_costs(n_max, args.verify_context, args.verify_reps), probe.describe()
        else:
            verify, layout = _services_verify_costs(hf, verify_hf, n_max, args)
        c = hf.draft_step_cost(args.verify_context, args.verify_reps)
        bar.update()
    phases["verify_cost_s"] = time.perf_counter() - t0
    return verify_hf, verify, layout, c


def _settings(
    args: BenchArgs, prompts: list[Prompt], configs: list[Config], hf: Any, adaptive_cap: int, layout: str
) -> dict[str, Any]:
    """What the run was: prompts, lengths, configurations, threads, order and timing rules."""
    from specdec.config import OrchestratorConfig
    from specdec.params import DEFAULTS

    model_draft = args.draft_kind in MODEL_DRAFT_KINDS
    return {
        "prompt_sets": args.prompts,
        "prompts_per_set": args.prompts_per_set,
        "prompts": {s: [p.id for p in prompts if p.set == s] for s in args.prompts},
        "prompt_tokens": {s: [len(p.ids) for p in prompts if p.set == s] for s in args.prompts},
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "k_sweep": args.ks,
        "server_default_k": DEFAULTS["k"],
        "adaptive_k_cap": adaptive_cap or None,
        "greedy": True,
        "ignore_eos": True,
        "quick": args.quick,
        "target_model": args.target_model,
        "target_model_id": hf.model_id,
        "dtype": hf.dtype,
        "draft_kind": args.draft_kind,
        "draft_model": args.draft_model or None,
        "threads": {
            "target_service": args.threads,
            "draft_service": args.threads if model_draft else "n/a (n-gram draft, no torch work)",
            "orchestrator": "n/a (no torch work)",
            "hf_in_process": args.threads,
        },
        "order": "interleaved: for each repeat, the sets' prompts in turn, every configuration once on each "
        "(A B C .. A B C ..)",
        "time_budget_s": args.time_budget_s or None,
        "timing": "wall clock at the client from sending the request to the last token (prefill included)",
        "configs": {cfg.name: cfg.label(DEFAULTS["k"]) for cfg in configs},
        "hop_delay_ms": args.hop_delay_ms,
        "decode_steps": OrchestratorConfig().decode_steps,  # SPECDEC_DECODE_STEPS as the stack read it
        "target_weight_layout": layout,
    }


def _warm_up(client: StackClient, hf: Any, prompts: list[Prompt], configs: list[Config]) -> None:
    """One short generation per configuration kind, not recorded (first-call costs)."""
    p = prompts[0]
    for cfg in configs:
        if cfg.kind == "stack" and (cfg.k in (0, None) or cfg.adaptive):
            _, _, _, final, _ = client.generate(p, cfg.k, WARMUP_TOKENS, cfg.adaptive)
            client.memory_after(final.session_id)
        elif cfg.kind == "hf":
            hf.generate(p.ids, WARMUP_TOKENS, cfg.assisted)


def _one(client: StackClient, hf: Any, p: Prompt, cfg: Config, rep: int, max_new: int) -> RunRecord:
    if cfg.kind == "hf":
        r = hf.generate(p.ids, max_new, cfg.assisted)
        return RunRecord(p.set, p.id, cfg.name, rep, r.token_ids, r.wall_s, r.arrivals)
    tokens, wall, arrivals, final, rounds = client.generate(p, cfg.k, max_new, cfg.adaptive)
    if final is None:
        raise RuntimeError(f"{p.id} {cfg.name}: the stream ended without a final chunk")
    rec = RunRecord(
        p.set, p.id, cfg.name, rep, tokens, wall, arrivals, stats_dict(final.stats), [round_dict(r) for r in rounds]
    )
    rec.memory = client.memory_after(final.session_id)
    return rec


def _services_verify_costs(hf: Any, verify_hf: dict, n_max: int, args: BenchArgs) -> tuple[dict, str]:
    """v(n) as the target service computes it: with the CPU linear kernels the service chose at load
    (specdec/models/kernels.py: the cached choice for this CPU, threads and shapes, or measured now),
    measured on the same in-process model after the HF runs."""
    import torch

    from specdec.config import ModelServiceConfig
    from specdec.engine.kernel_select import plan_model
    from specdec.engine.torch_loading import QUANTIZED_KERNELS
    from specdec.models.load_config import load_config

    cfg = ModelServiceConfig(role="target")
    if hf.dtype in QUANTIZED_KERNELS:
        return verify_hf, f"{hf.dtype} weights ({QUANTIZED_KERNELS[hf.dtype]})"
    if hf.model.device.type != "cpu" or hf.model.dtype not in (torch.float32, torch.bfloat16):
        return verify_hf, "nn.Linear ([out, in])"
    plan = plan_model(hf.model, hf.model, cfg.kernels, load_config(cache_dir=cfg.cache_dir).cache_root(), None)
    if set(plan.kernels) == {"linear"}:
        return verify_hf, f"nn.Linear ([out, in]); kernels {plan.describe()}"
    return hf.verify_costs(n_max, args.verify_context, args.verify_reps), f"kernels {plan.describe()}"
