"""bench-load's overlapped configurations judged against their sequential twins (docs/overlap.md).

Issue #19 asks that under load overlapped rounds never cost throughput: at every point an overlapped
configuration (`overlap_adaptive`, `overlap_k4`) streams at least GOAL_OVERLAP_RATIO of the tokens per
second its sequential twin (`adaptive`, `k4`) streamed at the same point of the same run. Pure functions
over the rows of specdec/bench/load_results.py (config -> point -> row); unit-tested on hand-built rows.
"""

from __future__ import annotations

from typing import Any

from specdec.bench.plan import OVERLAP_PREFIX

#: Issue #19: "under load it must never cost throughput: >= 0.97x sequential in the load bench".
GOAL_OVERLAP_RATIO = 0.97
#: The throughput the goal is judged on (with the cut requests' tokens: no whole waves, as the saturation goal).
TOKENS = "streamed_tokens_per_s"
#: Ratios to the twin stored per row (`vs_sequential`; tokens: higher is better, the times: lower).
TWIN_METRICS = (TOKENS, "output_tokens_per_s", "ttft_ms_p50", "itl_ms_p50", "itl_ms_p90", "latency_s_p50")
RATIO_DIGITS = 4


def twins(names: list[str]) -> dict[str, str]:
    """Overlapped configuration -> its sequential twin (`overlap_k4` -> `k4`), for the twins among `names`."""
    prefix = f"{OVERLAP_PREFIX}_"
    return {n: n.removeprefix(prefix) for n in names if n.startswith(prefix) and n.removeprefix(prefix) in names}


def add_twin_ratios(results: dict[str, dict[str, dict[str, Any]]], pairs: dict[str, str]) -> None:
    """Each overlapped row gets `vs_sequential`: {metric: this ÷ the twin's at the same point} (in place)."""
    for name, twin in pairs.items():
        for point, row in (results.get(name) or {}).items():
            ref = (results.get(twin) or {}).get(point)
            if ref is None:
                continue
            row["vs_sequential"] = {m: round(row[m] / ref[m], RATIO_DIGITS)
                                    if row.get(m) is not None and ref.get(m) else None for m in TWIN_METRICS}


def overlap_goal(results: dict[str, dict[str, dict[str, Any]]], name: str, twin: str,
                 band: dict[str, float | None]) -> dict[str, Any]:
    """The goal for one overlapped configuration: the points where it streamed below GOAL_OVERLAP_RATIO of its
    twin's tokens/s, each marked whether the A/A band (k0_aa against k0 in the same run) covers the shortfall."""
    noise = band.get(TOKENS) or 0.0
    ratios = {point: (row.get("vs_sequential") or {}).get(TOKENS) for point, row in (results.get(name) or {}).items()}
    ratios = {p: r for p, r in ratios.items() if r is not None}
    below = [{"point": p, "ratio": r, "within_noise": 1 - r <= noise}
             for p, r in sorted(ratios.items()) if r < GOAL_OVERLAP_RATIO]
    return {"twin": twin, "goal_ratio": GOAL_OVERLAP_RATIO, "points": len(ratios),
            "min_tokens_ratio": min(ratios.values()) if ratios else None,
            "points_below": below, "ok": bool(ratios) and not below,
            "ok_within_noise": bool(ratios) and all(b["within_noise"] for b in below)}


def overlap_goals(results: dict[str, dict[str, dict[str, Any]]], pairs: dict[str, str],
                  band: dict[str, float | None]) -> dict[str, dict[str, Any]]:
    """`add_twin_ratios`, then `overlap_goal` for every overlapped configuration."""
    add_twin_ratios(results, pairs)
    return {name: overlap_goal(results, name, twin, band) for name, twin in pairs.items()}


def overlap_lines(goals: dict[str, dict[str, Any]]) -> list[str]:
    """The summary's lines for the overlapped configurations' goals (`overlap_goals`)."""
    return [f"overlap {name} vs {g['twin']}: lowest streamed tok/s x{g['min_tokens_ratio']} over {g['points']} points "
            f"(goal >= {g['goal_ratio']}): ok={g['ok']}, within the A/A band={g['ok_within_noise']}"
            + "".join(f"; {b['point']} x{b['ratio']}" for b in g["points_below"])
            for name, g in goals.items()]
