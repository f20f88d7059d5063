"""bench-load's overlapped configurations against their sequential twins (docs/overlap.md).

At every point an overlapped configuration (`overlap_adaptive`, `overlap_k4`) is compared with its sequential
twin (`adaptive`, `k4`) at the same point of the same run: the ratio of streamed tokens per second, and the
points where it streamed fewer, each marked whether the A/A band covers the difference. Pure functions over
the rows of specdec/bench/load_results.py (config -> point -> row); unit-tested on hand-built rows.
"""

from __future__ import annotations

from typing import Any

from specdec.bench.plan import OVERLAP_PREFIX

#: The throughput compared (with the cut requests' tokens: no whole waves, as the saturation ratio).
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
            row["vs_sequential"] = {
                m: round(row[m] / ref[m], RATIO_DIGITS) if row.get(m) is not None and ref.get(m) else None
                for m in TWIN_METRICS
            }


def overlap_comparison(
    results: dict[str, dict[str, dict[str, Any]]], name: str, twin: str, band: dict[str, float | None]
) -> dict[str, Any]:
    """One overlapped configuration against its twin: the lowest tokens/s ratio and the points where it streamed
    fewer tokens/s than the twin, each marked whether the A/A band (k0_aa against k0 in the same run) covers it."""
    noise = band.get(TOKENS) or 0.0
    measured = {point: (row.get("vs_sequential") or {}).get(TOKENS) for point, row in (results.get(name) or {}).items()}
    ratios: dict[str, float] = {p: r for p, r in measured.items() if r is not None}
    slower = [{"point": p, "ratio": r, "within_noise": 1 - r <= noise} for p, r in sorted(ratios.items()) if r < 1]
    return {
        "twin": twin,
        "points": len(ratios),
        "min_tokens_ratio": min(ratios.values()) if ratios else None,
        "points_slower": slower,
    }


def overlap_comparisons(
    results: dict[str, dict[str, dict[str, Any]]], pairs: dict[str, str], band: dict[str, float | None]
) -> dict[str, dict[str, Any]]:
    """`add_twin_ratios`, then `overlap_comparison` for every overlapped configuration."""
    add_twin_ratios(results, pairs)
    return {name: overlap_comparison(results, name, twin, band) for name, twin in pairs.items()}


def overlap_lines(comparisons: dict[str, dict[str, Any]]) -> list[str]:
    """The summary's lines for the overlapped configurations (`overlap_comparisons`)."""
    return [
        f"overlap {name} vs {c['twin']}: lowest streamed tok/s x{c['min_tokens_ratio']} over {c['points']} points"
        + "".join(
            f"; {b['point']} x{b['ratio']}{' (within the A/A band)' if b['within_noise'] else ''}"
            for b in c.get("points_slower", [])
        )
        for name, c in comparisons.items()
    ]
