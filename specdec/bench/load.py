"""`specdec bench-load`: latency-throughput curves of the OpenAI endpoint under load, measured by guidellm.

Starts the local stack (embedded Redis, target, n-gram draft or a draft service, orchestrator) and the
HTTP gateway, then runs guidellm (the vLLM project's load generator, installed by `make bench-load` in its
own virtual environment, .venv-load) against /v1/chat/completions for every configuration (k = 0, fixed
k, adaptive k, and k = 0 again as the A/A repeat) at the same points:
closed-loop concurrency levels, then Poisson rates derived once from k = 0's saturation throughput.
Each point is run by every configuration in turn before the next point (one guidellm run each), in the
listed order at one point and reversed at the next (`point_order`): whatever drifts over a ~30-minute
run (the stack's state, the machine's other load) falls on all configurations alike instead of on the
last one.
guidellm gets the target's tokenizer as a local directory exported from the model (never a hub id).
What the figures mean: specdec/bench/load_results.py; how to run: bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specdec.bench.load_args import LoadArgs, args_from_cli
from specdec.bench.load_cpu import children_cpu_s, cpu_by_service, cpu_delta, service_pids
from specdec.bench.load_plan import (
    CHAT_SETS,
    CONCURRENCY,
    GUIDELLM_VERSION,
    K0,
    RATE,
    LoadConfig,
    ScenarioInputs,
    data_inputs,
    invocation_seed,
    rate_list,
    scenario,
    sets_by_content,
    write_chat_jsonl,
)
from specdec.bench.load_results import (
    SERVER_SAMPLES,
    add_ratios,
    compared_to_k0,
    noise_band,
    parse_report,
    saturation_rps,
    server_delta,
    server_samples,
)
from specdec.bench.plan import WARMUP_TOKENS

log = logging.getLogger("specdec.bench.load")

WARMUP_TIMEOUT_S = 300.0
SCRAPE_TIMEOUT_S = 10.0
#: a guidellm run that takes longer than this is stuck (the default run takes ~30 min in all).
GUIDELLM_TIMEOUT_S = 4 * 3600.0
#: guidellm's worker processes (its default: one per stream up to 10, each a Python with its own imports,
#: on the cores the stack needs); the streams are async inside each worker, so 2 carry 16 streams.
GUIDELLM_WORKERS = 2


def guidellm_env() -> dict[str, str]:
    """guidellm's environment: offline (no hub), its progress UI off, at most GUIDELLM_WORKERS processes."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "GUIDELLM__MAX_WORKER_PROCESSES": str(GUIDELLM_WORKERS),
    }


def check_guidellm(path: str) -> str:
    """The installed guidellm's version; a clear error when it is missing (make bench-load installs it)."""
    exe = Path(path)
    if not exe.is_file():
        raise SystemExit(
            f"specdec bench-load: no guidellm at {path}: `make bench-load` creates .venv-load with "
            f"guidellm=={GUIDELLM_VERSION} (or pass --guidellm PATH)"
        )
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, env=guidellm_env(), timeout=120)
    version = out.stdout.strip().split()[-1] if out.stdout.strip() else "unknown"
    if version != GUIDELLM_VERSION:
        log.warning("guidellm %s found, the scenarios are written for %s", version, GUIDELLM_VERSION)
    return version


def export_processor(target_model: str, out_dir: Path) -> Path:
    """Save the target's tokenizer (and chat template) as a local directory for guidellm's `tokenizer.model`."""
    from specdec.models.loader import load_tokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    load_tokenizer(target_model).save_pretrained(str(out_dir))
    return out_dir


def warm_up(url: str, configs: list[LoadConfig]) -> None:
    """One short request per configuration (first-call costs out of the measurement)."""
    for cfg in configs:
        body = {
            "model": "specdec",
            "max_tokens": WARMUP_TOKENS,
            "messages": [{"role": "user", "content": "Hello"}],
            "specdec": cfg.extension(),
        }
        req = urllib.request.Request(
            f"{url}/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=WARMUP_TIMEOUT_S) as resp:  # noqa: S310 - loopback only
            resp.read()


def scrape(metrics_urls: list[str], names: tuple[str, ...] = SERVER_SAMPLES) -> dict[str, float]:
    """The samples `names` (default: batch fill and k) of the target's and the orchestrator's /metrics
    pages, added up."""
    total: dict[str, float] = {}
    for url in metrics_urls:
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as resp:  # noqa: S310 - loopback only
            for name, value in server_samples(resp.read().decode(), names).items():
                total[name] = total.get(name, 0.0) + value
    return total


def uptime() -> str:
    """`uptime`'s line (load averages over 1, 5 and 15 minutes), recorded before and after a run."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"uptime unavailable: {exc}"


@contextlib.contextmanager
def serving(args: LoadArgs, max_concurrent: int) -> Iterator[tuple[Any, Any]]:
    """The local stack (embedded Redis, target, the draft of --draft-kind, orchestrator) and the HTTP gateway, running;
    sets args.metrics_urls (target and orchestrator /metrics). Yields (stack, gateway); stops both."""
    from http_gateway.process import GatewayProcess
    from specdec.launcher import LocalStack, StackConfig

    work = Path(args.work_dir).resolve()
    stack = LocalStack(
        StackConfig(
            target_model=args.target_model,
            draft_model=args.draft_model,
            draft_kind=args.draft_kind,
            dtype=args.dtype,
            threads=args.threads,
            max_batch=args.max_batch,
            cache_budget_bytes=args.cache_budget_bytes,
            max_concurrent=max_concurrent,
            log_dir=str(work / "logs"),
            metrics=True,
            extra_env=_service_env(args),
        )
    )
    gateway = None
    try:
        stack.start()
        args.metrics_urls = [
            f"http://127.0.0.1:{p.metrics_port}/metrics"
            for p in stack.procs
            if p.role in ("target", "orchestrator") and p.metrics_port
        ]
        gateway = GatewayProcess(stack.orchestrator_address, log_dir=str(work / "logs")).start()
        args.service_pids = service_pids(stack, gateway)
        yield stack, gateway
    finally:
        if gateway is not None:
            gateway.stop()
        stack.stop()


def _service_env(args: LoadArgs) -> dict[str, str]:
    """Environment for the model services: prefix sharing when --prefix-share-min-tokens sets it."""
    if args.prefix_share_min_tokens < 0:
        return {}
    return {"SPECDEC_PREFIX_SHARE_MIN_TOKENS": str(args.prefix_share_min_tokens)}


@dataclass
class Invocation:
    """One guidellm run: one configuration, one phase, all its points."""

    config: str
    dataset: str
    phase: str
    values: list[float]
    wall_s: float
    cpu_s: float
    load_avg_before: list[float]
    load_avg_after: list[float]
    report: str
    server: dict[str, Any] = field(default_factory=dict)  # mean target batch, mean k, CPU s per service (cpu_s)


def run_guidellm(
    args: LoadArgs,
    cfg: LoadConfig,
    dataset: str,
    phase: str,
    values: list[Any],
    inp: ScenarioInputs,
    sets: dict[str, str] | None = None,
) -> tuple[list[dict[str, Any]], str, Invocation]:
    """Write the scenario, run guidellm on it, parse its report (split by prompt set with `sets`,
    content -> set): (rows, guidellm version, invocation)."""
    work = Path(args.work_dir).resolve()
    tag = f"{dataset}-{phase}-{'_'.join(str(v) for v in values)}-{cfg.name}"
    report_path = work / f"{tag}.guidellm.json"
    report_path.unlink(missing_ok=True)
    inp = replace(inp, out_json=str(report_path), seed=invocation_seed(inp.seed, dataset, tag))
    scenario_path = work / f"{tag}.scenario.json"
    scenario_path.write_text(json.dumps(scenario(cfg, phase, values, inp), indent=1))
    log.info("guidellm: %s %s %s at %s", dataset, cfg.name, phase, values)
    scraped, services_before = scrape(args.metrics_urls), cpu_by_service(args.service_pids)
    load_before, cpu_before, started = list(os.getloadavg()), children_cpu_s(), time.monotonic()
    with (work / f"{tag}.guidellm.log").open("wb") as out:
        proc = subprocess.run(
            [args.guidellm, "run", "--scenario", str(scenario_path), "--disable-console-interactive"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=guidellm_env(),
            cwd=str(work),
            timeout=GUIDELLM_TIMEOUT_S,
            check=False,
        )
    inv = Invocation(
        cfg.name,
        dataset,
        phase,
        list(values),
        round(time.monotonic() - started, 2),
        round(children_cpu_s() - cpu_before, 2),
        load_before,
        list(os.getloadavg()),
        str(report_path),
    )
    inv.server = {
        **server_delta(scraped, scrape(args.metrics_urls)),
        "cpu_s": cpu_delta(services_before, cpu_by_service(args.service_pids)),
    }
    if proc.returncode != 0 or not report_path.is_file():
        tail = (work / f"{tag}.guidellm.log").read_text(errors="replace").splitlines()[-30:]
        raise RuntimeError(f"guidellm failed ({proc.returncode}) for {tag}:\n" + "\n".join(tail))
    rows, version = parse_report(json.loads(report_path.read_text()), sets)
    return rows, version, inv


def prompt_sets(dataset: str) -> dict[str, str] | None:
    """Content -> prompt set for a data set of bench prompts (to split its reports by set); None otherwise."""
    return sets_by_content(CHAT_SETS[dataset]) if dataset in CHAT_SETS else None


def point_order(configs: list[LoadConfig], index: int) -> list[LoadConfig]:
    """The order the configurations run the index-th point in: as listed at even points, reversed at odd ones.

    Run one after another over a whole phase, the configuration run last takes the machine's drift: an A/A
    repeat of k = 0, always last, can read 0.67-0.84x k = 0 at some points. Interleaved per point, every
    configuration of a point runs within a few minutes of the others, and the reversal keeps any one
    from always being first or last."""
    return list(configs) if index % 2 == 0 else list(reversed(configs))


def run_dataset(args: LoadArgs, dataset: str, inp: ScenarioInputs, record: dict[str, Any]) -> dict[str, Any]:
    """Every configuration at every point of one data set: the concurrency points, then the Poisson rates
    derived from k = 0's saturation; each point run by every configuration (`point_order`) before the next."""
    results: dict[str, dict[str, dict[str, Any]]] = {c.name: {} for c in args.configs}
    sets = prompt_sets(dataset)
    rates: list[float] = []
    n_point = 0
    for phase in (CONCURRENCY, RATE):
        values: list[Any] = list(args.mode.concurrency) if phase == CONCURRENCY else rates
        for value in values:
            for cfg in point_order(args.configs, n_point):
                rows, version, inv = run_guidellm(args, cfg, dataset, phase, [value], inp, sets)
                record["guidellm_version"] = version
                record["invocations"].append(inv.__dict__)
                results[cfg.name].update({r["point"]: r for r in rows})
            n_point += 1
        if phase == CONCURRENCY and args.mode.rate_fractions:
            sat = saturation_rps(list(results[K0].values()))
            rates = rate_list(sat, args.mode.rate_fractions)
            log.info("%s: k = 0 saturation %.3f requests/s -> rates %s", dataset, sat, rates)
    return summarize(results, rates, [c.name for c in args.configs])


def summarize(results: dict[str, dict[str, dict[str, Any]]], rates: list[float], configs: list[str]) -> dict[str, Any]:
    """One data set's entry of the JSON: rows with ratios to k = 0, the A/A band, each configuration against k = 0."""
    add_ratios(results)
    band = noise_band(results)
    sat = saturation_rps(list(results[K0].values()))
    return {
        "saturation_rps_k0": sat,
        "rates": rates,
        "configs": results,
        "noise_band": band,
        "compared_to_k0": {name: compared_to_k0(results, name, band) for name in configs if name != K0},
    }


def reparse(record: dict[str, Any]) -> dict[str, Any]:
    """Rebuild every data set of a bench-load JSON from the guidellm reports its invocations name (they
    must still be in the work dir): what a newer parser reads from a run already made, such as ``by_set``."""
    for dataset, entry in record["datasets"].items():
        sets = prompt_sets(dataset)
        configs = list(entry["configs"])
        results: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in configs}
        for inv in record["invocations"]:
            if inv["dataset"] == dataset:
                rows, _ = parse_report(json.loads(Path(inv["report"]).read_text()), sets)
                results[inv["config"]].update({r["point"]: r for r in rows})
        record["datasets"][dataset] = summarize(results, entry["rates"], configs)
    record["reparsed"] = time.strftime("%Y-%m-%d %H:%M:%S")
    return record


def _settings(args: LoadArgs) -> dict[str, Any]:
    m = args.mode
    return {
        "mode": args.mode_name,
        "concurrency": list(m.concurrency),
        "rate_fractions": list(m.rate_fractions),
        "requests_per_point": m.requests_per_point,
        "max_tokens": m.max_tokens,
        "datasets": list(m.datasets),
        "synthetic_prompt_tokens": m.synthetic_prompt_tokens,
        "configs": {c.name: c.extension() for c in args.configs},
        "config_order": "interleaved: each point run by every configuration, reversed at every other point",
        "threads": {
            "target": args.threads,
            "cores": os.cpu_count(),
            "draft": "n-gram (no torch)" if args.draft_kind == "ngram" else args.threads,
        },
        "draft": {"kind": args.draft_kind, "model": args.draft_model},
        "dtype": args.dtype or "service default",
        "max_batch": args.max_batch or "service default",
        "cache_budget_bytes": args.cache_budget_bytes or "service default",
        "max_seconds_per_point": args.max_seconds_per_point,
        "prefix_share_min_tokens": args.prefix_share_min_tokens
        if args.prefix_share_min_tokens >= 0
        else "service default",
        "target_model": args.target_model,
        "endpoint": "/v1/chat/completions (stream)",
        "sampling": "greedy (temperature 0), ignore_eos",
        "guidellm_workers": GUIDELLM_WORKERS,
    }


def run(args: LoadArgs) -> dict[str, Any]:
    """Start the stack and the gateway, run every data set, return the JSON result."""
    from specdec.bench.machine import machine_info

    version = check_guidellm(args.guidellm)
    work = Path(args.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    processor = export_processor(args.target_model, work / "processor")
    top_c = max(args.mode.concurrency)
    chat_files = {name: work / f"{name}.chat.jsonl" for name in args.mode.datasets if name in CHAT_SETS}
    for name, path in chat_files.items():
        write_chat_jsonl(path, min_rows=args.mode.requests_per_point + 2 * top_c, sets=CHAT_SETS[name])
    record: dict[str, Any] = {
        "note": args.note,
        "settings": _settings(args),
        "machine": machine_info(),
        "uptime_before": uptime(),
        "guidellm_version": version,
        "invocations": [],
        "datasets": {},
    }
    started = time.monotonic()
    with serving(args, max(64, 4 * top_c)) as (_, gateway):
        warm_up(gateway.url, args.configs)
        for dataset in args.mode.datasets:
            inp = ScenarioInputs(
                target_url=gateway.url,
                processor_dir=str(processor),
                data_file=str(chat_files.get(dataset, "")),
                out_json="",
                requests_per_point=args.mode.requests_per_point,
                max_tokens=args.mode.max_tokens,
                max_seconds_per_point=args.max_seconds_per_point,
                **data_inputs(dataset, args.mode.synthetic_prompt_tokens),
            )
            record["datasets"][dataset] = run_dataset(args, dataset, inp, record)
    invs = record["invocations"]
    record["guidellm_cpu_s"] = round(sum(i["cpu_s"] for i in invs), 2)
    record["guidellm_wall_s"] = round(sum(i["wall_s"] for i in invs), 2)
    record["machine"]["load_avg_at_end"] = list(os.getloadavg())
    record["uptime_after"] = uptime()
    record["runtime_s"] = round(time.monotonic() - started, 1)
    return record


def cmd_bench_load(ns: argparse.Namespace) -> int:
    from specdec.bench.load_summary import plot, summary_lines

    args = args_from_cli(ns)
    if ns.reparse:
        record = reparse(json.loads(Path(ns.reparse).read_text()))
        args.out = ns.out or ns.reparse
        args.plot = str(Path(args.out).with_suffix(".png"))
    else:
        record = run(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    if args.plot:
        plot(record, args.plot)
    print("\n".join(summary_lines(record)))
    print(f"\nwrote {args.out}" + (f" and {args.plot}" if args.plot else ""))
    return 0
