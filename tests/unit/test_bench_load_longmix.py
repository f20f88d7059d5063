"""Pure parts of `specdec bench-load --long-mix` and the data files of bench-load: cycling rows so guidellm
does not run out of data, the long prompt set, request accounting and the mix's verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec.bench.load_longmix import (
    LongMixPlan,
    check_long_prompts,
    long_chat_rows,
    long_mix_verdict,
    parse_longmix_report,
    request_accounting,
)
from specdec.bench.load_plan import (
    CONCURRENCY,
    LoadConfig,
    ScenarioInputs,
    chat_rows,
    cycle_rows,
    scenario,
    write_chat_jsonl,
)

ROOT = Path(__file__).resolve().parents[2]
PLAN = LongMixPlan(short_max_tokens=64, long_max_tokens=32, cache_budget_bytes=1000)


def test_cycle_rows_repeats_whole_passes_until_enough():
    rows = [{"i": 0}, {"i": 1}, {"i": 2}]
    assert cycle_rows(rows, 0) == rows and cycle_rows(rows, 3) == rows
    assert [r["i"] for r in cycle_rows(rows, 4)] == [0, 1, 2, 0, 1, 2]
    with pytest.raises(ValueError):
        cycle_rows([], 5)


def test_chat_file_has_a_row_for_every_request_of_a_point(tmp_path: Path):
    # guidellm ends a benchmark when its data runs out: 50 requests need >= 50 rows, not the 20 prompts
    n = write_chat_jsonl(tmp_path / "c.jsonl", min_rows=50 + 32)
    lines = (tmp_path / "c.jsonl").read_text().splitlines()
    assert n == len(lines) >= 82 and len(lines) % len(chat_rows()) == 0
    assert json.loads(lines[len(chat_rows())]) == chat_rows()[0]


def test_long_rows_are_the_long_prompt_set_and_short_ones_are_rejected():
    rows = long_chat_rows()
    users = [json.loads(x)["user"] for x in (ROOT / "bench/prompts/long.jsonl").read_text().splitlines() if x]
    assert [r["messages"][0]["content"] for r in rows] == users and len(rows) >= PLAN.long_streams
    check_long_prompts([5000, 3000], 3000)
    with pytest.raises(ValueError, match="2999"):
        check_long_prompts([5000, 2999], 3000)
    with pytest.raises(ValueError):
        check_long_prompts([], 3000)


def _row(
    ok: int, ttft_p90: float | None = 100.0, errored: int = 0, limited: int = 0, incomplete: int = 0, short: int = 0
) -> dict:
    return {
        "requests": ok,
        "ttft_ms_p90": ttft_p90,
        "itl_ms_p50": 50.0,
        "errored": errored,
        "rate_limited": limited,
        "incomplete": incomplete,
        "short_outputs": short,
    }


SERVER = {"budget_bytes": 1000, "max_used_bytes": 900, "evictions": 3, "call_failures": 0, "prefill_chunks": 40}


def test_verdict_passes_with_admission_rejects_and_cut_requests_only():
    v = long_mix_verdict(
        _row(60),
        _row(50, ttft_p90=190.0, errored=2, limited=2, incomplete=12),
        _row(4, ttft_p90=9000.0, incomplete=4),
        SERVER,
        PLAN,
    )
    assert v["ok"] and v["kv_inside_budget"] and v["failures_only_admission"] and "short_ttft_ok" not in v
    assert v["short_ttft_p90_ratio"] == 1.9 and v["kv_evictions"] == 3
    assert v["requests"]["mix_short"] == {
        "successful": 50,
        "errored": 2,
        "rate_limited": 2,
        "failed_not_admission": 0,
        "short_outputs": 0,
        "incomplete_at_time_limit": 12,
        "max_tokens": 64,
    }


def test_the_short_prompts_ttft_ratio_is_measured_not_judged():
    v = long_mix_verdict(_row(60), _row(50, ttft_p90=1000.0), _row(4), SERVER, PLAN)
    assert v["short_ttft_p90_ratio"] == 10.0 and v["ok"]


@pytest.mark.parametrize(
    "change, failed",
    [
        ({"mix_short": _row(50, errored=3, limited=1)}, "failures_only_admission"),  # 2 failed otherwise
        ({"mix_long": _row(4, short=1)}, "failures_only_admission"),  # a stream cut by an error event
        ({"server": {**SERVER, "max_used_bytes": 1001}}, "kv_inside_budget"),
        ({"server": {**SERVER, "call_failures": 1}}, "kv_inside_budget"),
        ({"mix_long": _row(0, ttft_p90=None, incomplete=4)}, "long_requests_completed"),
    ],
)
def test_verdict_fails_on_each_broken_check(change: dict, failed: str):
    parts = {
        "baseline_short": _row(60),
        "mix_short": _row(50, ttft_p90=150.0),
        "mix_long": _row(4),
        "server": SERVER,
        **change,
    }
    v = long_mix_verdict(parts["baseline_short"], parts["mix_short"], parts["mix_long"], parts["server"], PLAN)
    assert not v[failed] and not v["ok"]


def test_request_accounting_separates_failures_from_admission():
    acc = request_accounting(_row(10, errored=5, limited=3, incomplete=2, short=1), 64)
    assert (acc["failed_not_admission"], acc["rate_limited"], acc["incomplete_at_time_limit"]) == (2, 3, 2)


def _metric(values: list[float]) -> dict:
    s = sorted(values)
    return {
        "successful": {
            "count": len(s),
            "total_sum": sum(s),
            "percentiles": {"p50": s[len(s) // 2], "p90": s[int(0.9 * len(s))], "p99": s[-1]},
        }
    }


def test_parse_longmix_report_counts_short_outputs_and_splits_errors_from_incomplete():
    outs = [64, 64, 10]
    bench = {
        "config": {"strategy": {"type_": "concurrent", "streams": 12}},
        "duration": 10.0,
        "metrics": {
            "request_totals": {"successful": 3, "errored": 1, "incomplete": 5},
            "output_token_count": _metric(outs),
            "time_to_first_token_ms": _metric([1.0, 2.0, 3.0]),
            "inter_token_latency_ms": _metric([5.0, 5.0, 5.0]),
        },
        "requests": {
            "successful": [{"output_metrics": {"text_tokens": n}} for n in outs],
            "errored": [{"info": {"error": "HTTP 429 Too Many Requests"}}],
            "incomplete": [],
        },
    }
    row = parse_longmix_report({"benchmarks": [bench]}, max_tokens=64)
    assert (row["errored"], row["incomplete"], row["short_outputs"], row["rate_limited"]) == (1, 5, 1, 1)
    with pytest.raises(ValueError):
        parse_longmix_report({"benchmarks": [bench, bench]}, max_tokens=64)


def test_mix_scenarios_are_time_bound_closed_loops():
    inp = ScenarioInputs(
        "http://127.0.0.1:1",
        "/p",
        "/d.jsonl",
        "/o.json",
        requests_per_point=100_000,
        max_tokens=32,
        max_seconds_per_point=165.0,
    )
    spec = scenario(LoadConfig("k0", 0), CONCURRENCY, [PLAN.long_streams], inp)["spec"]
    assert spec["profile"] == {"kind": "concurrent", "streams": [4]}
    assert {"kind": "max_duration", "seconds": 165.0} in spec["constraints"]
    assert PLAN.short_streams + PLAN.long_streams == 16 and PLAN.min_long_prompt_tokens >= 3000


def test_bench_concurrency_time_split_adds_up_to_the_wall_time():
    from specdec.bench.concurrency import SPLIT_SAMPLES, mean_split, time_split

    busy, prefill, wait = SPLIT_SAMPLES
    before = {busy: 100.0, prefill: 10.0, wait: 1.0}
    after = {busy: 107.0, prefill: 12.0, wait: 1.5}  # 7 s busy, 2 of them prefill
    split = time_split(10.0, 400, before, after, [4.0, 6.0, 5.0])
    assert (split["prefill_s"], split["decode_s"], split["batch_wait_s"], split["idle_s"]) == (2.0, 5.0, 0.5, 2.5)
    assert split["prefill_share"] + split["decode_share"] + split["batch_wait_share"] + split["idle_share"] == 1.0
    assert split["tokens_per_decode_s"] == 80.0 and split["round_overhead_ms_p50"] == 5.0
    assert mean_split([split, {**split, "idle_s": 4.5}])["idle_s"] == 3.5 and mean_split([]) == {}


def test_guidellm_runs_offline_with_few_worker_processes():
    from specdec.bench.load import GUIDELLM_WORKERS, guidellm_env

    env = guidellm_env()
    assert env["HF_HUB_OFFLINE"] == "1" and env["GUIDELLM__MAX_WORKER_PROCESSES"] == str(GUIDELLM_WORKERS)
    assert 1 <= GUIDELLM_WORKERS <= 2  # the stack shares the cores with it
