"""bench-load with overlapped rounds: the twin configurations, their flags, each point compared with the same
run's sequential twin, and the pre-draft counters read from the servers' /metrics."""

from __future__ import annotations

import argparse

import pytest

from specdec.bench.load_args import add_parser, args_from_cli
from specdec.bench.load_overlap import overlap_comparisons, twins
from specdec.bench.load_plan import CONCURRENCY, K0, K0_AA, RATE, configurations
from specdec.bench.load_results import server_delta, server_samples
from specdec.config import DEFAULT_MODELS


def _parse(*argv: str):
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    return args_from_cli(parser.parse_args(["bench-load", "--quick", *argv]))


def test_overlapped_twins_follow_their_sequential_configuration_and_ask_for_overlap():
    configs = configurations((2, 4), 8, overlap_ks=(4,), overlap_adaptive=True)
    assert [c.name for c in configs] == [K0, "k2", "k4", "overlap_k4", "adaptive", "overlap_adaptive", K0_AA]
    by_name = {c.name: c for c in configs}
    assert by_name["overlap_adaptive"].extension() == {"k": 8, "ignore_eos": True, "adaptive_k": True, "overlap": True}
    assert "overlap" not in by_name["adaptive"].extension() and "overlap" not in by_name["k4"].extension()
    assert twins([c.name for c in configs]) == {"overlap_k4": "k4", "overlap_adaptive": "adaptive"}
    with pytest.raises(ValueError, match="twin"):
        configurations((4,), 8, overlap_ks=(2,))  # k2 is not in the run: nothing to judge overlap_k2 by
    with pytest.raises(ValueError, match="adaptive"):
        configurations((4,), 0, overlap_adaptive=True)


def test_the_flags_start_a_model_draft_and_refuse_overlap_without_one():
    args = _parse("--draft-kind", "combined", "--overlap", "4,adaptive", "--k", "4")
    assert args.draft_kind == "combined" and args.draft_model == DEFAULT_MODELS["draft"]  # the shipped draft
    assert [c.name for c in args.configs] == [K0, "k4", "overlap_k4", "adaptive", "overlap_adaptive", K0_AA]
    assert _parse("--draft-kind", "model", "--draft-model", "runs/d").draft_model == "runs/d"
    assert _parse().draft_kind == "ngram" and _parse().draft_model == "" and _parse().dtype == ""
    assert _parse("--dtype", "bfloat16").dtype == "bfloat16"  # the services' weights, as bench-concurrency
    with pytest.raises(SystemExit, match="model or combined"):
        _parse("--overlap", "adaptive")  # the n-gram draft is local: nothing to draft ahead
    with pytest.raises(SystemExit, match="twin"):
        _parse("--draft-kind", "model", "--overlap", "2", "--k", "4")
    with pytest.raises(SystemExit, match="--draft-model"):
        _parse("--draft-kind", "model", "--target-model", "hf:some/model")


def _rows(tokens: dict[str, float]) -> dict[str, dict]:
    """point ("concurrency@16") -> a row streaming `tok` tokens/s, its ITL following from it."""
    out = {}
    for point, tok in tokens.items():
        kind, value = point.split("@")
        out[point] = {
            "kind": kind,
            "value": float(value),
            "streamed_tokens_per_s": tok,
            "output_tokens_per_s": tok,
            "ttft_ms_p50": 100.0,
            "itl_ms_p50": 1000.0 / tok,
            "itl_ms_p90": 1500.0 / tok,
            "errors": 0,
            "latency_s_p50": 2.0,
        }
    return out


def test_every_point_is_compared_with_the_twin_of_the_same_run():
    results = {
        "adaptive": _rows({f"{CONCURRENCY}@1": 20.0, f"{CONCURRENCY}@16": 40.0, f"{RATE}@0.5": 10.0}),
        "overlap_adaptive": _rows({f"{CONCURRENCY}@1": 22.0, f"{CONCURRENCY}@16": 38.0, f"{RATE}@0.5": 10.0}),
    }
    pairs = {"overlap_adaptive": "adaptive"}
    cmp = overlap_comparisons(results, pairs, {"streamed_tokens_per_s": 0.03})["overlap_adaptive"]
    row = results["overlap_adaptive"][f"{CONCURRENCY}@1"]
    assert row["vs_sequential"]["streamed_tokens_per_s"] == 1.1 and row["vs_sequential"]["itl_ms_p50"] == 0.9091
    assert cmp == {
        "twin": "adaptive",
        "points": 3,
        "min_tokens_ratio": 0.95,
        "points_slower": [{"point": f"{CONCURRENCY}@16", "ratio": 0.95, "within_noise": False}],
    }
    wide = overlap_comparisons(results, pairs, {"streamed_tokens_per_s": 0.06})["overlap_adaptive"]
    assert wide["points_slower"][0]["within_noise"]  # the A/A band covers it
    results["overlap_adaptive"][f"{CONCURRENCY}@16"]["streamed_tokens_per_s"] = 41.0
    assert overlap_comparisons(results, pairs, {})["overlap_adaptive"]["points_slower"] == []
    assert overlap_comparisons({"overlap_adaptive": {}}, pairs, {})["overlap_adaptive"]["min_tokens_ratio"] is None


def test_the_servers_pre_draft_counters_are_read_per_outcome():
    page = (
        "# TYPE specdec_predrafts counter\n"
        'specdec_predrafts_total{{outcome="started"}} {s}\nspecdec_predrafts_total{{outcome="used"}} {u}\n'
        "# TYPE specdec_draft_hidden_seconds counter\nspecdec_draft_hidden_seconds_total {h}\n"
    )
    before, after = server_samples(page.format(s=3, u=1, h=0.5)), server_samples(page.format(s=13, u=5, h=0.75))
    delta = server_delta(before, after)
    assert (delta["predrafts_started"], delta["predrafts_used"], delta["draft_hidden_s"]) == (10, 4, 0.25)
    assert server_delta({}, {})["predrafts_started"] == 0  # a stack that drafts nothing ahead


def test_the_summary_names_the_overlap_comparison():
    from specdec.bench.load_summary import summary_lines

    results = {
        name: _rows({f"{CONCURRENCY}@4": tok})
        for name, tok in ((K0, 30.0), (K0_AA, 30.0), ("adaptive", 40.0), ("overlap_adaptive", 36.0))
    }
    ds = {
        "saturation_rps_k0": 1.0,
        "rates": [],
        "configs": results,
        "noise_band": {},
        "compared_to_k0": {},
        "overlap": overlap_comparisons(results, {"overlap_adaptive": "adaptive"}, {}),
    }
    text = "\n".join(summary_lines({"datasets": {"prompts": ds}}))
    assert "overlap_adaptive vs adaptive: lowest streamed tok/s x0.9" in text and "concurrency@4 x0.9" in text


def test_both_benches_read_overlap_with_one_parser_and_refuse_other_entries():
    from specdec.bench.bench_cli import add_parser as bench_parser
    from specdec.bench.bench_cli import args_from_cli as bench_args
    from specdec.bench.plan import parse_overlap

    assert parse_overlap("4, adaptive,2,4") == ([2, 4], True) and parse_overlap("") == ([], False)
    with pytest.raises(ValueError, match="k values and 'adaptive'"):
        parse_overlap("4,adaptve")
    with pytest.raises(SystemExit, match="specdec bench-load: --overlap takes k values"):
        _parse("--draft-kind", "model", "--overlap", "-1")
    parser = argparse.ArgumentParser()
    bench_parser(parser.add_subparsers())
    with pytest.raises(SystemExit, match="specdec bench: --overlap takes k values"):
        bench_args(parser.parse_args(["bench", "--overlap", "four"]))
    args = bench_args(parser.parse_args(["bench", "--overlap", "4,adaptive"]))
    assert (args.overlap_ks, args.overlap_adaptive) == ([4], True)
