"""`specdec bench-concurrency`: aggregate throughput with 1, 4, 8 concurrent sessions, batched vs not.

One run starts one embedded Redis and two targets on the same model: one verifies
concurrent sessions together (continuous batching, --max-batch N) and one verifies
them one at a time (--max-batch 1), each behind its own orchestrator. For each
repeat, for each concurrency c, for each k (0 = target only, and speculation), the
batched and the unbatched stack run back to back (A B A B ...), so machine drift hits
both alike. Every configuration does the same work: the same max(c) prompts (grounded
and open in turn), in waves of c sessions at once (c = 1: one after the other). Every
session is greedy, ignore_eos, with the same max_new_tokens; its tokens are compared
with the same prompt run alone at k = 0.

Reported per configuration: aggregate tokens/s (all sessions' tokens / the summed wall
time of the waves, prefill included), median over repeats with min/max, and the mean
number of sessions the target verified per forward pass (from the per-round trace).

And where the wall time goes (`split`, from the target's /metrics read around each run and the
per-round trace; time_split): the target's model thread prefilling (passes that ran a prompt),
decoding (every other pass), holding a batch back for the previous batch's sessions
(SPECDEC_BATCH_WAIT_MS), and idle: the rest of the wall time, when the target had nothing to run
because every session was between rounds (orchestrator round trip: gRPC, the orchestrator's own work,
Redis) or the wave's last sessions were still finishing. `tokens_per_decode_s` is the throughput if
only the decode passes took time: its 8-vs-1 ratio is what the runner alone gives.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec.bench.llama_server import ServerWaves
from specdec.bench.load import scrape
from specdec.bench.machine import machine_info
from specdec.bench.plan import PROMPTS_DIR, Prompt, load_prompts

log = logging.getLogger("specdec.bench")

DEFAULT_CONCURRENCY = (1, 4, 8)
DEFAULT_KS = (0, 4)
DEFAULT_MAX_BATCH = 8
DEFAULT_MAX_NEW_TOKENS = 48
DEFAULT_REPEATS = 2
RPC_TIMEOUT_S = 600.0
#: with --compare-env: a second batched target with some environment variables set (a process-level switch such
#: as SPECDEC_LOOP_FORWARDS=0), behind its own orchestrator, run right after the batched one.
ENV_STACK = "batched_env"
#: target /metrics counters read around each run (specdec/metrics.py, WorkerState in specdec/engine/worker.py).
SPLIT_SAMPLES = (
    "specdec_model_busy_seconds_total",
    "specdec_prefill_pass_seconds_total",
    "specdec_batch_wait_seconds_total",
)


@dataclass
class ConcurrencyArgs:
    concurrency: list[int]
    ks: list[int]
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    repeats: int = DEFAULT_REPEATS
    max_batch: int = DEFAULT_MAX_BATCH
    threads: int = 1
    dtype: str = "auto"  # auto: the services' default (the GGUF on llama.cpp)
    target_model: str = "embedded"
    llama_server: bool = True  # llama.cpp's own server on the same waves (skipped with a note without one)
    prompts: list[str] = field(default_factory=lambda: ["grounded", "open"])
    prompts_dir: str = str(PROMPTS_DIR)
    out: str = "bench/results/concurrency.json"
    progress: bool = True
    compare_env: dict[str, str] = field(default_factory=dict)

    @property
    def stacks(self) -> tuple[str, ...]:
        """The stacks measured, in the order each (repeat, c, k) runs them."""
        extra = (ENV_STACK,) * bool(self.compare_env)
        return ("batched", *extra, "unbatched")


@dataclass
class Sample:
    """One configuration run once: c sessions at once through one stack."""

    stack: str
    c: int
    k: int
    rep: int
    tokens: int
    wall_s: float
    mean_batch: float
    outputs: dict[str, list[int]]
    split: dict[str, float] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


class Stacks:
    """Redis + a batched and an unbatched target, each behind its own orchestrator (n-gram drafting)."""

    def __init__(self, args: ConcurrencyArgs) -> None:
        from specdec.launcher import LocalStack, StackConfig

        cfg = StackConfig(
            target_model=args.target_model,
            threads=args.threads,
            max_batch=args.max_batch,
            dtype=args.dtype,
            max_concurrent=max(args.concurrency) * 2,
            metrics=True,
        )
        self.stack = LocalStack(cfg)
        self.max_batch = args.max_batch
        self.compare_env = args.compare_env

    def start(self) -> dict[str, tuple[str, str]]:
        """Start everything; return (orchestrator address, target /metrics URL) of each stack.

        The stacks after the first are spawned together and waited for together (their imports and model
        loads overlap on the cores), each orchestrator beside the target it is given."""
        s = self.stack
        s.start()  # Redis, the batched target, its orchestrator
        url = "http://127.0.0.1:{}/metrics".format
        plain = s.start_target(max_batch=1)
        spawned = {"unbatched": (s.start_orchestrator(targets=[plain]), plain)}
        if self.compare_env:
            target = s.start_target(env=self.compare_env)
            spawned[ENV_STACK] = (s.start_orchestrator(targets=[target]), target)
        for orch, target in spawned.values():
            s.wait_ready(target)
            s.wait_ready(orch)
            s.wait_connected(orch, [target])
        addresses = {"batched": (s.orchestrator_address, url(s.targets[0].metrics_port))}
        addresses.update({name: (orch.address, url(target.metrics_port)) for name, (orch, target) in spawned.items()})
        return addresses

    def stop(self) -> None:
        self.stack.stop()


class Sessions:
    """Runs c sessions at once against one orchestrator (a thread per session, unary Generate)."""

    def __init__(self, address: str, max_new_tokens: int, metrics_url: str = "") -> None:
        import grpc

        from specdec.v1 import orchestrator_pb2_grpc

        self.metrics_url = metrics_url
        self.channel = grpc.insecure_channel(address)
        self.stub = orchestrator_pb2_grpc.OrchestratorStub(self.channel)
        self.max_new_tokens = max_new_tokens

    def one(self, prompt: Prompt, k: int) -> tuple[list[int], list[tuple[int, float]]]:
        """(completion tokens, (target batch size, overhead ms) of every round)."""
        from specdec.v1 import orchestrator_pb2 as pb

        req = pb.GenerateRequest(
            max_new_tokens=self.max_new_tokens, ignore_eos=True, trace=True, k=k, request_id=uuid.uuid4().hex
        )
        req.messages.messages.add(role="user", content=prompt.user)
        req.sampling.temperature = 0.0
        res = self.stub.Generate(req, timeout=RPC_TIMEOUT_S)
        self.stub.DeleteSession(pb.SessionRequest(session_id=res.session_id), timeout=RPC_TIMEOUT_S)
        return list(res.token_ids), [(r.target_batch_size, r.overhead_ms) for r in res.trace]

    def run(self, prompts: list[Prompt], k: int, c: int) -> tuple[float, list[list[int]], list[tuple[int, float]]]:
        """The prompts in waves of c at once; (summed wall seconds, tokens per prompt, (batch size, overhead ms)
        of all rounds)."""
        wall, results = 0.0, []
        with ThreadPoolExecutor(max_workers=c) as pool:
            for first in range(0, len(prompts), c):
                start = time.perf_counter()
                results += list(pool.map(lambda p: self.one(p, k), prompts[first : first + c]))
                wall += time.perf_counter() - start
        return wall, [tokens for tokens, _ in results], [b for _, sizes in results for b in sizes]

    def close(self) -> None:
        self.channel.close()


def measure(
    args: ConcurrencyArgs, clients: dict[str, Sessions], prompts: list[Prompt], server: ServerWaves | None = None
) -> list[Sample]:
    """Every (repeat, c, k) on both stacks, batched then unbatched, back to back; then that c's waves on
    llama-server (`server`, a ServerWaves) where there is one."""
    from tqdm import tqdm

    samples = []
    total = args.repeats * len(args.concurrency) * len(args.ks) * len(args.stacks)
    with tqdm(total=total, desc="concurrency", unit="run", disable=not args.progress, file=sys.stderr) as bar:
        for rep in range(args.repeats):
            for c in args.concurrency:
                for k in args.ks:
                    for name in args.stacks:
                        bar.set_postfix_str(f"rep {rep + 1} c={c} k={k} {name}", refresh=False)
                        before = scrape([clients[name].metrics_url], SPLIT_SAMPLES)
                        wall, outputs, rounds = clients[name].run(prompts, k, c)
                        after = scrape([clients[name].metrics_url], SPLIT_SAMPLES)
                        tokens = sum(len(o) for o in outputs)
                        sizes = [b for b, _ in rounds]
                        samples.append(
                            Sample(
                                name,
                                c,
                                k,
                                rep,
                                tokens,
                                wall,
                                statistics.fmean(sizes) if sizes else 0.0,
                                {p.id: o for p, o in zip(prompts, outputs)},
                                time_split(wall, tokens, before, after, [o for _, o in rounds]),
                            )
                        )
                        bar.update()
                if server is not None:
                    server.wave(c)
    return samples


def time_split(
    wall_s: float, tokens: int, before: dict[str, float], after: dict[str, float], round_overhead_ms: list[float]
) -> dict[str, float]:
    """Where one run's wall time went, from the target's counters before and after it (module docstring):
    seconds and shares of prefill, decode, batch wait and idle, the tokens/s of the decode passes alone,
    and the p50 of the rounds' overhead (round wall at the orchestrator minus draft and target forwards)."""

    def grew(name: str) -> float:
        return max(0.0, after.get(name, 0.0) - before.get(name, 0.0))

    busy, prefill, wait = (grew(n) for n in SPLIT_SAMPLES)
    decode = max(0.0, busy - prefill)
    parts = {"prefill_s": prefill, "decode_s": decode, "batch_wait_s": wait, "idle_s": max(0.0, wall_s - busy - wait)}
    out = {name: round(v, 3) for name, v in parts.items()}
    out.update({name[:-2] + "_share": round(v / wall_s, 3) if wall_s > 0 else 0.0 for name, v in parts.items()})
    out["tokens_per_decode_s"] = round(tokens / decode, 2) if decode > 0 else 0.0
    out["round_overhead_ms_p50"] = round(statistics.median(round_overhead_ms), 2) if round_overhead_ms else 0.0
    return out


def summarise(samples: list[Sample], args: ConcurrencyArgs, reference: dict[str, list[int]]) -> dict[str, Any]:
    """tokens/s (median, min, max), mean batch, identity; ratios 8-vs-1 and batched-vs-unbatched."""
    table: dict[str, Any] = {}
    for s in samples:
        cell = table.setdefault(f"k{s.k}", {}).setdefault(s.stack, {}).setdefault(str(s.c), {"runs": []})
        cell["runs"].append(round(s.tokens_per_s, 2))
        cell.setdefault("mean_batch", []).append(round(s.mean_batch, 2))
        cell.setdefault("mismatched_sessions", 0)
        cell.setdefault("splits", []).append(s.split)
        cell["mismatched_sessions"] += sum(tokens != reference[pid] for pid, tokens in s.outputs.items())
    for per_k in table.values():
        for per_stack in per_k.values():
            for cell in per_stack.values():
                runs = cell["runs"]
                cell.update(
                    tokens_per_s=statistics.median(runs),
                    min=min(runs),
                    max=max(runs),
                    mean_batch=statistics.fmean(cell["mean_batch"]),
                    split=mean_split(cell.pop("splits")),
                )
    return {"throughput": table, "ratios": ratios(table, args)}


def mean_split(splits: list[dict[str, float]]) -> dict[str, float]:
    """Each figure of the runs' splits, averaged over the repeats."""
    splits = [s for s in splits if s]
    return {name: round(statistics.fmean(s[name] for s in splits), 3) for name in splits[0]} if splits else {}


def ratios(table: dict[str, Any], args: ConcurrencyArgs) -> dict[str, Any]:
    """Aggregate speed-up at the largest c over c = 1, and batched over unbatched at each c."""
    lo, hi = str(min(args.concurrency)), str(max(args.concurrency))
    out: dict[str, Any] = {}
    for k_name, per_k in table.items():
        b, u = per_k.get("batched", {}), per_k.get("unbatched", {})
        out[k_name] = {
            f"batched_{hi}_vs_{lo}": round(b[hi]["tokens_per_s"] / b[lo]["tokens_per_s"], 2),
            f"unbatched_{hi}_vs_{lo}": round(u[hi]["tokens_per_s"] / u[lo]["tokens_per_s"], 2),
            "batched_vs_unbatched": {c: round(b[c]["tokens_per_s"] / u[c]["tokens_per_s"], 2) for c in b},
        }
        decode = [b[c].get("split", {}).get("tokens_per_decode_s") for c in (lo, hi)]
        if all(decode):
            out[k_name][f"batched_{hi}_vs_{lo}_decode_passes"] = round(decode[1] / decode[0], 2)
        env = per_k.get(ENV_STACK)
        if env:
            out[k_name][f"{ENV_STACK}_{hi}_vs_{lo}"] = round(env[hi]["tokens_per_s"] / env[lo]["tokens_per_s"], 2)
            out[k_name]["batched_vs_env"] = {c: round(b[c]["tokens_per_s"] / env[c]["tokens_per_s"], 2) for c in b}
    return out


def run(args: ConcurrencyArgs) -> dict[str, Any]:
    """Start both stacks, take the reference outputs (alone, k = 0), measure, summarise."""
    prompts = load_prompts(args.prompts, 0, Path(args.prompts_dir))
    prompts = [prompts[i] for i in _alternate(prompts)][: max(args.concurrency)]
    stacks = Stacks(args)
    started = time.perf_counter()
    clients: dict[str, Sessions] = {}
    with contextlib.ExitStack() as held:
        server = held.enter_context(_server_waves(args, prompts)) if args.llama_server else None
        try:
            addresses = stacks.start()
            clients = {
                name: Sessions(*addresses[name][:1], args.max_new_tokens, addresses[name][1]) for name in args.stacks
            }
            reference = {p.id: clients["unbatched"].one(p, 0)[0] for p in prompts}  # also the warm-up
            samples = measure(args, clients, prompts, server)
        finally:
            for client in clients.values():
                client.close()
            stacks.stop()
    result = summarise(samples, args, reference)
    if server is not None:
        result["llama_server"] = server.result()
    result["machine"] = machine_info()
    result["settings"] = {
        "concurrency": args.concurrency,
        "k": args.ks,
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "max_batch": args.max_batch,
        "target_model": args.target_model,
        "threads": {"target_service": args.threads},
        "dtype": args.dtype,
        "draft": "n-gram, in the orchestrator",
        "compare_env": args.compare_env,
        "prompts": [p.id for p in prompts],
        "greedy": True,
        "ignore_eos": True,
        "order": f"for each repeat, c, k: the stacks back to back ({', '.join(args.stacks)})",
        "work": "every configuration runs the same prompts, in waves of c sessions at once",
        "timing": "aggregate tokens / summed wall time of the waves, first request to last response (prefill included)",
    }
    result["runtime_s"] = round(time.perf_counter() - started, 1)
    return result


def _server_waves(args: ConcurrencyArgs, prompts: list[Prompt]) -> ServerWaves:
    """llama-server -np max(c) on the same prompts (the ids the orchestrator's Prompter makes of them); its result
    says why not where the target is no GGUF file or no binary is found."""
    from orchestrator.prompting import Message, Prompter
    from specdec.bench.llamacpp import target_gguf
    from specdec.models.loader import load_tokenizer

    gguf = target_gguf(args.target_model)
    ids = []
    if gguf is not None:
        prompter = Prompter(load_tokenizer(args.target_model))
        ids = [prompter.first_turn([Message("user", p.user)], add_generation_prompt=True) for p in prompts]
    return ServerWaves(gguf, ids, max(args.concurrency), args.max_new_tokens, args.threads)


def _alternate(prompts: list[Prompt]) -> list[int]:
    """Indices taking the prompt sets in turn (grounded, open, grounded, ...)."""
    by_set: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        by_set.setdefault(p.set, []).append(i)
    order = []
    for row in range(max(len(v) for v in by_set.values())):
        order += [v[row] for v in by_set.values() if row < len(v)]
    return order
