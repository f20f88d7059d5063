"""`specdec bench`'s command line: its options, the BenchArgs they make, and the command that runs and reports."""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any

from specdec.bench.plan import PROMPT_SETS, PROMPTS_DIR, BenchArgs
from specdec.bench.runner import DEFAULT_K, DEFAULT_MAX_NEW_TOKENS, DEFAULT_PROMPTS_PER_SET, DEFAULT_REPEATS, QUICK, run
from specdec.params import MODEL_DRAFT_KINDS


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
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "int8", "int4"],
        help="weights of the target (and a model draft), in the services and in HF alike (auto: the "
        "services' default: the GGUF's own on llama.cpp, HF in float32; int8: torch's int8 linears, "
        "specdec/models/int8.py; int4: its weight-only int4 GEMM with bf16 activations)",
    )
    p.add_argument(
        "--engine",
        default="auto",
        choices=["auto", "torch", "llamacpp"],
        help="the model services' runner (auto: llama.cpp for a GGUF on CPU with --dtype auto)",
    )
    p.add_argument(
        "--llama-server",
        default="",
        metavar="PATH",
        help="llama.cpp's server binary for its anchor columns (default: the one `make llama-server` built)",
    )
    p.add_argument("--no-llama-server", action="store_true", help="skip the llama-server anchor columns")
    p.add_argument(
        "--llama-server-configs",
        default="",
        metavar="NAMES",
        help="the llama-server configurations to run, a fresh server each, separated by commas (default: all: "
        "server, server_ngram_simple, server_ngram_mod); `server` alone keeps the target-alone anchor and "
        "its identity check",
    )
    p.add_argument("--hf-lookup-tokens", type=int, default=10, help="HF prompt_lookup_num_tokens")
    p.add_argument("--hf-ngram-size", type=int, default=2, help="HF max_matching_ngram_size")
    p.add_argument(
        "--no-llamacpp",
        action="store_true",
        help="skip the llama.cpp anchor (llama-cpp-python, optional; skipped with a note when absent)",
    )
    p.add_argument("--no-hf", action="store_true", help="skip the in-process HF anchors (c), (d)")
    p.add_argument("--no-adaptive", action="store_true", help="skip our adaptive-k configuration")
    p.add_argument("--adaptive-cap", type=int, default=0, help="k cap of adaptive k (default: largest k of --k)")
    p.add_argument(
        "--hop-delay-ms",
        type=float,
        default=0.0,
        help="TEST/BENCH ONLY: delay added to each hop of the orchestrator's draft/target calls "
        "(SPECDEC_HOP_DELAY_MS), to measure a distant draft",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="start no prompt after this many seconds of measuring (every configuration of the prompts "
        "measured so far is kept; the table says how many generations ran); 0: no limit",
    )
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
    server_configs = _llama_server_configs(ns.llama_server_configs)
    return BenchArgs(
        prompts=[s.strip() for s in ns.prompts.split(",") if s.strip()],
        ks=ks,
        max_new_tokens=pick(ns.max_new_tokens, QUICK["max_new_tokens"], DEFAULT_MAX_NEW_TOKENS),
        repeats=pick(ns.repeats, QUICK["repeats"], DEFAULT_REPEATS),
        prompts_per_set=pick(ns.prompts_per_set, QUICK["prompts_per_set"], DEFAULT_PROMPTS_PER_SET),
        threads=ns.threads if ns.threads is not None else min(2, os.cpu_count() or 1),
        out=ns.out,
        plot=ns.plot,
        target_model=ns.target_model,
        draft_kind=ns.draft_kind,
        draft_model=ns.draft_model,
        hf_lookup_tokens=ns.hf_lookup_tokens,
        hf_ngram_size=ns.hf_ngram_size,
        with_hf=not ns.no_hf,
        with_llamacpp=not ns.no_llamacpp,
        verify_reps=QUICK["verify_reps"] if quick else 7,
        quick=quick,
        progress=not ns.no_progress,
        prompts_dir=ns.prompts_dir,
        with_adaptive=not ns.no_adaptive,
        adaptive_cap=ns.adaptive_cap,
        dtype=ns.dtype,
        engine=ns.engine,
        with_llama_server=not ns.no_llama_server,
        llama_server=ns.llama_server,
        llama_server_configs=server_configs,
        hop_delay_ms=ns.hop_delay_ms,
        time_budget_s=ns.time_budget,
    )


def _llama_server_configs(text: str) -> list[str] | None:
    """--llama-server-configs as names of specdec.bench.llama_server.SPEC_CONFIGS (None: all of them)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        return None
    from specdec.bench.llama_server import SPEC_CONFIGS  # not at import: the CLI's parser is built for every command

    unknown = [name for name in names if name not in SPEC_CONFIGS]
    if unknown:
        raise SystemExit(
            f"specdec bench: --llama-server-configs takes names among {', '.join(SPEC_CONFIGS)}, got {', '.join(unknown)}"
        )
    return names


def cmd_bench(ns: argparse.Namespace) -> int:
    """Run the benchmark, print the table, write the JSON and the PNG."""
    from specdec.bench import report_plot, report_table

    args = args_from_cli(ns)
    logging.getLogger().setLevel(logging.WARNING)  # progress bars, not INFO lines
    result = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")  # files first: the table may go to a closed pipe
    if args.plot:
        report_plot.plot(result, Path(args.plot))
    print(report_table.table(result))
    print(f"\nJSON: {out}")
    if args.plot:
        print(f"plot: {args.plot}")
    return 0
