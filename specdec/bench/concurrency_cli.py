"""`specdec bench-concurrency`'s command line and its table."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from specdec.bench.concurrency import (
    DEFAULT_CONCURRENCY,
    DEFAULT_KS,
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_REPEATS,
    ConcurrencyArgs,
    run,
)
from specdec.bench.plan import PROMPTS_DIR, env_assignments


def table(result: dict[str, Any]) -> str:
    """The human-readable summary."""
    cs = [str(c) for c in result["settings"]["concurrency"]]
    lines = [f"{'k':>3} {'stack':<10} " + " ".join(f"{'c=' + c:>20}" for c in cs)]
    for k_name, per_k in result["throughput"].items():
        for stack, cells in per_k.items():
            row = " ".join(f"{cells[c]['tokens_per_s']:7.1f} tok/s b={cells[c]['mean_batch']:3.1f}" for c in cs)
            lines.append(f"{k_name[1:]:>3} {stack:<10} {row}")
    lines.append(
        "where the wall time goes (batched target; s per run: prefill / decode / batch wait / idle, "
        "tok/s of the decode passes alone, round overhead p50):"
    )
    for k_name, per_k in result["throughput"].items():
        for c, cell in per_k.get("batched", {}).items():
            sp = cell.get("split") or {}
            if sp:
                lines.append(
                    f"  k={k_name[1:]} c={c}: {sp['prefill_s']:.2f} / {sp['decode_s']:.2f} / "
                    f"{sp['batch_wait_s']:.2f} / {sp['idle_s']:.2f} s ({sp['prefill_share']:.0%} / "
                    f"{sp['decode_share']:.0%} / {sp['batch_wait_share']:.0%} / {sp['idle_share']:.0%}); "
                    f"{sp['tokens_per_decode_s']:.1f} tok/s decode-only; overhead p50 "
                    f"{sp['round_overhead_ms_p50']:.1f} ms"
                )
    lines.append("ratios: " + json.dumps(result["ratios"]))
    server = result.get("llama_server") or {}
    if "tokens_per_s" in server:
        ours = result["throughput"].get("k0", {}).get("batched", {})
        lines.append(
            f"llama-server -np {server['slots']} ({server['gguf']}, {server['threads']} threads): "
            + ", ".join(
                f"c={c} {v:.1f} tok/s (ours k=0 batched {ours[c]['tokens_per_s'] / v:.2f}x)"
                if c in ours
                else f"c={c} {v:.1f}"
                for c, v in server["tokens_per_s"].items()
            )
        )
    elif server:
        lines.append(f"llama-server: skipped ({server.get('skipped')})")
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench-concurrency", help="aggregate throughput at 1/4/8 sessions, batched vs unbatched target")
    p.add_argument("--concurrency", default=",".join(map(str, DEFAULT_CONCURRENCY)))
    p.add_argument("--k", default=",".join(map(str, DEFAULT_KS)), help="k values (0 = target only)")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    p.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    p.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "int8", "int4"])
    p.add_argument("--no-llama-server", action="store_true", help="skip llama.cpp's own server on the same waves")
    p.add_argument("--target-model", default="embedded")
    p.add_argument("--prompts", default="grounded,open")
    p.add_argument("--prompts-dir", default=str(PROMPTS_DIR))
    p.add_argument("--out", default="bench/results/concurrency.json")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--compare-env",
        default="",
        help="also run a second batched target with these variables set (NAME=V,NAME=V), e.g. "
        "SPECDEC_LOOP_FORWARDS=0: reported as batched_env and batched_vs_env",
    )


def cmd_bench_concurrency(ns: argparse.Namespace) -> int:
    """Run, write the JSON, print the table."""
    ints = lambda text: sorted({int(x) for x in text.split(",") if x.strip()})  # noqa: E731
    args = ConcurrencyArgs(
        concurrency=ints(ns.concurrency),
        ks=ints(ns.k),
        max_new_tokens=ns.max_new_tokens,
        repeats=ns.repeats,
        max_batch=ns.max_batch,
        threads=ns.threads,
        dtype=ns.dtype,
        target_model=ns.target_model,
        prompts=ns.prompts.split(","),
        prompts_dir=ns.prompts_dir,
        out=ns.out,
        progress=not ns.no_progress,
        llama_server=not ns.no_llama_server,
        compare_env=env_assignments(ns.compare_env),
    )
    logging.getLogger().setLevel(logging.WARNING)
    result = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    print(f"\nJSON: {out}")
    return 0
