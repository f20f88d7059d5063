"""`specdec bench-load --long-mix`: 16 concurrent sessions, 4 of them with long prompts.

The same tool as the curves (guidellm against the OpenAI endpoint), two phases on one fresh stack:

* ``baseline``: ``short_streams`` closed-loop streams of the bench's short prompts (grounded and open,
  as chat messages), alone, for ``seconds``.
* ``mix``: the same short streams and, at the same time, ``long_streams`` streams of the long prompt
  set (bench/prompts/long.jsonl, each >= ``min_long_prompt_tokens`` tokens after the chat template):
  two guidellm processes side by side, so exactly ``long_streams`` of the sessions in flight are long.

The target runs with a fixed KV budget (``cache_budget_bytes``); while the mix runs its /metrics page
is sampled every SAMPLE_S seconds (KV bytes in use, evictions, failed calls, prefill chunks). What is
checked and measured (long_mix_verdict, a pure function):

1. the target stays inside its KV budget: the largest KV bytes in use seen <= the budget, and the
   target never failed a call (it evicts least recently used sessions instead);
2. requests fail only by admission: every errored request carries HTTP 429 (RESOURCE_EXHAUSTED),
   and every request reported successful generated all its max_tokens (ignore_eos), so a stream that
   ended early with an error event is not counted as a success. Requests still running when guidellm's
   time limit cut a phase (``incomplete``) are counted apart: they did not fail;
3. measured, not checked: the short prompts' TTFT p90 in the mix ÷ in the baseline (chunked prefill: a
   long prompt's prefill runs in chunks with the other sessions' rounds between).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from specdec import children
from specdec.bench.load_plan import CONCURRENCY, K0, LoadConfig, ScenarioInputs, scenario
from specdec.bench.load_results import parse_report
from specdec.bench.plan import PROMPTS_DIR

log = logging.getLogger("specdec.bench.load")

MIB = 1024 * 1024
#: seconds between two samples of the target's /metrics page during the mix.
SAMPLE_S = 1.0
#: the long streams run this much longer than the short ones, so the whole short window sees them.
LONG_TAIL_S = 15.0
#: a request-count cap so high that the time limit ends every phase.
UNBOUNDED_REQUESTS = 100_000
#: target /metrics samples read around and during the mix (summed over labels).
TARGET_SAMPLES = (
    "specdec_cache_used_bytes",
    "specdec_cache_budget_bytes",
    "specdec_cache_evictions_total",
    "specdec_call_failures_total",
    "specdec_prefill_chunks_total",
    "specdec_calls_total",
    "specdec_shed_calls_total",
    "specdec_cache_reprefills_total",
    "specdec_cache_reprefill_tokens_total",
)


@dataclass(frozen=True)
class LongMixPlan:
    """The size of the long-prompt mix."""

    short_streams: int = 12
    long_streams: int = 4
    seconds: float = 150.0
    short_max_tokens: int = 64
    long_max_tokens: int = 32
    min_long_prompt_tokens: int = 3000
    cache_budget_bytes: int = 1536 * MIB
    config: LoadConfig = field(default_factory=lambda: LoadConfig(K0, 0))


def long_chat_rows(prompts_dir: str | Path = PROMPTS_DIR) -> list[dict[str, Any]]:
    """The long prompt set as chat messages (one user message each)."""
    rows = []
    for line in (Path(prompts_dir) / "long.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            rows.append({"messages": [{"role": "user", "content": json.loads(line)["user"]}]})
    return rows


def check_long_prompts(token_counts: list[int], minimum: int) -> None:
    """Every long prompt has at least `minimum` tokens after the chat template (else the mix tests nothing)."""
    if not token_counts:
        raise ValueError("the long prompt set is empty")
    short = [n for n in token_counts if n < minimum]
    if short:
        raise ValueError(f"long prompts of {short} tokens are below the mix's minimum of {minimum}")


def request_accounting(row: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """One guidellm point's requests, sorted by outcome.

    row: a load_results.parse_benchmark row plus `errored`, `incomplete` and `short_outputs` (successful
    requests that generated fewer than `max_tokens` tokens) as parse_longmix_report fills them in.
    """
    errored, limited = int(row.get("errored", 0)), int(row.get("rate_limited", 0))
    return {
        "successful": int(row["requests"]),
        "errored": errored,
        "rate_limited": limited,
        "failed_not_admission": errored - limited,
        "short_outputs": int(row.get("short_outputs", 0)),
        "incomplete_at_time_limit": int(row.get("incomplete", 0)),
        "max_tokens": max_tokens,
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def long_mix_verdict(
    baseline_short: dict[str, Any],
    mix_short: dict[str, Any],
    mix_long: dict[str, Any],
    server: dict[str, Any],
    plan: LongMixPlan,
) -> dict[str, Any]:
    """The checks and the TTFT ratio of the mix (module docstring) from the rows of the three guidellm runs and what the
    target reported (`server`: budget_bytes, max_used_bytes, evictions, call_failures, prefill_chunks)."""
    requests = {
        "baseline_short": request_accounting(baseline_short, plan.short_max_tokens),
        "mix_short": request_accounting(mix_short, plan.short_max_tokens),
        "mix_long": request_accounting(mix_long, plan.long_max_tokens),
    }
    budget, used = server.get("budget_bytes"), server.get("max_used_bytes")
    inside = budget is not None and used is not None and used <= budget and not server.get("call_failures")
    ttft_ratio = _ratio(mix_short.get("ttft_ms_p90"), baseline_short.get("ttft_ms_p90"))
    only_admission = all(r["failed_not_admission"] == 0 and r["short_outputs"] == 0 for r in requests.values())
    long_done = requests["mix_long"]["successful"] > 0
    return {
        "requests": requests,
        "kv_inside_budget": inside,
        "kv_max_used_bytes": used,
        "kv_budget_bytes": budget,
        "kv_evictions": server.get("evictions"),
        "kv_reprefills": server.get("reprefills"),
        "kv_reprefill_tokens": server.get("reprefill_tokens"),
        "target_call_failures": server.get("call_failures"),
        "prefill_chunks": server.get("prefill_chunks"),
        "target_shed_calls": server.get("shed_calls"),
        "short_ttft_p90_ms": {"baseline": baseline_short.get("ttft_ms_p90"), "mix": mix_short.get("ttft_ms_p90")},
        "short_ttft_p90_ratio": ttft_ratio,
        "short_itl_p50_ms": {"baseline": baseline_short.get("itl_ms_p50"), "mix": mix_short.get("itl_ms_p50")},
        "failures_only_admission": only_admission,
        "long_requests_completed": long_done,
        "ok": bool(inside and only_admission and long_done),
    }


def _outputs_of(requests: list[dict[str, Any]]) -> list[int]:
    out = []
    for r in requests:
        metrics = r.get("output_metrics") or {}
        count = metrics.get("text_tokens") if isinstance(metrics, dict) else None
        out.append(int(count if count is not None else r.get("output_tokens") or 0))
    return out


def parse_longmix_report(report: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """A one-point guidellm report -> its row, with errored/incomplete split and short outputs counted."""
    rows, _ = parse_report(report)
    if len(rows) != 1:
        raise ValueError(f"expected one benchmark in the long-mix report, got {len(rows)}")
    bench = report["benchmarks"][0]
    totals = bench["metrics"].get("request_totals") or {}
    reqs = bench.get("requests") or {}
    row = dict(rows[0])
    row["errored"], row["incomplete"] = int(totals.get("errored", 0)), int(totals.get("incomplete", 0))
    row["short_outputs"] = sum(n < max_tokens for n in _outputs_of(list(reqs.get("successful") or [])))
    return row


class TargetSampler:
    """The target's /metrics page read before, every SAMPLE_S seconds during, and after a phase (a thread):
    the largest KV bytes in use seen, and the counters' increase over the phase."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.max_used = 0.0
        self.samples = 0
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="longmix-sampler", daemon=True)

    def _read(self) -> dict[str, float]:
        from specdec.bench.load import scrape

        values = scrape([self.url], TARGET_SAMPLES)
        self.max_used = max(self.max_used, values.get("specdec_cache_used_bytes", 0.0))
        self.samples += 1
        return values

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            try:
                self._read()
            except OSError as exc:  # a missed sample is logged, not fatal: the next one follows
                log.warning("long mix: could not read %s: %s", self.url, exc)

    def __enter__(self) -> TargetSampler:
        self.first = self._read()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.last = self._read()

    def summary(self) -> dict[str, Any]:
        def grew(name: str) -> int:
            return int(self.last.get(name, 0.0) - self.first.get(name, 0.0))

        return {
            "budget_bytes": int(self.last.get("specdec_cache_budget_bytes", 0)) or None,
            "max_used_bytes": int(self.max_used),
            "samples": self.samples,
            "sample_every_s": SAMPLE_S,
            "evictions": grew("specdec_cache_evictions_total"),
            "call_failures": grew("specdec_call_failures_total"),
            "prefill_chunks": grew("specdec_prefill_chunks_total"),
            "calls": grew("specdec_calls_total"),
            "shed_calls": grew("specdec_shed_calls_total"),
            "reprefills": grew("specdec_cache_reprefills_total"),
            "reprefill_tokens": grew("specdec_cache_reprefill_tokens_total"),
        }


@dataclass
class Launch:
    """One guidellm process of a phase."""

    tag: str
    max_tokens: int
    proc: subprocess.Popen
    report: Path
    log_path: Path


def _launch(args: Any, tag: str, spec: dict[str, Any], max_tokens: int) -> Launch:
    from specdec.bench.load import guidellm_env

    work = Path(args.work_dir).resolve()
    report, scenario_path, log_path = (
        work / f"{tag}.guidellm.json",
        work / f"{tag}.scenario.json",
        work / f"{tag}.guidellm.log",
    )
    report.unlink(missing_ok=True)
    spec["spec"]["outputs"] = [{"kind": "json", "path": str(report)}]
    scenario_path.write_text(json.dumps(spec, indent=1))
    with log_path.open("wb") as out:
        proc = children.popen(  # ends with the bench however the bench ends
            [args.guidellm, "run", "--scenario", str(scenario_path), "--disable-console-interactive"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=guidellm_env(),
            cwd=str(work),
        )
    return Launch(tag, max_tokens, proc, report, log_path)


def _finish(launch: Launch, timeout_s: float) -> dict[str, Any]:
    rc = launch.proc.wait(timeout=timeout_s)
    if rc != 0 or not launch.report.is_file():
        tail = launch.log_path.read_text(errors="replace").splitlines()[-30:]
        raise RuntimeError(f"guidellm failed ({rc}) for {launch.tag}:\n" + "\n".join(tail))
    return parse_longmix_report(json.loads(launch.report.read_text()), launch.max_tokens)


def _inputs(plan: LongMixPlan, url: str, processor: str, data_file: str, long: bool) -> ScenarioInputs:
    return ScenarioInputs(
        target_url=url,
        processor_dir=processor,
        data_file=data_file,
        out_json="",
        requests_per_point=UNBOUNDED_REQUESTS,
        max_tokens=plan.long_max_tokens if long else plan.short_max_tokens,
        max_seconds_per_point=plan.seconds + (LONG_TAIL_S if long else 0.0),
    )


def run_phase(
    args: Any, plan: LongMixPlan, files: dict[str, str], url: str, target_metrics: str, with_long: bool
) -> dict[str, Any]:
    """One phase: the short streams (and, with_long, the long streams at the same time) under the sampler."""
    phase = "mix" if with_long else "baseline"
    started, load_before = time.monotonic(), list(os.getloadavg())
    streams = {"short": (plan.short_streams, False)}
    if with_long:
        streams = {"long": (plan.long_streams, True), **streams}  # the long streams start first
    with TargetSampler(target_metrics) as sampler:
        launches = {}
        for kind, (n, long) in streams.items():
            inp = _inputs(plan, url, files["processor"], files[kind], long)
            launches[kind] = _launch(
                args, f"longmix-{phase}-{kind}", scenario(plan.config, CONCURRENCY, [n], inp), inp.max_tokens
            )
        rows = {kind: _finish(la, plan.seconds * 4 + 600) for kind, la in launches.items()}
    return {
        **rows,
        "server": sampler.summary(),
        "wall_s": round(time.monotonic() - started, 1),
        "load_avg_before": load_before,
        "load_avg_after": list(os.getloadavg()),
    }


def long_prompt_tokens(target_model: str, rows: list[dict[str, Any]]) -> list[int]:
    """Prompt tokens of each long row after the target's chat template (what the orchestrator computes)."""
    from specdec.models.loader import load_tokenizer

    tok = load_tokenizer(target_model)
    texts = [tok.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False) for r in rows]
    return [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]


def _gateway_stream_failures(log_path: Path) -> int:
    """Streams the gateway ended with an error event (mid-stream gRPC failures)."""
    try:
        return sum("stream failed" in line for line in log_path.read_text(errors="replace").splitlines())
    except OSError:
        return -1


def target_scheduling() -> dict[str, Any]:
    """The target's chunked-prefill settings the stack starts with (its environment is this process's)."""
    from specdec.config import ModelServiceConfig

    cfg = ModelServiceConfig(role="target")
    return {"prefill_chunk_tokens": cfg.prefill_chunk_tokens, "prefill_turn_ms": cfg.prefill_turn_ms}


def run_long_mix(args: Any, plan: LongMixPlan) -> dict[str, Any]:
    """Baseline, then the mix, on one stack with the plan's KV budget; the JSON record with the verdict."""
    from specdec.bench.load import check_guidellm, export_processor, serving, uptime, warm_up
    from specdec.bench.load_plan import chat_rows, cycle_rows, write_jsonl
    from specdec.bench.machine import machine_info

    version = check_guidellm(args.guidellm)
    work = Path(args.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    long_rows = long_chat_rows()
    tokens = long_prompt_tokens(args.target_model, long_rows)
    check_long_prompts(tokens, plan.min_long_prompt_tokens)
    files = {
        "processor": str(export_processor(args.target_model, work / "processor")),
        "short": str(work / "longmix-short.chat.jsonl"),
        "long": str(work / "longmix-long.chat.jsonl"),
    }
    write_jsonl(files["short"], cycle_rows(chat_rows(), 2000))
    write_jsonl(files["long"], cycle_rows(long_rows, 200))
    args.cache_budget_bytes = plan.cache_budget_bytes
    record: dict[str, Any] = {
        "note": args.note,
        "settings": {
            **asdict(plan),
            "target_model": args.target_model,
            "threads": args.threads,
            "max_batch": args.max_batch or "service default",
            "long_prompt_tokens": tokens,
            "sampling": "greedy (temperature 0), ignore_eos",
            "target_scheduling": target_scheduling(),
        },
        "machine": machine_info(),
        "uptime_before": uptime(),
        "guidellm_version": version,
    }
    started = time.monotonic()
    with serving(args, max(64, 4 * (plan.short_streams + plan.long_streams))) as (stack, gateway):
        warm_up(gateway.url, [plan.config])
        metrics = f"http://127.0.0.1:{stack.targets[0].metrics_port}/metrics"
        record["baseline"] = run_phase(args, plan, files, gateway.url, metrics, with_long=False)
        record["mix"] = run_phase(args, plan, files, gateway.url, metrics, with_long=True)
        record["gateway_stream_failures"] = _gateway_stream_failures(gateway.log_path)
    record["verdict"] = long_mix_verdict(
        record["baseline"]["short"], record["mix"]["short"], record["mix"]["long"], record["mix"]["server"], plan
    )
    record["machine"]["load_avg_at_end"] = list(os.getloadavg())
    record["uptime_after"] = uptime()
    record["runtime_s"] = round(time.monotonic() - started, 1)
    return record


def summary(record: dict[str, Any]) -> list[str]:
    """A few lines: the checks and the figures behind them."""
    v = record["verdict"]
    req = v["requests"]
    return [
        f"{record['uptime_before']}  ->  {record['uptime_after']}",
        f"long prompts {record['settings']['long_prompt_tokens']} tokens; KV max used {v['kv_max_used_bytes']} of "
        f"budget {v['kv_budget_bytes']} bytes, evictions {v['kv_evictions']} (re-prefilled {v['kv_reprefills']}: "
        f"{v['kv_reprefill_tokens']} tokens), target call failures "
        f"{v['target_call_failures']}, prefill chunks {v['prefill_chunks']}: inside budget {v['kv_inside_budget']}",
        f"short TTFT p90 {v['short_ttft_p90_ms']} ms: x{v['short_ttft_p90_ratio']} with the long prompts; "
        f"short ITL p50 {v['short_itl_p50_ms']} ms",
        *(f"{name}: {r}" for name, r in req.items()),
        f"failures only by admission: {v['failures_only_admission']}; all ok: {v['ok']}",
    ]


def cmd_long_mix(args: Any, seconds: float) -> int:
    plan = LongMixPlan()
    if seconds > 0:
        plan = replace(plan, seconds=seconds)
    if args.cache_budget_bytes:
        plan = replace(plan, cache_budget_bytes=args.cache_budget_bytes)
    record = run_long_mix(args, plan)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print("\n".join(summary(record)))
    print(f"\nwrote {args.out}")
    return 0
