"""specdec.bench.overlap_report: overlapped configurations against k = 0, sequential rounds and the bound
for overlap, on synthetic runs (no models, no processes)."""

from __future__ import annotations

import pytest

from specdec.bench import overlap_report, report, report_table
from specdec.bench.plan import Config, Prompt, RunRecord, make_configs, without_branches

VERIFY = {
    "context_tokens": 300,
    "reps": 1,
    "threads": 1,
    "ms": {"1": 26.0, "5": 33.0},
    "ratio": {"1": 1.0, "5": 1.27},
    "spread_ms": {},
    "kv_bytes_per_token_measured": 1.0,
}
ACCEPTED = [4, 1, 0, 1, 0, 0]  # 6 rounds of k = 4: 12 tokens, all accepted once, a1 = 3/6


def _rounds(k: int, accepted: list[int], draft_ms: float, used: int = 0) -> list[dict]:
    return [
        {
            "k": k,
            "drafted": k,
            "accepted": a,
            "draft_ms": draft_ms,
            "target_ms": 33.0,
            "overhead_ms": 2.0,
            "predrafted": i < used,
            "draft_hidden_ms": 12.0 if i < used else 0.0,
        }
        for i, a in enumerate(accepted)
    ]


def _stats(k: int, accepted: list[int]) -> dict:
    return {
        "accepted_per_position": [sum(a > i for a in accepted) for i in range(k)],
        "drafted_per_position": [len(accepted)] * k,
    }


def _record(config: str, wall_s: float, k: int, accepted: list[int], draft_ms: float, used: int = 0) -> RunRecord:
    return RunRecord(
        "open",
        "p1",
        config,
        0,
        list(range(12)),
        wall_s,
        [(wall_s, 12)],
        _stats(k, accepted),
        _rounds(k, accepted, draft_ms, used),
    )


def test_overlap_section_ratios_and_bounds() -> None:
    configs = [Config("k0", "stack", 0), Config("k4", "stack", 4), Config("overlap_k4", "stack", 4, overlap=True)]
    records = [
        _record("k0", 0.6, 0, [0] * 12, 0.0),
        _record("k4", 0.48, 4, ACCEPTED, 10.0),
        _record("overlap_k4", 0.45, 4, ACCEPTED, 10.0, used=1),
    ]
    settings = {
        "draft_kind": "model",
        "configs": {c.name: c.label(4) for c in configs},
        "server_default_k": 4,
        "prompts": {"open": ["p1"]},
        "target_model_id": "t",
        "dtype": "float32",
        "max_new_tokens": 12,
        "repeats": 1,
        "threads": {"target_service": 1},
    }
    machine = {"cpu_model": "cpu", "cores": 2, "usable_cores": 2, "torch": "x", "transformers": "y"}
    result = report.build(
        records,
        configs,
        [Prompt("open", "p1", "text", [1, 2, 3])],
        settings=settings,
        machine=machine,
        hf_settings={},
        verify=VERIFY,
        draft_step_cost=0.1,
        identity={"open": {}},
        rss={"target": {"bytes": 1, "source": "VmHWM"}},
        kv_per_token_model={"target": 1},
        default_k=4,
    )
    ov = result["open"]["overlap"]
    assert ov["sequential"] == "k4"
    hideable = 6 * 10.0 + 6 * 2.0  # draft forwards + one call's overhead (k0's p50) per round
    assert ov["bounds"]["all_hidden_tokens_per_s"] == pytest.approx(12 / (480 - hideable) * 1000)
    assert ov["bounds"]["post_verify_hit_rate"] == pytest.approx(1 / 6 * 0.5)
    assert ov["bounds"]["post_verify_tokens_per_s"] == pytest.approx(12 / (480 - hideable / 12) * 1000)
    c = ov["configs"]["overlap_k4"]
    assert c["vs_k0"] == pytest.approx(0.6 / 0.45)
    assert c["vs_sequential"] == c["vs_same_k_sequential"] == pytest.approx(0.48 / 0.45)
    assert c["vs_bound_all_hidden"] == pytest.approx((12 / 0.45) / (12 / (480 - hideable) * 1000))
    assert c["predrafted_rounds"] == 1 and c["drafted_rounds"] == 6
    assert c["draft_hidden_ms_per_round"] == pytest.approx(2.0)
    assert "overlap_k4: 26.7 tok/s" in report_table.table(result)


def test_overlap_configurations_are_named_overlap() -> None:
    names = [c.name for c in make_configs([2, 4], with_hf=False, adaptive_cap=4, overlap_ks=[4], overlap_adaptive=True)]
    assert names[-2:] == ["overlap_k4", "overlap_adaptive"]
    assert [c.name for c in make_configs([4], with_hf=False)] == ["k0", "k4", "kdefault"]


def test_a_branches_twin_follows_each_overlapped_configuration_and_is_judged_against_both() -> None:
    """--overlap-branches N: overlap_k4_bN asks GenerateRequest.overlap_branches = N; its sequential twin stays
    k4 and the report gives its ratio to the configuration with the server's branches (side by side)."""
    configs = make_configs(
        [4], with_hf=False, adaptive_cap=4, overlap_ks=[4], overlap_adaptive=True, overlap_branches=0
    )
    by_name = {c.name: c for c in configs}
    assert [c.name for c in configs][-4:] == ["overlap_k4", "overlap_k4_b0", "overlap_adaptive", "overlap_adaptive_b0"]
    assert by_name["overlap_k4_b0"].branches == 0 and by_name["overlap_k4"].branches is None
    assert by_name["overlap_adaptive_b0"].adaptive and by_name["overlap_adaptive_b0"].label(4).endswith("(0 branches)")
    assert (
        without_branches("overlap_adaptive_b0") == "overlap_adaptive" and without_branches("overlap_k4") == "overlap_k4"
    )
    configs = [
        Config("k0", "stack", 0),
        Config("k4", "stack", 4),
        Config("overlap_k4", "stack", 4, overlap=True),
        Config("overlap_k4_b0", "stack", 4, overlap=True, branches=0),
    ]
    records = [
        _record("k0", 0.6, 0, [0] * 12, 0.0),
        _record("k4", 0.48, 4, ACCEPTED, 10.0),
        _record("overlap_k4", 0.45, 4, ACCEPTED, 10.0, used=1),
        _record("overlap_k4_b0", 0.5, 4, ACCEPTED, 10.0),
    ]
    out = {
        "tokens_per_s": {r.config: {"median": 12 / r.wall_s} for r in records},
        "overhead_ms_p50": {"k0": {"median": 2.0}},
        "per_position_acceptance": {"k4": [0.5]},
    }
    ov = overlap_report.section(out, [c.name for c in configs], records)
    assert ov["configs"]["overlap_k4_b0"]["vs_same_k_sequential"] == pytest.approx(0.48 / 0.5)
    assert ov["configs"]["overlap_k4_b0"]["vs_server_branches"] == pytest.approx(0.45 / 0.5)
    assert "vs_server_branches" not in ov["configs"]["overlap_k4"]
