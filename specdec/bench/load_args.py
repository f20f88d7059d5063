"""`specdec bench-load`'s command line: its flags, and the run they describe (LoadArgs).

The run itself is specdec/bench/load.py; what it runs (configurations, points) specdec/bench/load_plan.py.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from pathlib import Path

from specdec.bench.load_plan import DATASETS, DEFAULT_MODE, FULL_MODE, QUICK_MODE, LoadConfig, Mode, configurations
from specdec.config import DEFAULT_MODELS

DEFAULT_GUIDELLM = ".venv-load/bin/guidellm"
DEFAULT_WORK_DIR = "bench/out/load"
DEFAULT_ADAPTIVE_CAP = 8
DEFAULT_OUT = "bench/results/load.json"
LONG_MIX_OUT = "bench/results/load_longmix.json"
MIB = 1024 * 1024


@dataclass
class LoadArgs:
    """One `specdec bench-load` run: its mode, configurations, stack and outputs."""

    mode: Mode
    mode_name: str
    adaptive_cap: int = DEFAULT_ADAPTIVE_CAP
    threads: int = 1
    max_batch: int = 0
    max_seconds_per_point: float = 0.0
    cache_budget_bytes: int = 0  # 0: the target service's default
    prefix_share_min_tokens: int = 0  # the services' SPECDEC_PREFIX_SHARE_MIN_TOKENS (-1: their default)
    target_model: str = "embedded"
    draft_kind: str = "ngram"  # the stack's draft (model / combined: a draft service of its own)
    draft_model: str = ""  # model / combined: its spec ("": the shipped one of the embedded target)
    dtype: str = ""  # the model services' weights ("": their default, auto)
    guidellm: str = DEFAULT_GUIDELLM
    work_dir: str = DEFAULT_WORK_DIR
    out: str = "bench/results/load.json"
    plot: str = "bench/results/load.png"
    configs: list[LoadConfig] = field(default_factory=list)
    metrics_urls: list[str] = field(default_factory=list)  # set once the stack runs
    service_pids: dict[str, int] = field(default_factory=dict)  # role -> pid, set once the stack runs
    note: str = ""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench-load", help="latency/throughput vs load through the OpenAI endpoint (guidellm)")
    p.add_argument("--quick", action="store_true", help="2 concurrencies, 2 rates, 3 requests each (smoke test)")
    p.add_argument(
        "--full",
        action="store_true",
        help="the full matrix: 6 concurrencies, 8 rates, k 2/4/8, "
        "100 requests per point, bench prompts and synthetic data",
    )
    p.add_argument("--concurrency", help="closed-loop points, e.g. 1,4,16")
    p.add_argument(
        "--rate-fractions",
        help="Poisson rates as fractions of k = 0's saturation, e.g. 0.2,0.4,1 (none: closed-loop points only)",
    )
    p.add_argument("--requests", type=int, help="requests per point")
    p.add_argument("--max-tokens", type=int, help="output tokens per request (ignore_eos)")
    p.add_argument("--k", help="fixed k configurations besides k = 0, e.g. 4 or 2,4,8")
    p.add_argument("--adaptive-cap", type=int, default=DEFAULT_ADAPTIVE_CAP, help="k cap of adaptive k (0: none)")
    p.add_argument(
        "--data",
        help=f"data sets: {','.join(DATASETS)} (prompts: the bench's grounded and open "
        "prompts mixed; grounded: those alone)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of the target service (and of the draft service, with --draft-kind model / combined)",
    )
    p.add_argument("--max-batch", type=int, default=0, help="target sessions per forward pass (0: its default)")
    p.add_argument("--max-seconds-per-point", type=float, default=0.0, help="also stop a point after N s (0: off)")
    p.add_argument("--target-model", default="embedded")
    p.add_argument(
        "--draft-kind",
        choices=["ngram", "model", "combined"],
        default="ngram",
        help="the stack's draft (model / combined start a draft service with --threads torch threads)",
    )
    p.add_argument(
        "--draft-model",
        default="",
        help="model / combined: the draft's spec (default with the embedded target: its shipped draft)",
    )
    p.add_argument(
        "--dtype",
        default="",
        choices=["", "float32", "bfloat16", "int8", "int4"],
        help="the model services' weights (default: theirs, auto; bfloat16 on a CPU with AMX batches "
        "almost for free, docs/performance.md)",
    )
    p.add_argument("--guidellm", default=DEFAULT_GUIDELLM, help="the guidellm executable (make bench-load installs it)")
    p.add_argument("--work-dir", default=DEFAULT_WORK_DIR, help="scenarios, guidellm reports and logs")
    p.add_argument("--out", default=None, help=f"the JSON (default {DEFAULT_OUT}; --long-mix: {LONG_MIX_OUT})")
    p.add_argument("--plot", default="bench/results/load.png")
    p.add_argument("--note", default="", help="a note stored in the JSON (e.g. why a run is small)")
    p.add_argument(
        "--reparse",
        metavar="JSON",
        help="run nothing: rebuild this bench-load JSON from the guidellm "
        "reports it names (kept in the work dir); --out defaults to it",
    )
    p.add_argument(
        "--long-mix",
        action="store_true",
        help="instead of the curves: 16 sessions, 4 with long prompts, vs the short ones alone "
        "(KV budget, short TTFT, failures; specdec/bench/load_longmix.py)",
    )
    p.add_argument("--long-mix-seconds", type=float, default=0.0, help="each long-mix phase's length (0: default)")
    p.add_argument(
        "--prefix-share-min-tokens",
        type=int,
        default=0,
        help="the model services' prefix sharing (SPECDEC_PREFIX_SHARE_MIN_TOKENS; -1: their default). "
        "Default 0, off: the bench's prompts repeat across configurations and points, and with "
        "sharing whichever configuration meets a prompt first would pay its prefill for the rest",
    )
    p.add_argument(
        "--cache-budget-mib",
        type=int,
        default=0,
        help="the target's KV budget in MiB (0: the service default; --long-mix: its own default)",
    )


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise SystemExit(f"specdec bench-load: {flag} must be integers separated by commas, got {text!r}") from None


def args_from_cli(ns: argparse.Namespace) -> LoadArgs:
    if ns.quick and ns.full:
        raise SystemExit("specdec bench-load: --quick and --full exclude each other")
    name, mode = ("quick", QUICK_MODE) if ns.quick else ("full", FULL_MODE) if ns.full else ("default", DEFAULT_MODE)
    if ns.concurrency:
        mode = replace(mode, concurrency=_ints(ns.concurrency, "--concurrency"))
    if ns.rate_fractions == "none":
        mode = replace(mode, rate_fractions=())
    elif ns.rate_fractions:
        try:
            mode = replace(mode, rate_fractions=tuple(float(x) for x in ns.rate_fractions.split(",") if x.strip()))
        except ValueError:
            raise SystemExit(
                f"specdec bench-load: --rate-fractions must be numbers, got {ns.rate_fractions!r}"
            ) from None
    if ns.requests is not None:
        mode = replace(mode, requests_per_point=ns.requests)
    if ns.max_tokens is not None:
        mode = replace(mode, max_tokens=ns.max_tokens)
    if ns.k:
        mode = replace(mode, fixed_ks=_ints(ns.k, "--k"))
    if ns.data:
        data = tuple(d.strip() for d in ns.data.split(",") if d.strip())
        if not data or set(data) - set(DATASETS):
            raise SystemExit(f"specdec bench-load: --data takes {', '.join(DATASETS)}, got {ns.data!r}")
        mode = replace(mode, datasets=data)
    if mode.requests_per_point < 1 or mode.max_tokens < 1 or not mode.concurrency:
        raise SystemExit("specdec bench-load: --requests and --max-tokens must be >= 1, --concurrency not empty")
    return LoadArgs(
        mode=mode,
        mode_name=name,
        adaptive_cap=ns.adaptive_cap,
        threads=ns.threads,
        draft_kind=ns.draft_kind,
        draft_model=_draft_model(ns),
        dtype=ns.dtype,
        max_batch=ns.max_batch,
        max_seconds_per_point=ns.max_seconds_per_point,
        cache_budget_bytes=max(0, ns.cache_budget_mib) * MIB,
        prefix_share_min_tokens=ns.prefix_share_min_tokens,
        target_model=ns.target_model,
        guidellm=str(Path(ns.guidellm).absolute()),
        work_dir=ns.work_dir,
        out=ns.out or (LONG_MIX_OUT if ns.long_mix else DEFAULT_OUT),
        plot=ns.plot,
        note=ns.note,
        configs=_configs(ns, mode),
    )


def _draft_model(ns: argparse.Namespace) -> str:
    """The draft's spec: --draft-model, or the embedded target's shipped draft for model / combined."""
    if ns.draft_kind == "ngram" or ns.draft_model:
        return ns.draft_model
    if ns.target_model != "embedded":
        raise SystemExit(f"specdec bench-load: --draft-kind {ns.draft_kind} needs --draft-model SPEC")
    return DEFAULT_MODELS["draft"]


def _configs(ns: argparse.Namespace, mode: Mode) -> list[LoadConfig]:
    """configurations() of the mode."""
    return configurations(mode.fixed_ks, ns.adaptive_cap)
