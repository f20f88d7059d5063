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

import argparse
import asyncio
import json
import logging
import os
import platform
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec.params import MODEL_DRAFT_KINDS

log = logging.getLogger("specdec.bench")

PROMPT_SETS = ("grounded", "open")
DEFAULT_K = (2, 4, 8, 12)
# Defaults sized for `make bench` on the 2-core machine (see bench/README.md for the estimate).
DEFAULT_MAX_NEW_TOKENS = 64
DEFAULT_REPEATS = 2
DEFAULT_PROMPTS_PER_SET = 5
QUICK = {"prompts_per_set": 1, "max_new_tokens": 24, "repeats": 1, "verify_reps": 2}
VERIFY_CONTEXT_TOKENS = 300
TIE_EPSILON = 1e-4
TIE_ULPS = 2            # 16-bit dtypes: a top-2 gap within 2 units in the last place of the top logit is a tie
RPC_TIMEOUT_S = 600.0
WARMUP_TOKENS = 8
PROMPTS_DIR = Path(__file__).resolve().parents[2] / "bench" / "prompts"

K0, KDEF, ADAPTIVE, HF_TARGET, HF_ASSISTED = "k0", "kdefault", "adaptive", "hf_target", "hf_assisted"


@dataclass(frozen=True)
class Config:
    """One configuration of the comparison."""

    name: str
    kind: str                 # "stack" | "hf"
    k: int | None = None      # stack: None = the server default; with adaptive: the cap
    assisted: bool = False    # hf: assisted generation (d) instead of target-only (c)
    adaptive: bool = False    # stack: adaptive_k (each round picks k in [0, k])

    def label(self, default_k: int) -> str:
        if self.kind == "hf":
            return "HF assisted" if self.assisted else "HF target-only"
        if self.adaptive:
            return f"ours adaptive k<={self.k}"
        return f"ours k unset (default {default_k})" if self.k is None else f"ours k={self.k}"


def adaptive_supported() -> bool:
    """True when the protocol has GenerateRequest.adaptive_k."""
    from specdec.v1 import orchestrator_pb2 as pb

    return "adaptive_k" in pb.GenerateRequest.DESCRIPTOR.fields_by_name


def make_configs(ks: list[int], with_default: bool = True, with_hf: bool = True,
                 adaptive_cap: int = 0) -> list[Config]:
    configs = [Config(K0, "stack", 0)] + [Config(f"k{k}", "stack", k) for k in ks if k != 0]
    if with_default:
        configs.append(Config(KDEF, "stack", None))
    if adaptive_cap > 0:
        configs.append(Config(ADAPTIVE, "stack", adaptive_cap, adaptive=True))
    if with_hf:
        configs += [Config(HF_TARGET, "hf"), Config(HF_ASSISTED, "hf", assisted=True)]
    return configs


@dataclass
class Prompt:
    set: str
    id: str
    user: str
    ids: list[int] = field(default_factory=list)


@dataclass
class RunRecord:
    """One generation: what the bench measured from outside plus what the stack reported."""

    set: str
    prompt: str
    config: str
    repeat: int
    tokens: list[int]
    wall_s: float
    arrivals: list[tuple[float, int]]            # (seconds since the request, tokens in the chunk)
    stats: dict[str, Any] = field(default_factory=dict)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)

    def compact(self) -> dict[str, Any]:
        """The per-run row of the JSON (token ids left out; their identity is reported separately)."""
        return {"set": self.set, "prompt": self.prompt, "config": self.config, "repeat": self.repeat,
                "tokens": len(self.tokens), "wall_s": round(self.wall_s, 4),
                "ttft_ms": round(self.arrivals[0][0] * 1000, 2) if self.arrivals else None,
                **({"rounds": len(self.rounds)} if self.rounds else {}),
                **({k: self.stats[k] for k in ("draft_ms", "target_ms", "overhead_ms", "accepted_tokens",
                                                "draft_tokens") if k in self.stats})}


# -- prompts and machine --------------------------------------------------------------------------
def load_prompts(names: list[str], per_set: int, prompts_dir: Path = PROMPTS_DIR) -> list[Prompt]:
    out = []
    for name in names:
        path = prompts_dir / f"{name}.jsonl"
        if not path.is_file():
            raise SystemExit(f"specdec bench: no prompt set {name!r} ({path} missing)")
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        out += [Prompt(name, r["id"], r["user"]) for r in rows[:per_set or None]]
    return out


def machine_info() -> dict[str, Any]:
    import torch
    import transformers

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from specdec.launcher import usable_cores

    usable = usable_cores()
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {"cpu_model": cpu, "cores": os.cpu_count(), "usable_cores": usable, "memory_bytes": mem,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "load_avg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def peak_rss_bytes(pid: int) -> dict[str, Any]:
    """Peak resident memory of a process: VmHWM from /proc (psutil has no peak on Linux)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return {"bytes": int(line.split()[1]) * 1024, "source": "VmHWM"}
    except OSError:
        pass
    try:
        import psutil

        return {"bytes": psutil.Process(pid).memory_info().rss, "source": "psutil rss (current, not peak)"}
    except Exception:  # noqa: BLE001 - best effort
        return {"bytes": None, "source": "unavailable"}


# -- the stack client -----------------------------------------------------------------------------
class StackClient:
    """Talks to the orchestrator (GenerateStream) and to the model services (Stats, Release)."""

    def __init__(self, stack: Any) -> None:
        import grpc

        from specdec.v1 import draft_pb2_grpc, orchestrator_pb2_grpc, target_pb2_grpc

        self.stack = stack
        self._channels = []

        def chan(address: str) -> Any:
            c = grpc.insecure_channel(address)
            self._channels.append(c)
            return c

        self.orch = orchestrator_pb2_grpc.OrchestratorStub(chan(stack.orchestrator_address))
        self.targets = [target_pb2_grpc.TargetStub(chan(p.address)) for p in stack.procs if p.role == "target"]
        self.drafts = [draft_pb2_grpc.DraftStub(chan(p.address)) for p in stack.procs if p.role == "draft"]
        self._loop = asyncio.new_event_loop()
        self.stats_error = ""
        self._store = None
        if stack.redis is not None:
            from orchestrator.session_store import SessionStore, open_redis

            self._redis = open_redis(stack.redis.url)
            self._store = SessionStore(self._redis)

    def generate(self, prompt: Prompt, k: int | None, max_new_tokens: int,
                 adaptive: bool = False) -> tuple[list[int], float, list, Any, list]:
        from specdec.v1 import orchestrator_pb2 as pb

        req = pb.GenerateRequest(max_new_tokens=max_new_tokens, ignore_eos=True, trace=True,
                                 request_id=uuid.uuid4().hex)
        req.messages.messages.add(role="user", content=prompt.user)
        req.sampling.temperature = 0.0
        if k is not None:
            req.k = k
        if adaptive:
            req.adaptive_k = True
        tokens: list[int] = []
        arrivals: list[tuple[float, int]] = []
        rounds: list = []
        final = None
        start = time.perf_counter()
        for chunk in self.orch.GenerateStream(req, timeout=RPC_TIMEOUT_S):
            now = time.perf_counter() - start
            if chunk.token_ids:
                arrivals.append((now, len(chunk.token_ids)))
                tokens += list(chunk.token_ids)
            rounds += list(chunk.rounds)
            if chunk.HasField("finish_reason"):
                final = chunk
        wall = time.perf_counter() - start
        return tokens, wall, arrivals, final, rounds

    def memory_after(self, session_id: str) -> dict[str, Any]:
        """KV bytes held for the session on draft and target, its Redis bytes; then drop all three."""
        from specdec.v1 import common_pb2
        from specdec.v1 import orchestrator_pb2 as pb

        import grpc

        out: dict[str, Any] = {}
        for role, stubs in (("target", self.targets), ("draft", self.drafts)):
            if self.stats_error:
                break
            used, sessions = 0, 0
            try:
                for stub in stubs:
                    s = stub.Stats(common_pb2.InfoRequest(), timeout=10)
                    used += s.cache_used_bytes
                    sessions += s.cached_sessions
            except grpc.RpcError as exc:      # a service without the Stats RPC: KV bytes from the config
                self.stats_error = f"{exc.code().name}: {exc.details()}"
                log.warning("Stats RPC failed (%s); KV bytes per session are computed from the model config",
                            self.stats_error)
                break
            out[f"{role}_kv_bytes"] = used
            out[f"{role}_cached_sessions"] = sessions
        if self._store is not None:
            out["redis_bytes"] = self._loop.run_until_complete(self._store.memory_bytes(session_id))
            sess = self._loop.run_until_complete(self._store.get(session_id))
            out["session_tokens"] = len(sess.ids) if sess is not None else None
        for stubs in (self.targets, self.drafts):
            for stub in stubs:
                stub.Release(common_pb2.ReleaseRequest(session_id=session_id), timeout=10)
        self.orch.DeleteSession(pb.SessionRequest(session_id=session_id), timeout=10)
        return out

    def close(self) -> None:
        for c in self._channels:
            c.close()
        if self._store is not None:
            self._loop.run_until_complete(self._redis.aclose())
        self._loop.close()


def _round_dict(r: Any) -> dict[str, Any]:
    return {"k": r.k, "drafted": len(r.draft_ids), "accepted": r.num_accepted, "draft_ms": r.draft_ms,
            "target_ms": r.target_ms, "overhead_ms": r.overhead_ms}


def _stats_dict(stats: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(stats, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


# -- identity -------------------------------------------------------------------------------------
def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def top2_gap(hf: Any, prompt_ids: list[int], prefix: list[int]) -> tuple[float, float]:
    """The target's top-2 logit gap after prompt + prefix (one in-process forward), and the tie
    threshold at that position: TIE_EPSILON in float32; in a 16-bit dtype, TIE_ULPS units in the
    last place of the top logit (a one-token and a k+1-token forward round differently there)."""
    import torch

    with torch.inference_mode():
        logits = hf.model(input_ids=torch.tensor([prompt_ids + prefix])).logits[0, -1]
    top = torch.topk(logits.float(), 2).values
    eps = TIE_EPSILON
    if logits.dtype in (torch.bfloat16, torch.float16):
        eps = max(eps, TIE_ULPS * torch.finfo(logits.dtype).eps * abs(float(top[0])))
    return float(top[0] - top[1]), eps


def identity_report(records: list[RunRecord], prompts: list[Prompt], configs: list[Config], hf: Any) -> dict:
    """Per set and configuration: how many prompts give exactly the tokens of our k = 0 (repeat 0)."""
    by = {(r.set, r.prompt, r.config): r for r in records if r.repeat == 0}
    ids = {(p.set, p.id): p.ids for p in prompts}
    out: dict[str, Any] = {}
    for set_name in dict.fromkeys(p.set for p in prompts):
        per: dict[str, Any] = {}
        for cfg in configs:
            if cfg.name == K0:
                continue
            same, total, diffs = 0, 0, []
            for p in (p for p in prompts if p.set == set_name):
                ref, got = by.get((set_name, p.id, K0)), by.get((set_name, p.id, cfg.name))
                if ref is None or got is None:
                    continue
                total += 1
                pos = first_divergence(ref.tokens, got.tokens)
                if pos is None:
                    same += 1
                    continue
                gap, eps = top2_gap(hf, ids[(set_name, p.id)], ref.tokens[:pos]) if hf is not None else (None, 0.0)
                diffs.append({"prompt": p.id, "position": pos, "top2_logit_gap": gap, "tie_threshold": eps,
                              "near_tie": gap is not None and gap <= eps})
            per[cfg.name] = {"identical": same, "prompts": total, "differences": diffs}
        out[set_name] = per
    return out


# -- the run --------------------------------------------------------------------------------------
@dataclass
class BenchArgs:
    prompts: list[str]
    ks: list[int]
    max_new_tokens: int
    repeats: int
    threads: int
    prompts_per_set: int
    out: str
    plot: str
    target_model: str = "embedded"
    draft_kind: str = "ngram"
    draft_model: str = ""
    hf_lookup_tokens: int = 10
    hf_ngram_size: int = 2
    with_default_k: bool = True
    with_hf: bool = True
    with_adaptive: bool = True
    adaptive_cap: int = 0                 # 0: the largest k of the sweep
    verify_context: int = VERIFY_CONTEXT_TOKENS
    verify_reps: int = 7
    quick: bool = False
    dtype: str = "float32"                # of the target (and model draft) in the services and in HF
    progress: bool = True
    prompts_dir: str = str(PROMPTS_DIR)


def run(args: BenchArgs) -> dict[str, Any]:
    from tqdm import tqdm

    from specdec.bench import report
    from specdec.bench.hf_baselines import HFBaselines, HFSettings
    from specdec.launcher import LocalStack, StackConfig
    from specdec.params import DEFAULTS

    t_start = time.perf_counter()
    phases: dict[str, float] = {}
    machine = machine_info()
    adaptive_cap = (args.adaptive_cap or max(args.ks, default=0)) if args.with_adaptive and adaptive_supported() else 0
    configs = make_configs(args.ks, args.with_default_k, args.with_hf, adaptive_cap)
    prompts = load_prompts(args.prompts, args.prompts_per_set, Path(args.prompts_dir))

    hf_settings = HFSettings(draft_kind=args.draft_kind, prompt_lookup_num_tokens=args.hf_lookup_tokens,
                             max_matching_ngram_size=args.hf_ngram_size, assistant_model=args.draft_model)
    t0 = time.perf_counter()
    hf = HFBaselines(args.target_model, args.threads, hf_settings, args.dtype)
    if not hf.can_assist:  # HF has no assisted generation with a feature (EAGLE-style) draft
        configs = [c for c in configs if c.name != HF_ASSISTED]
    for p in prompts:
        p.ids = hf.chat_ids(p.user)
    phases["hf_load_s"] = time.perf_counter() - t0

    stack_cfg = StackConfig(target_model=args.target_model, draft_kind=args.draft_kind,
                            draft_model=args.draft_model, threads=args.threads, dtype=args.dtype)
    stack = LocalStack(stack_cfg)
    records: list[RunRecord] = []
    t0 = time.perf_counter()
    try:
        stack.start()
        phases["stack_start_s"] = time.perf_counter() - t0
        client = StackClient(stack)
        try:
            t0 = time.perf_counter()
            _warm_up(client, hf, prompts, configs)
            phases["warmup_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            total = args.repeats * len(prompts) * len(configs)
            with tqdm(total=total, desc="bench", unit="gen", disable=not args.progress, file=sys.stderr) as bar:
                for rep in range(args.repeats):
                    for p in prompts:
                        for cfg in configs:
                            bar.set_postfix_str(f"rep {rep + 1} {p.set}/{p.id} {cfg.name}", refresh=False)
                            records.append(_one(client, hf, p, cfg, rep, args.max_new_tokens))
                            bar.update()
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

    t0 = time.perf_counter()
    default_k = DEFAULTS["k"] if isinstance(DEFAULTS["k"], int) else 0
    n_max = max(list(args.ks) + [default_k]) + 1
    with tqdm(total=1, desc="verify cost v(n)", disable=not args.progress, file=sys.stderr) as bar:
        verify_hf = hf.verify_costs(n_max, args.verify_context, args.verify_reps)
        verify, layout = _services_verify_costs(hf, verify_hf, n_max, args)
        c = hf.draft_step_cost(args.verify_context, args.verify_reps)   # relative to the target as served
        bar.update()
    phases["verify_cost_s"] = time.perf_counter() - t0
    rss["bench (HF in-process)"] = peak_rss_bytes(os.getpid())
    identity = identity_report(records, prompts, configs, hf)

    from specdec.engine.kvcache import kv_bytes_per_token

    settings = {
        "prompt_sets": args.prompts, "prompts_per_set": args.prompts_per_set,
        "prompts": {s: [p.id for p in prompts if p.set == s] for s in args.prompts},
        "prompt_tokens": {s: [len(p.ids) for p in prompts if p.set == s] for s in args.prompts},
        "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "k_sweep": args.ks,
        "server_default_k": DEFAULTS["k"], "adaptive_k_cap": adaptive_cap or None, "greedy": True, "ignore_eos": True, "quick": args.quick,
        "target_model": args.target_model, "target_model_id": hf.model_id, "dtype": hf.dtype,
        "draft_kind": args.draft_kind, "draft_model": args.draft_model or None,
        "threads": {"target_service": args.threads,
                    "draft_service": args.threads if args.draft_kind in MODEL_DRAFT_KINDS else "n/a (n-gram draft, no torch work)",
                    "orchestrator": "n/a (no torch work)", "hf_in_process": args.threads},
        "order": "interleaved: for each repeat, for each prompt, every configuration once (A B C .. A B C ..)",
        "timing": "wall clock at the client from sending the request to the last token (prefill included)",
        "configs": {cfg.name: cfg.label(DEFAULTS["k"]) for cfg in configs},
        "target_weight_layout": layout,
    }
    result = report.build(records, configs, prompts, settings=settings, machine=machine,
                          hf_settings=hf_settings.record(), verify=verify, draft_step_cost=c,
                          identity=identity, rss=rss,
                          kv_per_token_model={"target": kv_bytes_per_token(hf.model.config, 4)},
                          default_k=DEFAULTS["k"], stats_error=stats_error)
    if verify is not verify_hf:
        result["verify_cost_hf_layout"] = {k: v for k, v in verify_hf.items() if k != "kv_bytes_per_token_measured"}
    if hasattr(os, "getloadavg"):
        result["machine"]["load_avg_at_end"] = list(os.getloadavg())
    phases["total_s"] = time.perf_counter() - t_start
    result["runtime_s"] = {k: round(v, 1) for k, v in phases.items()}
    return result


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
    rec = RunRecord(p.set, p.id, cfg.name, rep, tokens, wall, arrivals, _stats_dict(final.stats),
                    [_round_dict(r) for r in rounds])
    rec.memory = client.memory_after(final.session_id)
    return rec


# -- CLI ------------------------------------------------------------------------------------------
def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark: our stack (k sweep) vs k = 0 vs Hugging Face, JSON + PNG")
    p.add_argument("--prompts", default=",".join(PROMPT_SETS), help="prompt sets (bench/prompts/NAME.jsonl)")
    p.add_argument("--prompts-dir", default=str(PROMPTS_DIR), help="folder of the NAME.jsonl prompt files")
    p.add_argument("--k", default=",".join(map(str, DEFAULT_K)), help="k sweep, e.g. 2,4,8,12")
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--prompts-per-set", type=int, default=None, help="first N prompts of each set (0 = all)")
    p.add_argument("--threads", type=int, default=None, help="torch threads of every model service and of HF")
    p.add_argument("--out", default="bench/results/latest.json")
    p.add_argument("--plot", default="bench/results/latest.png")
    p.add_argument("--quick", action="store_true", help="1 prompt per set, 24 tokens, 1 repeat (smoke test)")
    p.add_argument("--target-model", default="embedded")
    p.add_argument("--draft-kind", choices=["ngram", "model", "combined"], default="ngram")
    p.add_argument("--draft-model", default="")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="weights of the target (and a model draft), in the services and in HF alike")
    p.add_argument("--hf-lookup-tokens", type=int, default=10, help="HF prompt_lookup_num_tokens")
    p.add_argument("--hf-ngram-size", type=int, default=2, help="HF max_matching_ngram_size")
    p.add_argument("--no-hf", action="store_true", help="skip the in-process HF anchors (c), (d)")
    p.add_argument("--no-adaptive", action="store_true", help="skip our adaptive-k configuration")
    p.add_argument("--adaptive-cap", type=int, default=0, help="k cap of adaptive k (default: largest k of --k)")
    p.add_argument("--no-progress", action="store_true")


def args_from_cli(ns: argparse.Namespace) -> BenchArgs:
    quick = ns.quick
    def pick(value: Any, quick_value: Any, default: Any) -> Any:
        return value if value is not None else (quick_value if quick else default)
    try:
        ks = sorted({int(x) for x in ns.k.split(",") if x.strip()})
    except ValueError:
        raise SystemExit(f"specdec bench: --k must be integers separated by commas, got {ns.k!r}") from None
    if ns.draft_kind in MODEL_DRAFT_KINDS and not ns.draft_model:
        raise SystemExit(f"specdec bench: --draft-kind {ns.draft_kind} needs --draft-model SPEC")
    return BenchArgs(
        prompts=[s.strip() for s in ns.prompts.split(",") if s.strip()], ks=ks,
        max_new_tokens=pick(ns.max_new_tokens, QUICK["max_new_tokens"], DEFAULT_MAX_NEW_TOKENS),
        repeats=pick(ns.repeats, QUICK["repeats"], DEFAULT_REPEATS),
        prompts_per_set=pick(ns.prompts_per_set, QUICK["prompts_per_set"], DEFAULT_PROMPTS_PER_SET),
        threads=ns.threads if ns.threads is not None else min(2, os.cpu_count() or 1),
        out=ns.out, plot=ns.plot, target_model=ns.target_model, draft_kind=ns.draft_kind,
        draft_model=ns.draft_model, hf_lookup_tokens=ns.hf_lookup_tokens, hf_ngram_size=ns.hf_ngram_size,
        with_hf=not ns.no_hf, verify_reps=QUICK["verify_reps"] if quick else 7, quick=quick,
        progress=not ns.no_progress, prompts_dir=ns.prompts_dir, with_adaptive=not ns.no_adaptive,
        adaptive_cap=ns.adaptive_cap, dtype=ns.dtype)


def cmd_bench(ns: argparse.Namespace) -> int:
    """Run the benchmark, print the table, write the JSON and the PNG."""
    from specdec.bench import report

    args = args_from_cli(ns)
    logging.getLogger().setLevel(logging.WARNING)       # progress bars, not INFO lines
    result = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")        # files first: the table may go to a closed pipe
    if args.plot:
        report.plot(result, Path(args.plot))
    print(report.table(result))
    print(f"\nJSON: {out}")
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


def _services_verify_costs(hf: Any, verify_hf: dict, n_max: int, args: argparse.Namespace) -> tuple[dict, str]:
    """v(n) as the target service computes it: with the input-major CPU layout when the service uses it
    (SPECDEC_INPUT_MAJOR, float32 on CPU), measured on the same in-process model after the HF runs."""
    from specdec.config import ModelServiceConfig
    from specdec.models.layout import use_input_major_linears, wants_input_major

    if not (ModelServiceConfig(role="target").input_major and wants_input_major(hf.model.device, hf.model.dtype)):
        return verify_hf, "nn.Linear ([out, in])"
    use_input_major_linears(hf.model)
    return hf.verify_costs(n_max, args.verify_context, args.verify_reps), "input-major ([in, out], SPECDEC_INPUT_MAJOR=1)"
