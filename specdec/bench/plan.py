"""What `specdec bench` compares: the configurations (:class:`Config`), the prompts (:class:`Prompt`,
bench/prompts/NAME.jsonl), the settings of a run (:class:`BenchArgs`) and one measured generation
(:class:`RunRecord`). Shared by the runner, the identity check, the report and `specdec bench-concurrency`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROMPT_SETS = ("grounded", "open")
VERIFY_CONTEXT_TOKENS = 300
WARMUP_TOKENS = 8  # the discarded first generation of each configuration and anchor (first-call costs)
PROMPTS_DIR = Path(__file__).resolve().parents[2] / "bench" / "prompts"

K0, KDEF, ADAPTIVE, HF_TARGET, HF_ASSISTED = "k0", "kdefault", "adaptive", "hf_target", "hf_assisted"


@dataclass(frozen=True)
class Config:
    """One configuration of the comparison."""

    name: str
    kind: str  # "stack" | "hf"
    k: int | None = None  # stack: None = the server default; with adaptive: the cap
    assisted: bool = False  # hf: assisted generation (d) instead of target-only (c)
    adaptive: bool = False  # stack: adaptive_k (each round picks k in [0, k])

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


def make_configs(
    ks: list[int],
    with_default: bool = True,
    with_hf: bool = True,
    adaptive_cap: int = 0,
) -> list[Config]:
    """The configurations of a run."""
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
    arrivals: list[tuple[float, int]]  # (seconds since the request, tokens in the chunk)
    stats: dict[str, Any] = field(default_factory=dict)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)

    def compact(self) -> dict[str, Any]:
        """The per-run row of the JSON (token ids left out; their identity is reported separately)."""
        return {
            "set": self.set,
            "prompt": self.prompt,
            "config": self.config,
            "repeat": self.repeat,
            "tokens": len(self.tokens),
            "wall_s": round(self.wall_s, 4),
            "ttft_ms": round(self.arrivals[0][0] * 1000, 2) if self.arrivals else None,
            **({"rounds": len(self.rounds)} if self.rounds else {}),
            **(
                {
                    k: self.stats[k]
                    for k in (
                        "draft_ms",
                        "target_ms",
                        "overhead_ms",
                        "accepted_tokens",
                        "draft_tokens",
                    )
                    if k in self.stats
                }
            ),
        }


def env_assignments(text: str) -> dict[str, str]:
    """'NAME=V,NAME=V' (the --compare-env flags of the bench tools) as {NAME: V}."""
    return dict(item.split("=", 1) for item in text.split(",") if item)


def load_prompts(names: list[str], per_set: int, prompts_dir: Path = PROMPTS_DIR) -> list[Prompt]:
    out = []
    for name in names:
        path = prompts_dir / f"{name}.jsonl"
        if not path.is_file():
            raise SystemExit(f"specdec bench: no prompt set {name!r} ({path} missing)")
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        out += [Prompt(name, r["id"], r["user"]) for r in rows[: per_set or None]]
    return out


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
    with_llamacpp: bool = True  # the llama.cpp anchor (skipped with a note when not installed)
    with_adaptive: bool = True
    adaptive_cap: int = 0  # 0: the largest k of the sweep
    verify_context: int = VERIFY_CONTEXT_TOKENS
    verify_reps: int = 7
    quick: bool = False
    dtype: str = "auto"  # of the target (and model draft) in the services and in HF (auto: the
    # services' default, HF in float32)
    engine: str = "auto"  # the model services' runner (auto: llama.cpp for a GGUF on CPU)
    with_llama_server: bool = True  # llama.cpp's own server (skipped with a note when no binary is found)
    llama_server: str = ""  # its binary ("": found by specdec.bench.llama_server.find_binary)
    llama_server_configs: list[str] | None = None  # names of llama_server.SPEC_CONFIGS to run (None: all)
    progress: bool = True
    prompts_dir: str = str(PROMPTS_DIR)
    hop_delay_ms: float = 0.0  # TEST/BENCH ONLY: SPECDEC_HOP_DELAY_MS of the orchestrator
    time_budget_s: float = 0.0  # 0: none; else no prompt is started after this many seconds of measuring
