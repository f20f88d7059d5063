"""The overlapped configurations of a `specdec bench` run (overlap_k4, overlap_adaptive; docs/overlap.md)
against k = 0, against sequential rounds and against the bound for overlap, all from the same run.

  * sequential = the better (median tokens/s) of the best fixed k and adaptive k of the run;
  * bound (all draft hidden) = the sequential configuration's tokens / (its wall time - the draft's share
    of it: the draft forwards plus one call's overhead per round with a draft, the k = 0 rounds' median
    overhead): what overlap would reach if every round's draft were hidden behind the previous verify;
  * bound (post-verify) = the same with only the rounds a post-verify pre-draft can serve hidden: a block
    drafted ahead is used after a round that accepted all its drafts and whose bonus was the draft's guess
    (estimated by the run's acceptance at position 1). At low acceptance this bound is near 1x.
"""

from __future__ import annotations

from typing import Any

from specdec.bench.plan import ADAPTIVE, K0, OVERLAP_PREFIX, without_branches


def _median(spread: dict | None) -> float | None:
    return spread["median"] if spread else None


def _sequential_best(out: dict, names: list[str]) -> str | None:
    """The sequential configuration with the most median tokens/s: fixed k > 0 or adaptive."""
    cands = [n for n in names if not n.startswith(OVERLAP_PREFIX) and (n == ADAPTIVE or (n[1:].isdigit() and n != K0))]
    scored = [(n, v) for n in cands if (v := _median(out["tokens_per_s"].get(n))) is not None]
    return max(scored, key=lambda x: x[1])[0] if scored else None


def _bounds(runs: list[Any], call_overhead_ms: float, first_acceptance: float) -> dict[str, float] | None:
    """Tokens/s with all draft time hidden, and with only the post-verify hits hidden (module docstring)."""
    tokens = sum(len(r.tokens) for r in runs)
    wall_ms = sum(r.wall_s for r in runs) * 1000.0
    rounds = [rd for r in runs for rd in r.rounds]
    drafted = [rd for rd in rounds if rd["drafted"]]
    if not tokens or not wall_ms or not drafted:
        return None
    hideable_ms = sum(rd["draft_ms"] for rd in drafted) + call_overhead_ms * len(drafted)
    all_accepted = sum(rd["accepted"] == rd["drafted"] for rd in drafted) / len(rounds)
    hit = all_accepted * first_acceptance
    return {
        "sequential_tokens_per_s": tokens / wall_ms * 1000.0,
        "all_hidden_tokens_per_s": tokens / max(wall_ms - hideable_ms, 1e-9) * 1000.0,
        "post_verify_tokens_per_s": tokens / max(wall_ms - hit * hideable_ms, 1e-9) * 1000.0,
        "post_verify_hit_rate": hit,
        "hideable_ms_per_round": hideable_ms / len(rounds),
    }


def section(out: dict, names: list[str], records: list[Any]) -> dict[str, Any] | None:
    """The `overlap` entry of one prompt set's results (None when the run had no overlapped configuration)."""
    overlapped = [n for n in names if n.startswith(OVERLAP_PREFIX)]
    best = _sequential_best(out, names)
    if not overlapped or best is None:
        return None
    call_ms = _median(out["overhead_ms_p50"].get(K0)) or 0.0
    per_pos = out["per_position_acceptance"].get(best) or [0.0]
    bounds = _bounds([r for r in records if r.config == best], call_ms, per_pos[0] or 0.0)
    k0 = _median(out["tokens_per_s"].get(K0))
    seq = _median(out["tokens_per_s"][best])
    result: dict[str, Any] = {"sequential": best, "bounds_from": best, "bounds": bounds, "configs": {}}
    for n in overlapped:
        tps = _median(out["tokens_per_s"].get(n))
        rounds = [rd for r in records if r.config == n for rd in r.rounds]
        drafted = [rd for rd in rounds if rd["drafted"]]
        used = [rd for rd in drafted if rd.get("predrafted")]
        base = without_branches(n)  # overlap_adaptive_b0 -> overlap_adaptive
        twin = base[len(OVERLAP_PREFIX) + 1 :]  # overlap_k4 -> k4, overlap_adaptive -> adaptive
        result["configs"][n] = {
            "tokens_per_s": tps,
            "vs_k0": _ratio(tps, k0),
            "vs_sequential": _ratio(tps, seq),
            "vs_same_k_sequential": _ratio(tps, _median(out["tokens_per_s"].get(twin))),
            **({"vs_server_branches": _ratio(tps, _median(out["tokens_per_s"].get(base)))} if base != n else {}),
            "vs_bound_all_hidden": _ratio(tps, bounds["all_hidden_tokens_per_s"] if bounds else None),
            "vs_bound_post_verify": _ratio(tps, bounds["post_verify_tokens_per_s"] if bounds else None),
            "predrafted_rounds": len(used),
            "drafted_rounds": len(drafted),
            "predrafted_runner_up_rounds": sum(1 for rd in used if rd.get("predraft_runner_up_at")),
            "predraft_branches": sum(r.stats.get("predraft_branches", 0) for r in records if r.config == n),
            "predraft_use_rate": len(used) / len(drafted) if drafted else None,
            "draft_hidden_ms_per_round": sum(rd.get("draft_hidden_ms", 0.0) for rd in rounds) / len(rounds)
            if rounds
            else None,
        }
    return result


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def lines(result: dict[str, Any]) -> list[str]:
    """The table's overlap rows, per prompt set."""
    out = []
    for s, r in result.items():
        ov = r.get("overlap") if isinstance(r, dict) else None
        if not ov:
            continue
        b = ov["bounds"] or {}
        out.append(
            f"  overlap ({s}): sequential = {ov['sequential']}; bound all draft hidden "
            f"{_f(b.get('all_hidden_tokens_per_s'))} tok/s ({_f(_ratio(b.get('all_hidden_tokens_per_s'), b.get('sequential_tokens_per_s')), 2)}x "
            f"sequential), post-verify bound {_f(b.get('post_verify_tokens_per_s'))} tok/s "
            f"(hit rate {_f(b.get('post_verify_hit_rate'), 3)})"
        )
        for n, c in ov["configs"].items():
            out.append(
                f"    {n}: {_f(c['tokens_per_s'])} tok/s, {_f(c['vs_k0'], 2)}x k0, {_f(c['vs_sequential'], 2)}x "
                f"sequential, {_f(c['vs_same_k_sequential'], 2)}x same k sequential, {_f(c['vs_bound_all_hidden'], 2)} "
                f"of the bound; pre-drafts used in {c['predrafted_rounds']}/{c['drafted_rounds']} rounds "
                f"({c.get('predrafted_runner_up_rounds', 0)} behind a runner-up; {c.get('predraft_branches', 0)} "
                f"blocks drafted), "
                f"{_f(c['draft_hidden_ms_per_round'], 2)} ms hidden a round"
                + (f", {_f(c['vs_server_branches'], 3)}x the server's branches" if "vs_server_branches" in c else "")
            )
    return out


def _f(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"
