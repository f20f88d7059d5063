"""The bench's table: one line per configuration and prompt set, with the anchors, the bound and memory."""

from __future__ import annotations

from typing import Any

from specdec.bench.report import K0, _fmt, _kb, _mb, cpu_features


def table(result: dict[str, Any]) -> str:
    """The human-readable summary printed at the end of a run."""
    lines = []
    st, m = result["settings"], result["machine"]
    gpu = f" | GPU {m['gpu']['name']}" if m.get("gpu") else ""
    lines.append(
        f"machine: {m['cpu_model']}{cpu_features(m)} | {m['cores']} cores ({m['usable_cores']} usable){gpu} "
        f"| torch {m['torch']} | transformers {m['transformers']}"
    )
    gens = st.get("generations") or {}
    if gens and gens["measured"] < gens["planned"]:
        lines.append(
            f"stopped at the time budget ({st.get('time_budget_s')} s): {gens['measured']} of "
            f"{gens['planned']} generations, every configuration on each prompt measured"
        )
    load = m.get("load_avg_at_start")
    if load and load[0] > 0.5 * (m.get("usable_cores") or 1):
        lines.append(
            f"WARNING: the machine was busy (1-minute load average {load[0]:.1f} at the start on "
            f"{m.get('usable_cores')} cores): timings are not representative"
        )
    lines.append(
        f"target {st['target_model_id']} ({st.get('engine', 'torch')}, {st['dtype']}), draft {st['draft_kind']}, threads "
        f"{st['threads']['target_service']}, {st['max_new_tokens']} new tokens, {st['repeats']} repeat(s), "
        f"greedy, ignore_eos; HF assisted: {result['hf_settings']}"
    )
    cols = [
        ("config", 26),
        ("mean k", 6),
        ("tok/s", 20),
        ("speedup", 18),
        ("vs HF(d)", 9),
        ("accept", 7),
        ("MAL", 5),
        ("pass/tok", 8),
        ("ITL p50/p95 ms", 14),
        ("draft ms", 8),
        ("verify ms", 9),
        ("ovh p50 ms", 10),
        ("ovh %", 6),
        ("wire B/rd", 9),
        ("ctx", 5),
        ("bound", 6),
        ("/bound", 6),
        ("same", 5),
    ]
    for s in (k for k in result if isinstance(result[k], dict) and "tokens_per_s" in result[k]):
        r = result[s]
        lines.append("")
        lines.append(f"== {s} ({r.get('prompts_measured', len(st['prompts'].get(s, [])))} prompts) ==")
        lines.append("  ".join(name.ljust(w) for name, w in cols))
        for n, label in st["configs"].items():
            ident = r["identity"].get(n)
            same = "ref" if n == K0 else (f"{ident['identical']}/{ident['prompts']}" if ident else "-")
            itl = f"{_fmt(r['itl_ms_p50'].get(n), 1)}/{_fmt(r['itl_ms_p95'].get(n), 1)}"
            share = r["overhead_share_p50"].get(n)
            row = [
                label,
                _fmt(r["mean_k"].get(n), 1),
                _fmt(r["tokens_per_s"][n], 1, True),
                _fmt(r["speedup"][n], 2, True),
                _fmt(r["vs_hf"].get(n)),
                _fmt(r["acceptance_rate"].get(n)),
                _fmt(r["mean_accepted_length"].get(n)),
                _fmt(r["target_passes_per_token"].get(n)),
                itl,
                _fmt(r["draft_ms_per_round"].get(n), 1),
                _fmt(r["verify_ms_per_round"].get(n), 1),
                _fmt(r["overhead_ms_p50"].get(n), 2),
                f"{share['median'] * 100:.1f}" if share else "-",
                _fmt(r["wire_bytes_per_round_p50"].get(n), 0),
                _fmt(r["context_tokens_p50"].get(n), 0),
                _fmt(r["bound_drafted"].get(n)),
                _fmt(r["speedup_vs_bound"].get(n)),
                same,
            ]
            lines.append("  ".join(str(x).ljust(w) for x, (_, w) in zip(row, cols)))
        mem = r.get("memory") or {}
        if mem:
            lines.append(
                f"  per session: target KV {_mb(mem.get('target_kv_bytes_per_session'))}, draft KV "
                f"{_mb(mem.get('draft_kv_bytes_per_session'))}, Redis {_kb(mem.get('redis_bytes_per_session'))} "
                f"({_fmt(mem.get('session_tokens'), 0)} tokens)"
            )
        diffs = [(n, d) for n, i in r["identity"].items() for d in i["differences"]]
        for n, d in diffs:
            tie = f", near-tie (<= {d.get('tie_threshold', 0):.4g})" if d["near_tie"] else ""
            lines.append(
                f"  token difference: {n} on {d['prompt']} at position {d['position']} "
                f"(top-2 logit gap {_fmt(d['top2_logit_gap'], 6)}{tie})"
            )
    from specdec.bench.llama_server import server_lines
    from specdec.bench.llamacpp import anchor_lines

    lines += anchor_lines(result)
    lines += server_lines(result)
    mem = result["memory"]
    lines.append("")
    lines.append(
        "peak RSS: "
        + ", ".join(f"{k} {_mb(v)}" for k, v in mem["peak_rss_bytes"].items())
        + f" ({'/'.join(mem['peak_rss_source'])})"
    )
    kv = mem["kv_bytes_per_token"]
    lines.append(
        f"KV bytes per cached token: target {_fmt(kv['target'], 0)} (config {kv['target_from_config']}, "
        f"tensors {_fmt(kv['target_measured_tensors'], 0)}), draft {_fmt(kv['draft'], 0)}"
    )
    vc = result["verify_cost"]
    lines.append(
        f"verify cost v(n)/v(1) on the target in-process ({vc['context_tokens']} cached tokens, "
        f"{vc['threads']} threads, v(1) = {vc['ms']['1']:.1f} ms): "
        + " ".join(f"{n}:{x:.2f}" for n, x in vc["ratio"].items())
        + f"; c = {result['draft_step_cost_c']:.3f}"
    )
    lines.append(
        "columns: speedup = tok/s over ours k=0 (median [min-max] over repeats); vs HF(d) = over HF "
        "assisted; MAL = mean accepted length (tokens per round); draft/verify ms = p50 per round; ovh = "
        "per-round overhead (not a model forward); bound = MAL/(k*c + v(k+1)) with the k actually drafted; "
        "/bound = decode-only speedup / bound; same = token-identical to ours k=0; mean k = k asked per round (adaptive: chosen)"
    )
    return "\n".join(lines)
