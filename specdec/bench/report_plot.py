"""The bench's figure: speed-up vs k per prompt set against the bound and HF assisted, and v(n)/v(1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specdec.bench.report import ADAPTIVE, HF_ASSISTED, HF_TARGET, KDEF, cpu_features


def plot(result: dict[str, Any], path: Path) -> None:
    """Speed-up vs k per prompt set, against the bound and HF assisted; plus v(n)/v(1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = [k for k in result if isinstance(result[k], dict) and "speedup" in result[k]]
    st = result["settings"]
    fig, axes = plt.subplots(1, len(sets) + 1, figsize=(5.2 * (len(sets) + 1), 4.4))
    axes = list(axes) if hasattr(axes, "__len__") else [axes]
    for ax, s in zip(axes, sets):
        r = result[s]
        pts = sorted(
            (int(n[1:]), n)
            for n in r["speedup"]
            if n.startswith("k") and n[1:].isdigit() and r["speedup"][n] is not None
        )
        xs = [k for k, _ in pts]
        meds = [_get(r["speedup"][n], "median") for _, n in pts]
        lo = [m - _get(r["speedup"][n], "min", m) for (_, n), m in zip(pts, meds) if m is not None]
        hi = [_get(r["speedup"][n], "max", m) - m for (_, n), m in zip(pts, meds) if m is not None]
        ax.errorbar(xs, meds, yerr=[lo, hi], marker="o", capsize=3, label="ours, measured (min-max)")
        dec = [_get(r["speedup_decode"].get(n), "median") for _, n in pts]
        ax.plot(xs, dec, marker=".", linestyle=":", label="ours, decode only (prefill excluded)")
        bk = [(k, r["bound"].get(n)) for k, n in pts if r["bound"].get(n) is not None]
        if bk:
            ax.plot([k for k, _ in bk], [b for _, b in bk], linestyle="--", marker="x", label="bound: MAL/(k·c+v(k+1))")
        bd = [(k, r["bound_drafted"].get(n)) for k, n in pts if r["bound_drafted"].get(n) is not None]
        if bd:
            ax.plot(
                [k for k, _ in bd],
                [b for _, b in bd],
                linestyle="-.",
                marker="+",
                label="bound with the k actually drafted",
            )
        if r["speedup"].get(KDEF):
            x = st["server_default_k"] if isinstance(st["server_default_k"], int) else (r["mean_k"].get(KDEF) or 0)
            ax.plot(
                [x],
                [r["speedup"][KDEF]["median"]],
                marker="*",
                markersize=12,
                linestyle="none",
                label="ours, k unset (server default)",
            )
        if r["speedup"].get(ADAPTIVE):
            ax.plot(
                [r["mean_k"].get(ADAPTIVE) or 0],
                [r["speedup"][ADAPTIVE]["median"]],
                marker="D",
                markersize=8,
                linestyle="none",
                label=f"{st['configs'][ADAPTIVE]} (at its mean k)",
            )
        for name, style in ((HF_ASSISTED, "tab:red"), (HF_TARGET, "tab:gray")):
            if r["speedup"].get(name):
                ax.axhline(
                    r["speedup"][name]["median"],
                    color=style,
                    linestyle=":",
                    label=f"{st['configs'][name]} ({r['speedup'][name]['median']:.2f}x)",
                )
        ax.axhline(1.0, color="black", linewidth=0.6)
        ax.set_title(f"{s}: speed-up over ours k=0")
        ax.set_xlabel("k (draft tokens per round)")
        ax.set_ylabel("speed-up (tokens/s ÷ ours k=0)")
        ax.set_xticks(xs)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[-1]
    vc = result["verify_cost"]
    ns = sorted(int(n) for n in vc["ratio"])
    ax.plot(ns, [vc["ratio"][str(n)] for n in ns], marker="o", label="measured v(n)/v(1)")
    ax.plot(ns, ns, linestyle=":", color="gray", label="n (no batching benefit)")
    ax.axhline(1.0, color="black", linewidth=0.6, label="1 (verify = one step)")
    ax.set_title(f"target verify cost, {vc['context_tokens']} cached tokens, v(1)={vc['ms']['1']:.0f} ms")
    ax.set_xlabel("n = tokens scored in one forward (k+1)")
    ax.set_xticks(ns)
    ax.set_ylabel("v(n) / v(1)")
    ax.set_ylim(0, max(4.0, max(vc["ratio"].values()) * 1.1))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    m = result["machine"]
    fig.suptitle(
        f"specdec bench — {st['target_model_id']} ({st['dtype']}), {st['draft_kind']} draft, "
        f"{st['threads']['target_service']} threads, {m['cpu_model']}{cpu_features(m)} ({m['cores']} cores), "
        f"{st['max_new_tokens']} tokens, {st['repeats']} repeat(s)",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _get(d: Any, key: str, default: Any = None) -> Any:
    return d.get(key, default) if isinstance(d, dict) else default
