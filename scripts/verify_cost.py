"""Verify cost v(n) of a target: one forward over n new tokens after a cached context, n = 1..N.

The prepared measurement for a GPU machine: it needs torch and transformers only
(no gRPC, no Redis, no model files: the models are random-weight ones built from the configs of
Qwen1.5-0.5B and Qwen1.5-1.8B, the source article's pair), and writes one JSON file. The timing is
the bench's own (`specdec.bench.verify_cost.measure_verify_costs`, which imports only torch and
transformers): extend the KV cache by n tokens in one pass, roll it back to the context, the device
synchronised around each pass.

    python scripts/verify_cost.py --out "$OUT/verify_cost.json"            # GPU if there is one
    python scripts/verify_cost.py --shapes tiny --device cpu --n-max 3     # a smoke run anywhere

Absolute times hold only for the machine that ran it; v(n)/v(1) is what bounds the speed-up
(bench/README.md, `bound`: bound = accepted tokens per round / (k*c + v(k+1))).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: specdec need not be installed
from specdec.bench.verify_cost import measure_verify_costs  # noqa: E402

# Qwen1.5 is the Qwen2 architecture; these are the published configs' shapes (vocab 151,936).
SHAPES: dict[str, dict[str, int]] = {
    "qwen1.5-0.5b": dict(
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=16,
        vocab_size=151936,
    ),
    "qwen1.5-1.8b": dict(
        hidden_size=2048,
        intermediate_size=5504,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=16,
        vocab_size=151936,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
    ),
}
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def build(shape: str, device: torch.device, dtype: torch.dtype, seed: int) -> Qwen2ForCausalLM:
    """A random-weight model of the named shape (weights do not change the time of a pass)."""
    cfg = Qwen2Config(max_position_embeddings=4096, tie_word_embeddings=False, **SHAPES[shape])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg)
    return model.to(device=device, dtype=dtype).eval()


def summarise(measured: dict[str, Any]) -> dict[str, Any]:
    """Median ms per n, min-max spread, and v(n)/v(1), rounded for the JSON."""
    return {
        "ms": {n: round(v, 4) for n, v in measured["ms"].items()},
        "spread_ms": {n: [round(lo, 4), round(hi, 4)] for n, (lo, hi) in measured["spread_ms"].items()},
        "ratio": {n: round(v, 4) for n, v in measured["ratio"].items()},
    }


def machine(device: torch.device) -> dict[str, Any]:
    info = {
        "device": str(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    else:
        info["cpu_threads"] = torch.get_num_threads()
    return info


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else ("cpu" if args.device == "auto" else args.device)
    )
    dtype = DTYPES[args.dtype if args.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")]
    result: dict[str, Any] = {
        "machine": machine(device),
        "dtype": str(dtype).replace("torch.", ""),
        "context_tokens": args.context,
        "reps": args.reps,
        "shapes": {},
    }
    for shape in args.shapes.split(","):
        model = build(shape, device, dtype, args.seed)
        started = time.perf_counter()
        measured = measure_verify_costs(model, None, args.n_max, args.context, args.reps, model.config.vocab_size)
        result["shapes"][shape] = summarise(measured)
        result["shapes"][shape]["seconds"] = round(time.perf_counter() - started, 1)
        result["shapes"][shape]["parameters"] = sum(p.numel() for p in model.parameters())
        print(
            f"{shape}: v(n)/v(1) "
            + " ".join(f"{n}:{r}" for n, r in result["shapes"][shape]["ratio"].items())
            + f"  (v(1) = {result['shapes'][shape]['ms']['1']} ms)",
            flush=True,
        )
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="qwen1.5-0.5b,qwen1.5-1.8b", help=f"comma list of {sorted(SHAPES)}")
    p.add_argument("--device", default="auto", help="auto (cuda when present), cuda, cpu")
    p.add_argument("--dtype", default="auto", choices=["auto", *DTYPES], help="auto: bfloat16 on GPU, float32 on CPU")
    p.add_argument("--context", type=int, default=300, help="cached tokens before the verified ones")
    p.add_argument("--n-max", type=int, default=17)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench/results/verify_cost_gpu.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    result = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
