"""`specdec distill --target SPEC --out DIR [...]`: corpus -> target data -> draft training -> held-out report.

Every stage is resumable: data chunks are skipped when present, training restarts from
DIR/checkpoint.pt (with --resume), and the final draft is written atomically to DIR.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("specdec.distill")
STATE_FILE = "distill_state.json"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("distill", help="train a small draft model for a target by self-distillation")
    p.add_argument("--target", required=True, help="model spec of the target (e.g. embedded)")
    p.add_argument("--out", required=True, help="output directory (the draft; data/ and checkpoints inside)")
    p.add_argument("--prompts", help="prompt file (.jsonl with {'prompt': ...} or one per line); default: shipped")
    p.add_argument("--docstrings", type=int, default=1000, help="extra prompts from stdlib docstrings (0 = none)")
    p.add_argument(
        "--variants",
        type=int,
        default=4,
        help="continuations per chat prompt: 1 greedy + (variants-1) sampled (other prompts: greedy)",
    )
    p.add_argument(
        "--self-prompts",
        type=int,
        default=4000,
        help="extra chat prompts the target writes itself from its bare chat template (Magpie); "
        "answered greedily like the others (0 = none)",
    )
    p.add_argument(
        "--self-variants",
        type=int,
        default=2,
        help="continuations per self-written prompt: 1 greedy + (self-variants-1) sampled, generated "
        "after every other item, so raising it extends an earlier run's data",
    )
    p.add_argument(
        "--data-dtype",
        choices=["bfloat16", "float32"],
        default="bfloat16",
        help="dtype of the target copy that generates the data (bfloat16: ~2x faster on CPUs with "
        "AVX512-BF16; training and the report use the target as loaded)",
    )
    p.add_argument(
        "--train-dtype",
        choices=["bfloat16", "float32"],
        default="bfloat16",
        help="autocast dtype of the draft's training forward/backward (fp32 master weights and "
        "optimizer either way; bfloat16: ~2.2x faster steps on CPUs with AVX512-BF16)",
    )
    p.add_argument("--data-batch", type=int, default=64, help="sequences per generate call in the data stage")
    p.add_argument(
        "--arch",
        choices=["eagle", "layers"],
        default="layers",
        help="layers: a small standalone LM of --layers target-shaped layers; eagle: one layer fed the "
        "target's hidden states (a feature draft; the target keeps them by default)",
    )
    p.add_argument("--layers", type=int, default=2, choices=[1, 2, 3, 4], help="decoder layers of the draft")
    p.add_argument("--depth", type=int, default=3, help="--arch eagle: draft steps unrolled in training")
    p.add_argument(
        "--text-tokens",
        type=int,
        help="extra teacher-forced tokens of reference text (standard-library docstrings, package "
        "descriptions), one target prefill each, far cheaper than generating (default: 500000 "
        "for eagle; 0 for layers, where it lowered held-out acceptance: 1.42 vs 1.52)",
    )
    p.add_argument(
        "--feature-weight",
        type=float,
        default=0.2,
        help="--arch eagle: weight of the smooth-L1 loss on the predicted target features",
    )
    p.add_argument("--head-tokens", type=int, default=8192, help="FR-Spec head size (0 = full vocabulary)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--steps", type=int, help="training steps (default: 1500 for eagle, 4800 for layers)")
    p.add_argument("--batch-tokens", type=int, default=2048, help="tokens per training step")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--kl-weight", type=float, default=1.0, help="weight of the KL to the target's top-k (plus CE)")
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-prompts", type=int, default=0, help="held-out prompts in the report (0 = all)")
    p.add_argument("--eval-max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (default: all cores)")
    p.add_argument("--stop-after", choices=["data", "train"], help="stop after this stage")
    p.add_argument("--resume", action="store_true", help="continue a previous run in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    import torch

    from specdec.distill import corpus as corpus_mod
    from specdec.distill import data as data_mod
    from specdec.models.loader import load_causal_lm
    from specdec.models.spec import ModelLoadError
    from specdec.models.tokenizer_info import eos_token_ids

    torch.set_num_threads(args.threads)
    if args.steps is None:
        args.steps = 1500 if args.arch == "eagle" else 4800
    if args.text_tokens is None:
        args.text_tokens = 500_000 if args.arch == "eagle" else 0
    out = Path(args.out).expanduser()
    state_path = out / STATE_FILE
    if out.exists() and any(out.iterdir()) and not args.resume:
        print(f"specdec distill: {out} is not empty; pass --resume to continue it", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    state.setdefault("seconds", {})
    state["args"] = {k: v for k, v in vars(args).items() if k not in ("func", "resume", "quiet", "stop_after")}
    progress = not args.quiet

    corpus = corpus_mod.build_corpus(Path(args.prompts) if args.prompts else None, args.docstrings, args.seed)
    chat = set(corpus_mod.read_prompts(Path(args.prompts) if args.prompts else corpus_mod.SHIPPED_PROMPTS))
    print(
        f"corpus: {len(corpus.train)} training prompts ({len([p for p in corpus.train if p in chat])} chat), "
        f"{len(corpus.held_out)} held out",
        flush=True,
    )
    try:
        target = load_causal_lm(args.target)
    except ModelLoadError as exc:
        print(f"specdec distill: {exc}", file=sys.stderr)
        return 2
    model, tokenizer = target.model, target.tokenizer
    eos = eos_token_ids(model, tokenizer)

    _make_data(args, model, tokenizer, corpus.train, chat, eos, out / "data", state, progress)
    state["seconds"]["data"] = data_mod.data_seconds(out / "data")
    _save_state(state_path, state)
    if args.stop_after == "data":
        return 0

    if args.arch == "eagle":
        from specdec.distill.feature_train import train
    else:
        from specdec.distill.train import train

    t0 = time.time()
    train(model, tokenizer, out, args, progress=progress)
    state["seconds"]["train"] = state["seconds"].get("train", 0) + time.time() - t0
    _save_state(state_path, state)
    if args.stop_after == "train":
        return 0

    from specdec.distill import evaluate as eval_mod

    t0 = time.time()
    held = corpus.held_out[: args.eval_prompts] if args.eval_prompts else corpus.held_out
    report = eval_mod.evaluate(
        str(out), args.target, held, max_new=args.eval_max_new_tokens, k=4, threads=args.threads, progress=progress
    )
    state["seconds"]["eval"] = time.time() - t0
    report["training"] = {
        "seconds": state["seconds"],
        "args": state["args"],
        "train_prompts": len(corpus.train),
        "held_out_prompts": len(corpus.held_out),
        "self_prompts": state.get("self_prompts", 0),
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    _save_state(state_path, state)
    eval_mod.update_card(out, report)
    print(json.dumps({k: v for k, v in report.items() if k != "per_prompt"}, indent=2))
    print(f"wrote {out / 'report.json'} ({time.time() - started:.0f} s this run)")
    return 0


def _make_data(
    args: argparse.Namespace,
    model: Any,
    tokenizer: Any,
    train: list[str],
    chat: set[str],
    eos: list[int],
    data_dir: Path,
    state: dict,
    progress: bool,
) -> None:
    """Stage 2: self-written prompts (once), then the target's continuations of every training prompt."""
    import torch

    from specdec.distill import data as data_mod
    from specdec.distill.self_prompts import SELF_PROMPTS_FILE, generate_self_prompts

    gen_model = data_mod.generation_model(model, getattr(torch, args.data_dtype))
    t0 = time.time()
    own = generate_self_prompts(
        gen_model,
        tokenizer,
        args.self_prompts,
        data_dir / SELF_PROMPTS_FILE,
        eos=eos,
        seed=args.seed,
        batch=args.data_batch,
        progress=progress,
    )
    state["seconds"]["self_prompts"] = state["seconds"].get("self_prompts", 0) + time.time() - t0
    state["self_prompts"] = len(own)
    print(f"self-written prompts: {len(own)}", flush=True)
    data_mod.generate_data(
        gen_model,
        tokenizer,
        train + own,
        data_dir,
        variants=args.variants,
        max_new=args.max_new_tokens,
        eos=eos,
        seed=args.seed,
        sampled_prompts=[p for p in train if p in chat],
        extra_sampled=(own, args.self_variants),
        batch=args.data_batch,
        progress=progress,
    )


def _save_state(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(path)
