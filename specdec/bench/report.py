"""Aggregating the bench's runs: the JSON, the table on stdout, the PNG.

JSON layout (``result[SET][MEASURE][CONFIG]``, SET = ``grounded`` | ``open``): every measure that
varies from run to run is ``{"median", "min", "max", "n", "values"}`` over the repeats (each
repeat pooled over the set's prompts); counts that greedy decoding makes identical in every
repeat (acceptance, mean accepted length, ...) are single numbers pooled over all runs.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

K0, KDEF, ADAPTIVE, HF_TARGET, HF_ASSISTED = "k0", "kdefault", "adaptive", "hf_target", "hf_assisted"


# -- small helpers -------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float | None:
    """Percentile with linear interpolation (q in [0, 100]); None for no values."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def spread(values: list[float | None]) -> dict[str, Any] | None:
    """Median with min/max over the repeats."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {
        "median": statistics.median(vals),
        "min": min(vals),
        "max": max(vals),
        "n": len(vals),
        "values": [round(v, 6) for v in vals],
    }


def _itl_samples(arrivals: list[tuple[float, int]]) -> list[float]:
    """Inter-token latency in ms: a chunk of n tokens after a gap g gives n samples of g/n."""
    out = []
    for (t0, _), (t1, n) in zip(arrivals, arrivals[1:]):
        out += [(t1 - t0) * 1000.0 / n] * n
    return out


def _decode_tps(r: Any) -> float | None:
    """Tokens per second after the first token arrived (prefill excluded)."""
    if len(r.arrivals) < 2:
        return None
    first_t, first_n = r.arrivals[0]
    dt = r.wall_s - first_t
    return (len(r.tokens) - first_n) / dt if dt > 0 else None


# -- build ---------------------------------------------------------------------------------------
def build(
    records: list[Any],
    configs: list[Any],
    prompts: list[Any],
    *,
    settings: dict,
    machine: dict,
    hf_settings: dict,
    verify: dict,
    draft_step_cost: float | None,
    identity: dict,
    rss: dict,
    kv_per_token_model: dict,
    default_k: int,
    stats_error: str = "",
) -> dict[str, Any]:
    names = [c.name for c in configs]
    dk = default_k if isinstance(default_k, int) else None  # None: the server picks k (adaptive)
    ks = {c.name: (None if c.adaptive else dk if c.k is None else c.k) for c in configs if c.kind == "stack"}
    measured = {r.set for r in records}  # a run stopped at its time budget may lack a set
    sets = [s for s in dict.fromkeys(p.set for p in prompts) if s in measured]
    c = draft_step_cost if draft_step_cost is not None else 0.0
    ratio = {int(n): v for n, v in verify["ratio"].items()}

    def v(n: int) -> float:
        return ratio.get(n, ratio[max(ratio)] * n / max(ratio))  # beyond the measured range: linear

    result: dict[str, Any] = {"schema": 1, "machine": machine, "settings": settings, "hf_settings": hf_settings}
    for s in sets:
        in_set = [r for r in records if r.set == s]
        out = _set_section(in_set, names, ks, sorted({r.repeat for r in in_set}), c, v)
        out["prompts_measured"] = len({r.prompt for r in in_set})
        out["memory"] = _set_memory(records, s, kv_per_token_model, settings.get("draft_kind", "ngram"))
        out["identity"] = identity.get(s, {})
        result[s] = out
    result["memory"] = _memory_summary(
        [result[s]["memory"] for s in sets], rss, verify, kv_per_token_model, stats_error
    )
    result["verify_cost"] = {k: v for k, v in verify.items() if k != "kv_bytes_per_token_measured"}
    result["draft_step_cost_c"] = draft_step_cost if draft_step_cost is not None else 0.0
    result["draft_step_cost_note"] = (
        "c measured in-process (draft 1-token step / target 1-token step)"
        if draft_step_cost is not None
        else "n-gram draft: c = 0 (no model)"
    )
    result["runs"] = [r.compact() for r in records]
    return result


def _set_section(
    records: list[Any], names: list[str], ks: dict[str, int | None], repeats: list[int], c: float, v: Any
) -> dict[str, Any]:
    """One prompt set's figures per configuration (records: that set's runs)."""
    runs = {(n, rep): [r for r in records if r.config == n and r.repeat == rep] for n in names for rep in repeats}
    tps = {
        key: (sum(len(r.tokens) for r in rs) / sum(r.wall_s for r in rs)) if rs else None for key, rs in runs.items()
    }
    dtps = {key: _ratio_mean([_decode_tps(r) for r in rs]) for key, rs in runs.items()}
    out: dict[str, Any] = {
        m: {}
        for m in (
            "tokens_per_s",
            "speedup",
            "speedup_decode",
            "vs_hf",
            "vs_hf_target",
            "overhead_ms_p50",
            "overhead_share_p50",
            "overhead_e2e_ms_per_round",
            "acceptance_rate",
            "mean_accepted_length",
            "per_position_acceptance",
            "target_passes_per_token",
            "itl_ms_p50",
            "itl_ms_p95",
            "ttft_ms_p50",
            "draft_ms_per_round",
            "verify_ms_per_round",
            "verify_cost_ratio_stack",
            "bound",
            "bound_drafted",
            "speedup_vs_bound",
            "mean_k",
            "wire_bytes_per_round_p50",
            "context_tokens_p50",
            "target_outside_forward_ms_p50",
        )
    }
    for n in names:
        out["tokens_per_s"][n] = spread([tps[(n, rep)] for rep in repeats])
        out["speedup"][n] = spread([_div(tps[(n, rep)], tps.get((K0, rep))) for rep in repeats])
        out["speedup_decode"][n] = spread([_div(dtps[(n, rep)], dtps.get((K0, rep))) for rep in repeats])
        out["vs_hf"][n] = spread([_div(tps[(n, rep)], tps.get((HF_ASSISTED, rep))) for rep in repeats])
        out["vs_hf_target"][n] = spread([_div(tps[(n, rep)], tps.get((HF_TARGET, rep))) for rep in repeats])
        out["itl_ms_p50"][n] = spread(
            [pct(sum((_itl_samples(r.arrivals) for r in runs[(n, rep)]), []), 50) for rep in repeats]
        )
        out["itl_ms_p95"][n] = spread(
            [pct(sum((_itl_samples(r.arrivals) for r in runs[(n, rep)]), []), 95) for rep in repeats]
        )
        out["ttft_ms_p50"][n] = spread(
            [pct([r.arrivals[0][0] * 1000 for r in runs[(n, rep)] if r.arrivals], 50) for rep in repeats]
        )
        if n not in ks:
            continue
        _stack_measures(out, n, ks[n], runs, repeats, c, v)
        vs = out["verify_ms_per_round"].get(n)
        v0 = out["verify_ms_per_round"].get(K0)
        if vs and v0 and v0["p50"]:
            out["verify_cost_ratio_stack"][n] = vs["p50"] / v0["p50"]
        sp = out["speedup_decode"][n]
        if sp and out["bound_drafted"].get(n):
            out["speedup_vs_bound"][n] = sp["median"] / out["bound_drafted"][n]
    return out


def _memory_summary(
    set_memory: list[dict], rss: dict, verify: dict, kv_per_token_model: dict, stats_error: str
) -> dict[str, Any]:
    """The run's memory figures: peak RSS per process, KV bytes per token (the first set that has them)."""
    return {
        "peak_rss_bytes": {role: m["bytes"] for role, m in rss.items()},
        "peak_rss_source": sorted({m["source"] for m in rss.values()}),
        "kv_bytes_per_token": {
            "target": _first([m.get("target_kv_bytes_per_token") for m in set_memory]),
            "draft": _first([m.get("draft_kv_bytes_per_token") for m in set_memory]),
            "target_from_config": kv_per_token_model.get("target"),
            "target_measured_tensors": verify.get("kv_bytes_per_token_measured"),
        },
        "kv_source": _first([m.get("kv_source") for m in set_memory]),
        "stats_rpc_error": stats_error or None,
        "note": "the n-gram draft holds no KV cache; Redis bytes = MEMORY USAGE of the session's two keys",
    }


def _stack_measures(out: dict, n: str, k: int | None, runs: dict, repeats: list[int], c: float, v: Any) -> None:
    all_runs = [r for rep in repeats for r in runs[(n, rep)]]
    rounds = [rd for r in all_runs for rd in r.rounds]
    decode_rounds = [rd for r in all_runs for rd in r.rounds[1:]]  # round 0 carries the prefill
    out["mean_k"][n] = statistics.fmean(rd["k"] for rd in rounds) if rounds else None
    if k is None:  # server-chosen k: its mean
        k = out["mean_k"][n] or 0
    drafted = sum(rd["drafted"] for rd in rounds)
    accepted = sum(rd["accepted"] for rd in rounds)
    out["acceptance_rate"][n] = accepted / drafted if drafted else None
    out["mean_accepted_length"][n] = (accepted + len(rounds)) / len(rounds) if rounds else None
    per_acc: list[int] = []
    per_draft: list[int] = []
    for r in all_runs:
        a, d = r.stats.get("accepted_per_position", []), r.stats.get("drafted_per_position", [])
        for i in range(len(d)):
            if i >= len(per_draft):
                per_acc.append(0)
                per_draft.append(0)
            per_draft[i] += int(d[i])
            per_acc[i] += int(a[i]) if i < len(a) else 0
    out["per_position_acceptance"][n] = [x / y if y else None for x, y in zip(per_acc, per_draft)]
    tokens = sum(len(r.tokens) for r in all_runs)
    out["target_passes_per_token"][n] = len(rounds) / tokens if tokens else None
    out["overhead_ms_p50"][n] = spread(
        [pct([rd["overhead_ms"] for r in runs[(n, rep)] for rd in r.rounds], 50) for rep in repeats]
    )
    out["overhead_share_p50"][n] = spread(
        [
            pct(
                [
                    rd["overhead_ms"] / tot
                    for r in runs[(n, rep)]
                    for rd in r.rounds
                    for tot in [rd["overhead_ms"] + rd["draft_ms"] + rd["target_ms"]]
                    if tot > 0
                ],
                50,
            )
            for rep in repeats
        ]
    )
    out["overhead_e2e_ms_per_round"][n] = spread(
        [
            _div(
                sum(r.wall_s * 1000 - sum(rd["draft_ms"] + rd["target_ms"] for rd in r.rounds) for r in runs[(n, rep)]),
                sum(len(r.rounds) for r in runs[(n, rep)]),
            )
            for rep in repeats
        ]
    )
    # Bytes on the wire per decode round (round 0 carries the prompt) and the context the rounds ran at.
    out["wire_bytes_per_round_p50"][n] = pct([rd["wire_bytes"] for rd in decode_rounds if "wire_bytes" in rd], 50)
    out["context_tokens_p50"][n] = pct([rd["context_tokens"] for rd in rounds if "context_tokens" in rd], 50)
    # The part of the overhead spent inside the target around its forward (the rest: wire, orchestrator, draft).
    out["target_outside_forward_ms_p50"][n] = pct(
        [rd["in_target_ms"] for rd in decode_rounds if rd.get("in_target_ms") is not None], 50
    )
    out["draft_ms_per_round"][n] = _p50_mean([rd["draft_ms"] for rd in decode_rounds])
    out["verify_ms_per_round"][n] = _p50_mean([rd["target_ms"] for rd in decode_rounds])
    # The bound, in units of one target step: tokens per round / cost of a round.
    mal = out["mean_accepted_length"][n]
    if mal is not None:
        out["bound"][n] = mal / (k * c + v(k + 1))
    cost = sum(rd["drafted"] * c + v(rd["drafted"] + 1) for rd in decode_rounds)
    gained = sum(rd["accepted"] + 1 for rd in decode_rounds)
    out["bound_drafted"][n] = gained / cost if cost else None


def _set_memory(records: list[Any], s: str, kv_per_token_model: dict, draft_kind: str) -> dict[str, Any]:
    """KV bytes per session and per token for target and draft, Redis bytes per session (medians over runs).

    From the Stats RPC when the services answer it (cache_used_bytes with only this session cached);
    otherwise computed: KV bytes per token from the model config x the tokens the cache holds after a
    generation (every session token but the last one emitted, which no forward has seen yet).
    """
    mem = [r.memory for r in records if r.set == s and r.memory]
    if not mem:
        return {}

    def med(values: list[Any]) -> float | None:
        vals = [v for v in values if v is not None]
        return statistics.median(vals) if vals else None

    from_rpc = all("target_kv_bytes" in m for m in mem)
    out: dict[str, Any] = {
        "session_tokens": med([m.get("session_tokens") for m in mem]),
        "redis_bytes_per_session": med([m.get("redis_bytes") for m in mem]),
    }
    if from_rpc:
        out["kv_source"] = "Stats RPC (cache_used_bytes, one session cached)"
        out["target_kv_bytes_per_session"] = med([m["target_kv_bytes"] for m in mem])
        out["draft_kv_bytes_per_session"] = med([m.get("draft_kv_bytes") for m in mem])
        out["max_cached_sessions_seen"] = max(m.get("target_cached_sessions", 0) for m in mem)
        tok = [m for m in mem if m.get("session_tokens")]
        out["target_kv_bytes_per_token"] = med([m["target_kv_bytes"] / m["session_tokens"] for m in tok])
        out["draft_kv_bytes_per_token"] = med([m.get("draft_kv_bytes", 0) / m["session_tokens"] for m in tok])
    else:
        per = kv_per_token_model.get("target")
        draft_per = kv_per_token_model.get("draft", 0 if draft_kind == "ngram" else None)
        out["kv_source"] = "computed: KV bytes per token from the model config x cached tokens (Stats RPC unavailable)"
        cached = [m["session_tokens"] - 1 for m in mem if m.get("session_tokens")]
        out["target_kv_bytes_per_session"] = med([per * c for c in cached]) if per else None
        out["draft_kv_bytes_per_session"] = med([draft_per * c for c in cached]) if draft_per is not None else None
        out["target_kv_bytes_per_token"] = per
        out["draft_kv_bytes_per_token"] = draft_per
    tok = [m for m in mem if m.get("session_tokens") and m.get("redis_bytes") is not None]
    out["redis_bytes_per_token"] = med([m["redis_bytes"] / m["session_tokens"] for m in tok])
    return out


def _p50_mean(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    p50 = pct(values, 50)
    assert p50 is not None, "values are not empty"
    return {"p50": p50, "mean": statistics.fmean(values), "rounds": len(values)}


def _ratio_mean(values: list[float | None]) -> float | None:
    vals = [x for x in values if x is not None]
    return statistics.fmean(vals) if vals else None


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _first(values: list[Any]) -> Any:
    return next((x for x in values if x is not None), None)


# -- table ---------------------------------------------------------------------------------------
def _fmt(x: Any, digits: int = 2, spread_: bool = False) -> str:
    if x is None:
        return "-"
    if isinstance(x, dict):
        med = x.get("median", x.get("p50"))
        if med is None:
            return "-"
        if spread_ and x.get("n", 1) > 1:
            return f"{med:.{digits}f} [{x['min']:.{digits}f}-{x['max']:.{digits}f}]"
        return f"{med:.{digits}f}"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def cpu_features(machine: dict[str, Any]) -> str:
    """ " (AVX-512, no AMX, bf16)": the CPU features that decide kernels, where the result has them."""
    if "avx512" not in machine:
        return ""
    yes_no = [("AVX-512", machine["avx512"]), ("AMX", machine.get("amx")), ("bf16", machine.get("bf16"))]
    return " (" + ", ".join(name if has else f"no {name}" for name, has in yes_no) + ")"


def _mb(x: Any) -> str:
    return "-" if x is None else f"{x / 2**20:.1f} MiB"


def _kb(x: Any) -> str:
    return "-" if x is None else f"{x / 1024:.1f} KiB"
