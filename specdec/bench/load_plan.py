"""What `specdec bench-load` runs: configurations, points, the fixed rate list, guidellm scenarios, data files.

Pure functions and dataclasses only (no servers, no subprocesses): the unit tests cover them.

A *configuration* is what the `specdec` extension object of every request asks for (k = 0, a fixed k,
adaptive k); a *point* is one load level: a concurrency (closed loop, c streams) or a Poisson request
rate (open loop). Every configuration runs at the same points. The rates are one list for every
configuration, derived from k = 0's saturation throughput (its requests/s at the highest concurrency),
so the curves of different configurations share their x values (guidellm's own `sweep` profile would
pick different rates per configuration).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from specdec.bench.plan import PROMPTS_DIR, load_prompts

#: guidellm is pinned: its scenario schema and JSON report change between minor versions.
GUIDELLM_VERSION = "0.8.1"
K0, K0_AA = "k0", "k0_aa"
DATA_PROMPTS, DATA_GROUNDED, DATA_SYNTHETIC, DATA_MULTITURN = "prompts", "grounded", "synthetic", "multiturn"
DATASETS = (DATA_PROMPTS, DATA_GROUNDED, DATA_SYNTHETIC, DATA_MULTITURN)
#: multiturn: synthetic conversations of this many user turns, each resending the history (as OpenAI clients do),
#: every conversation opening with the same system prefix of MULTITURN_PREFIX_TOKENS, each turn adding
#: MULTITURN_PROMPT_TOKENS of user text: what a chat application sends (prefix sharing serves the history).
MULTITURN_TURNS = 4
MULTITURN_PREFIX_TOKENS = 256
MULTITURN_PROMPT_TOKENS = 128
SEED_SPREAD = 1_000_000  # per-invocation seeds of multiturn (invocation_seed) lie in [seed, seed + this)
CHAT_SETS = {DATA_PROMPTS: ("grounded", "open"), DATA_GROUNDED: ("grounded",)}  # bench prompt sets per data set
CONCURRENCY, RATE = "concurrency", "rate"
#: significant digits of a derived rate (requests/s): the same list is written to every scenario.
RATE_DIGITS = 3
#: p99 is only reported from at least this many requests per point (below it p99 is the maximum).
P99_MIN_REQUESTS = 100
REQUEST_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class LoadConfig:
    """One configuration: the `specdec` extension object its requests carry."""

    name: str
    k: int
    adaptive: bool = False

    def extension(self) -> dict[str, Any]:
        """The request's `specdec` object (docs/http.md): k, adaptive_k, ignore_eos (equal work)."""
        ext: dict[str, Any] = {"k": self.k, "ignore_eos": True}
        if self.adaptive:
            ext["adaptive_k"] = True
        return ext


@dataclass(frozen=True)
class Mode:
    """The size of a run: points, requests per point, tokens per request."""

    concurrency: tuple[int, ...]
    rate_fractions: tuple[float, ...]
    requests_per_point: int
    max_tokens: int
    fixed_ks: tuple[int, ...]
    datasets: tuple[str, ...]
    synthetic_prompt_tokens: int = 256


#: Default: concurrency 1, 4, 16 and 5 Poisson rates (fractions of k = 0's saturation), 50 requests each.
DEFAULT_MODE = Mode(
    concurrency=(1, 4, 16),
    rate_fractions=(0.2, 0.4, 0.6, 0.8, 1.0),
    requests_per_point=50,
    max_tokens=64,
    fixed_ks=(4,),
    datasets=(DATA_PROMPTS,),
)
#: --full: more points, k 2/4/8, 100 requests (p99 reported), both data sets.
FULL_MODE = Mode(
    concurrency=(1, 2, 4, 8, 16, 32),
    rate_fractions=(0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 1.0, 1.15),
    requests_per_point=100,
    max_tokens=64,
    fixed_ks=(2, 4, 8),
    datasets=DATASETS,
)
#: --quick: the whole pipeline in a few minutes (tests/integration/test_bench_load_stack.py).
QUICK_MODE = Mode(
    concurrency=(1, 2),
    rate_fractions=(0.5, 1.0),
    requests_per_point=3,
    max_tokens=12,
    fixed_ks=(4,),
    datasets=(DATA_PROMPTS,),
    synthetic_prompt_tokens=64,
)


def configurations(fixed_ks: tuple[int, ...], adaptive_cap: int) -> list[LoadConfig]:
    """k = 0 first, the fixed ks, adaptive, and k = 0 again last (the A/A repeat that sets the noise band)."""
    configs = [LoadConfig(K0, 0)]
    for k in (k for k in fixed_ks if k > 0):
        configs.append(LoadConfig(f"k{k}", k))
    if adaptive_cap > 0:
        configs.append(LoadConfig("adaptive", adaptive_cap, adaptive=True))
    configs.append(LoadConfig(K0_AA, 0))
    return configs


def round_sig(x: float, digits: int = RATE_DIGITS) -> float:
    """x rounded to `digits` significant digits (0 stays 0)."""
    return float(f"{x:.{digits}g}") if x else 0.0


def rate_list(saturation_rps: float, fractions: tuple[float, ...]) -> list[float]:
    """The Poisson rates (requests/s) every configuration runs: fractions of k = 0's saturation throughput.

    Sorted, rounded to RATE_DIGITS significant digits, without duplicates; a saturation of 0 (k = 0
    completed nothing) is an error, since no meaningful rate follows from it.
    """
    if saturation_rps <= 0:
        raise ValueError(f"k = 0 saturation throughput must be > 0 requests/s to derive rates (got {saturation_rps})")
    if not fractions or min(fractions) <= 0:
        raise ValueError(f"rate fractions must be > 0 (got {fractions})")
    return sorted({round_sig(saturation_rps * f) for f in fractions})


@dataclass
class ScenarioInputs:
    """Everything a guidellm scenario of one configuration and one phase needs."""

    target_url: str
    processor_dir: str
    data_file: str  # a chat JSONL (prompts) or "" for synthetic data
    out_json: str
    requests_per_point: int
    max_tokens: int
    synthetic_prompt_tokens: int = 256
    max_seconds_per_point: float = 0.0  # 0: no time cap (every point runs its requests)
    seed: int = 42
    turns: int = 1  # synthetic data: user turns per conversation (history resent)
    prefix_tokens: int = 0  # synthetic data: a prefix every conversation shares (0: none)
    extra: dict[str, Any] = field(default_factory=dict)


def _data_spec(inp: ScenarioInputs) -> dict[str, Any]:
    if inp.data_file:
        return {"kind": "json_file", "path": inp.data_file}
    spec = {"kind": "synthetic_text", "prompt_tokens": inp.synthetic_prompt_tokens, "output_tokens": inp.max_tokens}
    if inp.turns > 1:
        spec["turns"] = inp.turns
    if inp.prefix_tokens > 0:
        spec["prefix_tokens"] = inp.prefix_tokens
    return spec


def invocation_seed(base: int, dataset: str, tag: str) -> int:
    """guidellm's data seed for one invocation (`tag`: data set, phase, point, configuration). The same for
    every data set but multiturn (every configuration gets the same requests); multiturn gets conversations
    of its own per invocation: met twice, a conversation is served from the cache the second time (prefix
    sharing), which no two users' conversations would be."""
    return base + zlib.crc32(tag.encode()) % SEED_SPREAD if dataset == DATA_MULTITURN else base


class DataInputs(TypedDict, total=False):
    """The ScenarioInputs fields a data set sets (data_inputs)."""

    synthetic_prompt_tokens: int
    turns: int
    prefix_tokens: int


def data_inputs(dataset: str, synthetic_prompt_tokens: int) -> DataInputs:
    """The ScenarioInputs fields a data set sets: the synthetic sizes (multiturn: its own, above)."""
    if dataset == DATA_MULTITURN:
        return {
            "synthetic_prompt_tokens": MULTITURN_PROMPT_TOKENS,
            "turns": MULTITURN_TURNS,
            "prefix_tokens": MULTITURN_PREFIX_TOKENS,
        }
    return {"synthetic_prompt_tokens": synthetic_prompt_tokens}


def scenario(config: LoadConfig, phase: str, values: list[float] | list[int], inp: ScenarioInputs) -> dict[str, Any]:
    """A guidellm 0.8 scenario (`guidellm run --scenario FILE`): one benchmark per value of the phase.

    phase CONCURRENCY: closed loop, `values` streams; RATE: Poisson arrivals at `values` requests/s.
    Requests are greedy (temperature 0) with `max_tokens` and ignore_eos, so every request of every
    configuration generates the same number of tokens.
    """
    if phase == CONCURRENCY:
        profile: dict[str, Any] = {"kind": "concurrent", "streams": [int(v) for v in values]}
    elif phase == RATE:
        profile = {"kind": "poisson", "rate": [float(v) for v in values]}
    else:
        raise ValueError(f"unknown phase {phase!r} (known: {CONCURRENCY}, {RATE})")
    constraints: list[dict[str, Any]] = [{"kind": "max_requests", "count": inp.requests_per_point}]
    if inp.max_seconds_per_point > 0:
        constraints.append({"kind": "max_duration", "seconds": inp.max_seconds_per_point})
    body = {"temperature": 0.0, "specdec": config.extension()}
    return {
        "spec": {
            "backend": {
                "kind": "openai_http",
                "target": inp.target_url,
                "model": "specdec",
                "request_format": "/v1/chat/completions",
                "max_tokens": inp.max_tokens,
                "timeout": REQUEST_TIMEOUT_S,
                "http2": False,
                "extras": {"body": body},
            },
            "profile": profile,
            "tokenizer": {"kind": "huggingface_auto", "model": inp.processor_dir},
            "data": [_data_spec(inp)],
            "constraints": constraints,
            "seed": {"kind": "static", "value": inp.seed},
            "outputs": [{"kind": "json", "path": inp.out_json}],
            **inp.extra,
        }
    }


def chat_rows(
    prompts_dir: str | Path = PROMPTS_DIR, sets: tuple[str, ...] = CHAT_SETS[DATA_PROMPTS]
) -> list[dict[str, Any]]:
    """The bench's prompts of `sets` (default grounded and open), alternating (g1, o1, g2, o2, ...), as
    chat messages."""
    per_set = [load_prompts([name], 0, Path(prompts_dir)) for name in sets]
    rows: list[dict[str, Any]] = []
    for i in range(max(len(prompts) for prompts in per_set)):
        for prompts in per_set:
            rows += [{"messages": [{"role": "user", "content": p.user}]} for p in prompts[i : i + 1]]
    return rows


def sets_by_content(sets: tuple[str, ...], prompts_dir: str | Path = PROMPTS_DIR) -> dict[str, str]:
    """Every bench prompt of `sets` as its chat message's content -> its set's name (splits a report by set)."""
    return {p.user: name for name in sets for p in load_prompts([name], 0, Path(prompts_dir))}


def cycle_rows(rows: list[dict[str, Any]], min_rows: int) -> list[dict[str, Any]]:
    """`rows` repeated in order until there are at least `min_rows` (and whole passes only).

    guidellm ends a benchmark when its data runs out (its `requests_exhausted` constraint), so a
    point of N requests needs a file of at least N rows; the bench's 20 prompts are cycled.
    """
    if not rows:
        raise ValueError("no rows to cycle")
    passes = max(1, -(-min_rows // len(rows)))
    return rows * passes


def write_jsonl(path: str | Path, rows: list[dict[str, Any]]) -> int:
    """Write rows as JSONL for guidellm's json_file data; return the row count."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return len(rows)


def write_chat_jsonl(
    path: str | Path,
    prompts_dir: str | Path = PROMPTS_DIR,
    min_rows: int = 0,
    sets: tuple[str, ...] = CHAT_SETS[DATA_PROMPTS],
) -> int:
    """Write chat_rows() of `sets`, cycled to at least `min_rows` rows, as JSONL; return the row count."""
    return write_jsonl(path, cycle_rows(chat_rows(prompts_dir, sets), min_rows))
