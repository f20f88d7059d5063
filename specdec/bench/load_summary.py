"""The text summary and the plot of a `specdec bench-load` JSON (the rows of specdec/bench/load_results.py)."""

from __future__ import annotations

from typing import Any

from specdec.bench.load_plan import CONCURRENCY, K0_AA, RATE
from specdec.bench.load_results import set_names


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def summary_lines(record: dict[str, Any]) -> list[str]:
    """A text table per data set: tok/s, TTFT and ITL p50 per configuration and point, ratios to k = 0."""
    lines: list[str] = []
    load = record.get("machine", {})
    lines.append(
        f"load average at start {load.get('load_avg_at_start')}, at end {load.get('load_avg_at_end')}; "
        f"guidellm {record.get('guidellm_version')} used {record.get('guidellm_cpu_s')} s CPU"
    )
    for name, ds in record.get("datasets", {}).items():
        lines.append(
            f"\n[{name}] k = 0 saturation {ds['saturation_rps_k0']:.3f} req/s; rates {ds['rates']}; "
            f"A/A band: tok/s ±{_fmt((ds['noise_band'].get('output_tokens_per_s') or 0) * 100)}%, "
            f"ITL p50 ±{_fmt((ds['noise_band'].get('itl_ms_p50') or 0) * 100)}%"
        )
        lines.append(
            f"{'point':<18}{'config':<17}{'tok/s':>8}{'x k0':>7}{'TTFT p50':>10}{'ITL p50':>9}"
            f"{'x k0':>7}{'ITL p90':>9}{'err':>5}"
        )
        points = sorted(
            {p for rows in ds["configs"].values() for p in rows},
            key=lambda p: (p.split("@")[0], float(p.split("@")[1])),
        )
        for point in points:
            for config, rows in ds["configs"].items():
                r = rows.get(point)
                if r is None:
                    continue
                vs = r.get("vs_k0") or {}
                lines.append(
                    f"{point:<18}{config:<17}{_fmt(r['output_tokens_per_s']):>8}"
                    f"{_fmt(vs.get('output_tokens_per_s'), 2):>7}{_fmt(r['ttft_ms_p50'], 0):>10}"
                    f"{_fmt(r['itl_ms_p50']):>9}{_fmt(vs.get('itl_ms_p50'), 2):>7}"
                    f"{_fmt(r['itl_ms_p90']):>9}{r['errors']:>5}"
                )
        lines += _set_lines(ds, points)
        for config, g in ds.get("compared_to_k0", {}).items():
            if g:
                lines.append(
                    f"{config} vs k0: saturation tok/s x{g['saturation_tokens_ratio']}; latency worse than "
                    f"the A/A band at {len(g['latency_outside_band'])} point-metrics; low-rate ITL p50 gain "
                    f"{g['low_rate_itl_p50_gain']}"
                    + (
                        f" (per prompt set; mixed set: {len(g['mixed_latency_outside_band'])} outside, "
                        f"low-rate gain {g['mixed_low_rate_itl_p50_gain']})"
                        if g.get("read_on") == "by_set"
                        else ""
                    )
                )
    return lines


def _set_lines(ds: dict[str, Any], points: list[str]) -> list[str]:
    """Per prompt set (rows with ``by_set``): TTFT and ITL p50/p90 per configuration and point, x k = 0."""
    names = set_names(ds["configs"])
    if not names:
        return []
    lines = [
        f"per prompt set: {'point':<16}{'set':<10}{'config':<17}{'n':>4}{'TTFT p50':>10}{'x k0':>7}"
        f"{'ITL p50':>9}{'x k0':>7}{'ITL p90':>9}{'x k0':>7}"
    ]
    for point in points:
        for name in names:
            for config, rows in ds["configs"].items():
                part = ((rows.get(point) or {}).get("by_set") or {}).get(name)
                if part is None:
                    continue
                vs = part.get("vs_k0") or {}
                lines.append(
                    f"{'':<16}{point:<16}{name:<10}{config:<17}{part['requests']:>4}"
                    f"{_fmt(part['ttft_ms_p50'], 0):>10}{_fmt(vs.get('ttft_ms_p50'), 2):>7}"
                    f"{_fmt(part['itl_ms_p50']):>9}{_fmt(vs.get('itl_ms_p50'), 2):>7}"
                    f"{_fmt(part['itl_ms_p90']):>9}{_fmt(vs.get('itl_ms_p90'), 2):>7}"
                )
    return lines


def plot(record: dict[str, Any], path: str) -> None:
    """PNG: per data set, streamed tok/s and ITL p50 vs Poisson rate and vs concurrency, and each prompt set's
    ITL p50 vs concurrency, a line per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = record.get("datasets", {})
    tokens = ("streamed_tokens_per_s", "streamed tokens/s")  # with the cut requests' tokens: no whole waves
    panels = [
        (RATE, *tokens),
        (RATE, "itl_ms_p50", "ITL p50 (ms)"),
        (CONCURRENCY, *tokens),
        (CONCURRENCY, "itl_ms_p50", "ITL p50 (ms)"),
    ]
    sets = sorted({name for ds in datasets.values() for name in set_names(ds["configs"])})
    panels += [(CONCURRENCY, f"{name}:itl_ms_p50", f"{name} prompts: ITL p50 (ms)") for name in sets]
    fig, axes = plt.subplots(
        len(datasets), len(panels), figsize=(4.2 * len(panels), 3.6 * len(datasets)), squeeze=False
    )
    for row, (name, ds) in enumerate(datasets.items()):
        for col, (kind, metric, label) in enumerate(panels):
            ax = axes[row][col]
            for config, rows in ds["configs"].items():
                pts = sorted(
                    (r["value"], v)
                    for r in rows.values()
                    if r["kind"] == kind and (v := _plotted(r, metric)) is not None
                )
                if pts:
                    ax.plot(
                        [p[0] for p in pts],
                        [p[1] for p in pts],
                        marker="o",
                        label=config,
                        linestyle="--" if config == K0_AA else "-",
                    )
            ax.set_xlabel("Poisson rate (requests/s)" if kind == RATE else "concurrent streams")
            ax.set_ylabel(label)
            ax.set_title(f"{name}: {label} vs {'rate' if kind == RATE else 'concurrency'}", fontsize=9)
            if kind == CONCURRENCY:
                ax.set_xscale("log", base=2)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    load = record.get("machine", {}).get("load_avg_at_start")
    fig.suptitle(
        f"specdec bench-load ({record.get('settings', {}).get('mode')} mode, guidellm "
        f"{record.get('guidellm_version')}, load avg at start {load})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plotted(row: dict[str, Any], metric: str) -> float | None:
    """A row's metric, or with 'set:metric' that prompt set's (by_set)."""
    if ":" not in metric:
        return row.get(metric)
    name, inner = metric.split(":", 1)
    return ((row.get("by_set") or {}).get(name) or {}).get(inner)
