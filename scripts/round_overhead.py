"""Per-round overhead side by side: the round lane vs round streams vs unary calls, 1 vs 2 torch threads,
by context length.

One local stack: Redis, one target per thread count, and for each target one orchestrator per transport:
`lane` (the default: Propose/Verify over the replica's plain-TCP round lane), `stream` (SPECDEC_ROUND_LANE=0:
long-lived gRPC streams) and `unary` (also SPECDEC_ROUND_STREAMS=0: one unary call per round). Prompts of
every set run through the orchestrators interleaved (A B C ... A B C ...), so load on the machine hits every
configuration alike. Reports the p50 of RoundOutcome.overhead_ms (round wall time at the orchestrator minus
draft and target forward time: what `specdec bench` reports as `overhead_ms_p50`) over decode rounds, per
configuration and context-length band, with the load average at start and end. Beside it the cycle overhead:
the time between two rounds' chunks arriving at this client minus the round's forwards, i.e. the round's
overhead plus the orchestrator's time between rounds (what tokens per second pay; round 0 and chunks that
carry several rounds are left out). The n-gram draft runs in the orchestrator (the bench's default), so a
round is one target call; `--draft-model` puts a draft service (same threads, `d.` variables) in every round. `--tls`: every hop mTLS (a throwaway CA made for the run), lane and streams alike.
`--variants`: the same per named environment (each variant its own targets and orchestrators, side by side), e.g.
`--variants 'before:SPECDEC_SPIN_US=0,SPECDEC_ROUND_LANE_FORWARD_DONE=0;now'` (docs/performance.md, "Wake-ups").

    PYTHONPATH=$PWD .venv/bin/python scripts/round_overhead.py --k 0,4 --tokens 48 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from specdec.bench.machine import machine_info
from specdec.bench.plan import load_prompts
from specdec.healthcheck import channel_for
from specdec.launcher import LocalStack, StackConfig
from specdec.redis_server import EmbeddedRedis
from specdec.report import in_target_ms
from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import orchestrator_pb2_grpc

BANDS = ((0, 150), (150, 1000), (1000, 3000), (3000, 6000), (6000, 9000))


def band(tokens: int) -> str:
    lo, hi = next(b for b in BANDS if b[0] <= tokens < b[1])
    return f"{lo}-{hi}"


def split(r) -> dict[str, float]:
    """Where a round's overhead went (the services report how long they held its calls: service_ms):
    in_target = the target's time around its forward (queue included), in_draft = the draft service's around its
    forward, outside_services = the rest (wire, wake-ups, the orchestrator); drafted_overhead = the overhead of a
    round that carried a draft (the n-gram lookup found one), apart from the rounds that did not."""
    out: dict[str, float] = {}
    in_target = in_target_ms(r)
    if in_target is not None:
        out["in_target"] = in_target
        in_draft = max(0.0, r.draft_service_ms - r.draft_ms) if r.draft_service_ms else 0.0
        if r.draft_service_ms:
            out["in_draft"] = in_draft
        out["outside_services"] = r.overhead_ms - out["in_target"] - in_draft
    out["drafted_overhead" if r.draft_ids else "undrafted_overhead"] = r.overhead_ms
    return out


def fmt(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.3f} ms"


def generate(stub, user: str, k: int, tokens: int) -> tuple[list, list[float]]:
    """(the decode rounds, the cycle overhead of each round that came in a chunk of its own after another
    such chunk: the time between the two chunks' arrival here minus the round's forwards, ms)."""
    req = pb.GenerateRequest(max_new_tokens=tokens, ignore_eos=True, trace=True, k=k, request_id=uuid.uuid4().hex)
    req.messages.messages.add(role="user", content=user)
    req.sampling.temperature = 0.0
    rounds, cycles, last = [], [], None
    for chunk in stub.GenerateStream(req, timeout=600):
        now = time.perf_counter()
        rounds += list(chunk.rounds)
        if len(chunk.rounds) == 1 and last is not None and len(rounds) > 2:
            r = chunk.rounds[0]
            cycles.append((now - last) * 1000.0 - r.draft_ms - r.target_ms)
        last = now if len(chunk.rounds) == 1 else None
    return rounds[1:], cycles               # round 0 carries the prefill


def cpu_ms(pid: int) -> float:
    """User + system CPU time of a process so far (ms; /proc resolution: one clock tick)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000.0 / os.sysconf("SC_CLK_TCK")


TRANSPORT_ENV = {"lane": {}, "stream": {"SPECDEC_ROUND_LANE": "0"},
                 "unary": {"SPECDEC_ROUND_LANE": "0", "SPECDEC_ROUND_STREAMS": "0"}}


def tls_env(directory: str) -> dict[str, str]:
    """The environment that turns mTLS on for every service, from a throwaway CA in `directory`."""
    from tests.pki_support import make_pki      # run from the repository root (PYTHONPATH=$PWD)
    pki = make_pki(Path(directory))
    return {"SPECDEC_TLS_CA": str(pki["ca"]), "SPECDEC_TLS_CERT": str(pki["cert"]), "SPECDEC_TLS_KEY": str(pki["key"])}


def parse_variants(text: str) -> dict[str, dict[str, dict[str, str]]]:
    """'name' or 'name:ENV=V,o.ENV=V,t.ENV=V,d.ENV=V' separated by ';' -> {name: {"target": env, "orchestrator":
    env, "draft": env}}; a variable prefixed o., t. or d. is set for that role only."""
    variants = {}
    for item in filter(None, text.split(";")):
        name, _, assignments = item.partition(":")
        env: dict[str, dict[str, str]] = {"target": {}, "orchestrator": {}, "draft": {}}
        for assignment in filter(None, assignments.split(",")):
            key, value = assignment.split("=", 1)
            role = {"o.": "orchestrator", "t.": "target", "d.": "draft"}.get(key[:2])
            for r in [role] if role else list(env):
                env[r][key[2:] if role else key] = value
        variants[name] = env
    return variants


def start(threads: list[int], transports: list[str], variants: dict[str, dict[str, dict[str, str]]],
          env: dict[str, str], draft_model: str = "") -> tuple[LocalStack, dict[str, object]]:
    """Redis, then per variant and thread count a target (and with `draft_model` a draft service at the same
    threads; the variant's environment) with one orchestrator per transport; returns the stack and {name:
    orchestrator}. The first variant's name is left out of the names when it is the only one."""
    stack = LocalStack(StackConfig(threads=threads[0], draft_replicas=0, extra_env=env, draft_model=draft_model,
                                   draft_kind="model" if draft_model else "ngram"))
    stack.redis = EmbeddedRedis().start()
    stack.redis_url = stack.redis.url
    orchestrators = {}
    for variant, variant_env in variants.items():
        for n in threads:
            stack.cfg.threads = n
            target = stack.start_target(env=variant_env["target"])
            drafts = [stack.start_draft(env=variant_env["draft"])] if draft_model else []
            for proc in [target, *drafts]:
                stack.wait_ready(proc)
            for transport in transports:
                proc = stack.start_orchestrator(targets=[target], drafts=drafts,
                                                env={**TRANSPORT_ENV[transport], **variant_env["orchestrator"]})
                stack.wait_ready(proc)
                stack.wait_connected(proc, [target, *drafts])
                prefix = f"{variant}-" if len(variants) > 1 else ""
                orchestrators[f"{prefix}t{n}-{transport}"] = proc
    return stack, orchestrators


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", default="0,4")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompts", default="open,grounded,long")
    ap.add_argument("--per-set", type=int, default=2)
    ap.add_argument("--transports", default="lane,stream,unary")
    ap.add_argument("--out", default="")
    ap.add_argument("--tls", action="store_true", help="mTLS on every hop (a throwaway CA)")
    ap.add_argument("--draft-model", default="", help="a draft service with this model per target (default: the "
                    "n-gram draft in the orchestrator); the overhead then includes the draft call's hop and code")
    ap.add_argument("--variants", default="base",
                    help="';'-separated 'name' or 'name:ENV=V,ENV=V': each its own targets and orchestrators, "
                         "the environment set on every role, or with o./t./d. on the orchestrators / targets / "
                         "drafts only "
                         "(e.g. 'off:SPECDEC_SPIN_US=0;on:SPECDEC_SPIN_US=2000;o:t.SPECDEC_SPIN_US=0')")
    args = ap.parse_args()
    ks = [int(x) for x in args.k.split(",")]
    prompts = load_prompts(args.prompts.split(","), args.per_set)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))   # `timeout` still stops the stack (finally)
    pki_dir = tempfile.TemporaryDirectory(prefix="specdec-pki-")
    # The trace is read for its timings only: it shows what the accept rule read, as an untraced round asks
    # (VerifyRequest.verdict_only), unless a variant sets o.SPECDEC_TRACE_REJECTED_ROWS=1 (the rows after it).
    env = {"SPECDEC_TRACE_REJECTED_ROWS": "0", **(tls_env(pki_dir.name) if args.tls else {})}
    stack, orchestrators = start([int(x) for x in args.threads.split(",")], args.transports.split(","),
                                 parse_variants(args.variants), env, args.draft_model)
    stubs = {name: orchestrator_pb2_grpc.OrchestratorStub(channel_for(p.address, stack.tls()))
             for name, p in orchestrators.items()}
    cpu: dict[str, list[float]] = {}       # key -> [orchestrator CPU ms, rounds]
    machine, load_start = machine_info(), os.getloadavg()
    samples: dict[str, list[float]] = {}
    forwards: dict[str, list[float]] = {}  # key -> the target's forward ms per decode round (target_ms)
    cycles: dict[str, list[float]] = {}    # key -> cycle overheads (see generate)
    parts: dict[str, dict[str, list[float]]] = {}  # key -> where the overhead went (see split) -> ms per round
    try:
        for name, stub in stubs.items():     # warm-up, discarded
            generate(stub, prompts[0].user, ks[-1], 8)
        for _ in range(args.repeats):
            for p in prompts:
                for k in ks:
                    for name, stub in stubs.items():
                        pid = orchestrators[name].popen.pid
                        before = cpu_ms(pid)
                        rounds, cycle = generate(stub, p.user, k, args.tokens)
                        used = cpu_ms(pid) - before
                        if rounds:
                            acc = cpu.setdefault(f"{name} k={k} ctx={band(rounds[0].context_tokens)}", [0.0, 0])
                            acc[0], acc[1] = acc[0] + used, acc[1] + len(rounds) + 1
                        for r in rounds:
                            key = f"{name} k={k} ctx={band(r.context_tokens)}"
                            samples.setdefault(key, []).append(r.overhead_ms)
                            forwards.setdefault(key, []).append(r.target_ms)
                            for part, ms in split(r).items():
                                parts.setdefault(key, {}).setdefault(part, []).append(ms)
                        if rounds:
                            cycles.setdefault(f"{name} k={k} ctx={band(rounds[0].context_tokens)}", []).extend(cycle)
                        print(f"{p.set}/{p.id} {name} k={k}: context {rounds[0].context_tokens if rounds else 0}, "
                              f"overhead p50 {statistics.median([r.overhead_ms for r in rounds] or [0]):.3f} ms, "
                              f"load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        stack.stop()
        pki_dir.cleanup()
    load_end = os.getloadavg()
    table = {key: {"p50": statistics.median(v), "n": len(v),
                   "cycle_p50": statistics.median(cycles[key]) if cycles.get(key) else None,
                   "target_forward_ms_p50": statistics.median(forwards[key]),
                   **{f"{part}_ms_p50": statistics.median(ms) for part, ms in parts.get(key, {}).items()},
                   "drafted_rounds": len(parts.get(key, {}).get("drafted_overhead", [])),
                   "orchestrator_cpu_ms_per_round": cpu[key][0] / cpu[key][1] if key in cpu else None}
             for key, v in sorted(samples.items())}
    print(f"load average at start {load_start}, at end {load_end}")
    for key, row in table.items():
        cpu_round = row["orchestrator_cpu_ms_per_round"]
        cycle = row["cycle_p50"]
        print(f"{key:40s} overhead p50 {row['p50']:6.3f} ms  cycle p50 {'-' if cycle is None else f'{cycle:6.3f}'} ms"
              f"  (n={row['n']})  orchestrator CPU/round {'-' if cpu_round is None else f'{cpu_round:.2f}'} ms"
              f"  forward p50 {row['target_forward_ms_p50']:.1f} ms  in the target {fmt(row.get('in_target_ms_p50'))}"
              f"  wire+orchestrator {fmt(row.get('outside_services_ms_p50'))}"
              f"  drafted rounds {fmt(row.get('drafted_overhead_ms_p50'))} (n={row['drafted_rounds']})")
    if args.out:
        Path(args.out).write_text(json.dumps({"machine": machine, "load_start": load_start, "load_end": load_end,
                                              "args": vars(args),
                                              "overhead_ms_p50": table}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
