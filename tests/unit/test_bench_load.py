"""Pure parts of `specdec bench-load`: rate list, scenarios, guidellm report parsing, ratios, noise band, the
comparison with k = 0."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from specdec.bench.load_args import add_parser
from specdec.bench.load_plan import (
    CHAT_SETS,
    CONCURRENCY,
    DATA_GROUNDED,
    GUIDELLM_VERSION,
    K0,
    K0_AA,
    RATE,
    LoadConfig,
    ScenarioInputs,
    chat_rows,
    configurations,
    rate_list,
    scenario,
)
from specdec.bench.load_results import (
    add_ratios,
    compared_to_k0,
    noise_band,
    parse_benchmark,
    parse_report,
    point_key,
    saturation_rps,
)
from specdec.bench.load_summary import summary_lines

ROOT = Path(__file__).resolve().parents[2]


def _metric(values: list[float]) -> dict:
    """A guidellm distribution block with the percentiles we read (nearest-rank, like guidellm's)."""
    s = sorted(values)

    def pct(q: float) -> float:
        return s[min(len(s) - 1, int(q * len(s)))]

    return {
        "successful": {
            "count": len(s),
            "total_sum": sum(s),
            "percentiles": {"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99)},
        }
    }


def _bench(
    strategy: dict,
    n: int,
    tokens: int,
    duration: float,
    ttft: float,
    itl: float,
    errors: list[str] = (),
    cut_tokens: tuple[int, ...] = (),
) -> dict:
    """cut_tokens: the tokens each request cut at the point's time cap (incomplete) had streamed."""
    counts = {**_metric([tokens] * n), "incomplete": {"count": len(cut_tokens), "total_sum": sum(cut_tokens)}}
    return {
        "config": {"strategy": strategy},
        "duration": duration,
        "metrics": {
            "request_totals": {"successful": n, "errored": len(errors), "incomplete": len(cut_tokens)},
            "output_token_count": counts,
            "time_to_first_token_ms": _metric([ttft + i for i in range(n)]),
            "inter_token_latency_ms": _metric([itl] * n),
            "request_latency": _metric([(ttft + itl * (tokens - 1)) / 1000] * n),
        },
        "requests": {"successful": [], "errored": [{"info": {"error": e}} for e in errors], "incomplete": []},
    }


def test_rate_list_is_fractions_of_saturation_sorted_and_rounded():
    assert rate_list(1.2345, (1.0, 0.2, 0.6)) == [0.247, 0.741, 1.23]
    assert rate_list(2.0, (0.5, 0.5, 1.0)) == [1.0, 2.0]  # duplicates collapse


@pytest.mark.parametrize("sat, fractions", [(0.0, (0.5,)), (-1.0, (0.5,)), (1.0, ()), (1.0, (0.0, 1.0))])
def test_rate_list_rejects_meaningless_inputs(sat, fractions):
    with pytest.raises(ValueError):
        rate_list(sat, fractions)


def test_configurations_bracket_with_k0_and_its_aa_repeat():
    names = [c.name for c in configurations((4, 0), 8)]
    assert names == [K0, "k4", "adaptive", K0_AA]
    adaptive = configurations((), 6)[1]
    assert adaptive.extension() == {"k": 6, "ignore_eos": True, "adaptive_k": True}
    assert [c.name for c in configurations((2,), 0)] == [K0, "k2", K0_AA]


def test_scenario_sends_the_extension_object_and_a_local_tokenizer():
    inp = ScenarioInputs(
        target_url="http://127.0.0.1:1",
        processor_dir="/tmp/proc",
        data_file="/tmp/d.jsonl",
        out_json="/tmp/o.json",
        requests_per_point=50,
        max_tokens=64,
        max_seconds_per_point=30,
    )
    sc = scenario(LoadConfig("k4", 4), CONCURRENCY, [1, 4, 16], inp)["spec"]
    assert sc["backend"]["extras"]["body"] == {"temperature": 0.0, "specdec": {"k": 4, "ignore_eos": True}}
    assert sc["profile"] == {"kind": "concurrent", "streams": [1, 4, 16]}
    assert sc["tokenizer"] == {"kind": "huggingface_auto", "model": "/tmp/proc"}
    assert {"kind": "max_requests", "count": 50} in sc["constraints"]
    assert {"kind": "max_duration", "seconds": 30} in sc["constraints"]
    rated = scenario(LoadConfig(K0, 0), RATE, [0.5, 1.0], ScenarioInputs("u", "p", "", "o", 3, 12, 64))["spec"]
    assert rated["profile"] == {"kind": "poisson", "rate": [0.5, 1.0]}
    assert rated["data"] == [{"kind": "synthetic_text", "prompt_tokens": 64, "output_tokens": 12}]
    with pytest.raises(ValueError):
        scenario(LoadConfig(K0, 0), "sweep", [1], inp)


def test_the_multiturn_data_set_is_synthetic_conversations_opening_with_a_shared_prefix():
    from specdec.bench.load_plan import (
        DATA_MULTITURN,
        DATASETS,
        MULTITURN_PREFIX_TOKENS,
        MULTITURN_PROMPT_TOKENS,
        MULTITURN_TURNS,
        data_inputs,
    )

    assert DATA_MULTITURN in DATASETS
    inp = ScenarioInputs("u", "p", "", "o", 3, 32, **data_inputs(DATA_MULTITURN, 64))
    assert scenario(LoadConfig(K0, 0), CONCURRENCY, [1], inp)["spec"]["data"] == [
        {
            "kind": "synthetic_text",
            "prompt_tokens": MULTITURN_PROMPT_TOKENS,
            "output_tokens": 32,
            "turns": MULTITURN_TURNS,
            "prefix_tokens": MULTITURN_PREFIX_TOKENS,
        }
    ]
    assert data_inputs("synthetic", 64) == {"synthetic_prompt_tokens": 64}


def test_multiturn_conversations_differ_per_invocation_and_other_data_sets_repeat_theirs():
    """With prefix sharing a conversation met twice is served from the cache the second time: multiturn gets
    new conversations per invocation (the same ones again in a rerun, for an A/B); other data sets give every
    configuration the same requests. The bench starts the services with sharing off unless asked."""
    from specdec.bench.load import _service_env
    from specdec.bench.load_args import args_from_cli
    from specdec.bench.load_plan import invocation_seed

    seeds = {invocation_seed(42, "multiturn", f"multiturn-concurrency-1-{c}") for c in ("k0", "k4", "k0_aa")}
    assert len(seeds) == 3 and invocation_seed(42, "multiturn", "multiturn-concurrency-1-k0") in seeds
    assert invocation_seed(42, "prompts", "prompts-concurrency-1-k0") == 42
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    off = args_from_cli(parser.parse_args(["bench-load", "--quick"]))
    assert _service_env(off) == {"SPECDEC_PREFIX_SHARE_MIN_TOKENS": "0"}
    on = args_from_cli(parser.parse_args(["bench-load", "--quick", "--prefix-share-min-tokens", "-1"]))
    assert _service_env(on) == {}


def test_chat_rows_alternate_grounded_and_open_prompts():
    rows = chat_rows()
    grounded = [json.loads(x)["user"] for x in (ROOT / "bench/prompts/grounded.jsonl").read_text().splitlines() if x]
    open_ = [json.loads(x)["user"] for x in (ROOT / "bench/prompts/open.jsonl").read_text().splitlines() if x]
    assert len(rows) == len(grounded) + len(open_)
    assert rows[0]["messages"] == [{"role": "user", "content": grounded[0]}]
    assert rows[1]["messages"] == [{"role": "user", "content": open_[0]}]
    alone = chat_rows(sets=CHAT_SETS[DATA_GROUNDED])  # --data grounded: the low-rate gain's prompts
    assert [r["messages"][0]["content"] for r in alone] == grounded


def test_parse_benchmark_computes_throughput_from_totals_and_gates_p99():
    row = parse_benchmark(
        _bench(
            {"type_": "concurrent", "streams": 4},
            n=50,
            tokens=64,
            duration=100.0,
            ttft=200.0,
            itl=40.0,
            errors=["HTTP 429 rate_limit_error", "timeout"],
        )
    )
    assert row["point"] == "concurrency@4" and row["requests"] == 50 and row["errors"] == 2
    assert row["output_tokens_per_s"] == pytest.approx(32.0)
    assert row["requests_per_s"] == pytest.approx(0.5)
    assert row["itl_ms_p50"] == 40.0 and row["ttft_ms_p50"] == 225.0
    assert row["ttft_ms_p99"] is None and row["rate_limited"] == 1  # 50 < 100 requests: no p99
    many = parse_benchmark(_bench({"type_": "poisson", "rate": 0.7412}, 100, 8, 10.0, 10.0, 5.0))
    assert many["point"] == "rate@0.741" and many["ttft_ms_p99"] == 109.0


def test_parse_report_reads_the_version_and_rejects_unknown_strategies():
    report = {
        "metadata": {"guidellm_version": GUIDELLM_VERSION},
        "benchmarks": [_bench({"type_": "concurrent", "streams": 1}, 5, 10, 10.0, 100.0, 50.0)],
    }
    rows, version = parse_report(report)
    assert version == GUIDELLM_VERSION and rows[0]["output_tokens_per_s"] == 5.0
    assert rows[0]["streamed_tokens_per_s"] == 5.0
    assert rows[0]["latency_s_p50"] == 0.55  # the whole request, seconds: 100 ms + 9 x 50 ms
    cut = parse_benchmark(_bench({"type_": "concurrent", "streams": 16}, 32, 32, 45.0, 1.0, 1.0, cut_tokens=(9,) * 16))
    assert cut["output_tokens_per_s"] == round(32 * 32 / 45, 3)  # whole waves of successful requests
    assert cut["streamed_tokens_per_s"] == round((32 * 32 + 16 * 9) / 45, 3) and cut["errors"] == 16
    with pytest.raises(ValueError):
        parse_benchmark(_bench({"type_": "throughput"}, 1, 1, 1.0, 1.0, 1.0))


def _results(k0_tok: float, aa_tok: float, ad_tok: float, ad_itl: float) -> dict:
    def rows(tok: float, itl: float) -> dict:
        out = {}
        for kind, value in ((CONCURRENCY, 16), (RATE, 0.2)):
            out[point_key(kind, value)] = {
                "kind": kind,
                "value": value,
                "output_tokens_per_s": tok,
                "streamed_tokens_per_s": tok,
                "requests_per_s": tok / 64,
                "ttft_ms_p50": 100.0,
                "ttft_ms_p90": 150.0,
                "itl_ms_p50": itl,
                "itl_ms_p90": itl * 1.5,
                "errors": 0,
            }
        return out

    return {K0: rows(k0_tok, 50.0), K0_AA: rows(aa_tok, 51.0), "adaptive": rows(ad_tok, ad_itl)}


def test_ratios_noise_band_and_saturation():
    res = _results(k0_tok=100.0, aa_tok=98.0, ad_tok=97.5, ad_itl=25.0)
    add_ratios(res)
    assert res["adaptive"]["concurrency@16"]["vs_k0"]["output_tokens_per_s"] == 0.975
    assert res[K0]["rate@0.2"]["vs_k0"]["itl_ms_p50"] == 1.0
    band = noise_band(res)
    assert band["output_tokens_per_s"] == pytest.approx(0.02) and band["itl_ms_p50"] == pytest.approx(0.02)
    assert saturation_rps(list(res[K0].values())) == pytest.approx(100 / 64)
    g = compared_to_k0(res, "adaptive", band)
    assert (
        g["saturation_tokens_ratio"] == 0.975 and g["latency_outside_band"] == [] and g["low_rate_itl_p50_gain"] == 2.0
    )
    assert not any(key.endswith("ok") for key in g)  # measured figures, no pass/fail


def test_comparison_lists_latency_outside_the_band_and_the_lost_saturation():
    res = _results(k0_tok=100.0, aa_tok=100.0, ad_tok=90.0, ad_itl=60.0)  # 10% slower, ITL 1.2x
    add_ratios(res)
    g = compared_to_k0(res, "adaptive", noise_band(res))
    assert g["saturation_tokens_ratio"] == 0.9 and g["low_rate_itl_p50_gain"] < 1
    assert {v["metric"] for v in g["latency_outside_band"]} == {"itl_ms_p50", "itl_ms_p90"}
    wide = compared_to_k0(res, "adaptive", {"itl_ms_p50": 0.3, "itl_ms_p90": 0.3})  # inside a wide A/A band
    assert wide["latency_outside_band"] == []


def test_summary_lines_show_every_configuration_and_point():
    res = _results(100.0, 99.0, 120.0, 30.0)
    add_ratios(res)
    record = {
        "machine": {"load_avg_at_start": [1.0, 1.0, 1.0]},
        "guidellm_version": GUIDELLM_VERSION,
        "datasets": {
            "prompts": {
                "saturation_rps_k0": 1.5,
                "rates": [0.3],
                "configs": res,
                "noise_band": noise_band(res),
                "compared_to_k0": {},
            }
        },
    }
    text = "\n".join(summary_lines(record))
    for name in (K0, K0_AA, "adaptive", "concurrency@16", "rate@0.2"):
        assert name in text


def test_makefile_pins_the_guidellm_the_scenarios_are_written_for():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(rf"GUIDELLM_PIN\s*:=\s*guidellm=={re.escape(GUIDELLM_VERSION)}\b", makefile)
    assert "install torch==2.13.0" in makefile.split("$(LOAD_STAMP):")[1].split("load-venv:")[0]


def test_server_delta_reads_batch_fill_and_k_from_metrics_pages():
    from specdec.bench.load_results import server_delta, server_samples

    page = (
        "# TYPE specdec_batch_size histogram\n"
        'specdec_batch_size_sum{{role="target"}} {bs}\nspecdec_batch_size_count{{role="target"}} {bc}\n'
        "# TYPE specdec_spec_decode_k histogram\n"
        'specdec_spec_decode_k_sum{{mode="fixed"}} {ks}\nspecdec_spec_decode_k_count{{mode="fixed"}} {kc}\n'
        'specdec_spec_decode_k_sum{{mode="adaptive"}} 1\nspecdec_spec_decode_k_count{{mode="adaptive"}} 1\n'
    )
    before = server_samples(page.format(bs=10, bc=10, ks=8, kc=2))
    after = server_samples(page.format(bs=40, bc=20, ks=48, kc=12))
    assert before["specdec_spec_decode_k_sum"] == 9.0  # fixed + adaptive
    delta = server_delta(before, after)
    assert delta["mean_target_batch"] == 3.0 and delta["target_passes"] == 10
    assert delta["mean_k"] == 4.0 and delta["rounds"] == 10
    assert delta["mean_round_target_batch"] is None  # not on the page: no rounds seen


def test_the_gateway_maps_every_field_bench_load_sends():
    from http_gateway.openai_schema import parse_request

    for cfg in configurations((4,), 8):
        body = {
            "model": "specdec",
            "max_completion_tokens": 12,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "stop": None,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": "hi"}],
            "specdec": cfg.extension(),
        }
        req = parse_request(body, chat=True).request
        assert (req.k, req.ignore_eos, req.max_new_tokens, req.adaptive_k) == (cfg.k, True, 12, cfg.adaptive)
        assert req.HasField("adaptive_k") == cfg.adaptive


def test_the_saturation_ratio_counts_tokens_streamed_by_requests_cut_at_the_time_cap():
    """At 16 streams adaptive and the A/A repeat may finish 32 requests to k = 0's 48 (a wave of 16 cut at
    45 s): 0.67x in successful tokens, while the tokens streamed differ far less."""
    res = _results(k0_tok=34.1, aa_tok=22.8, ad_tok=22.8, ad_itl=25.0)
    for name, streamed in ((K0, 35.4), (K0_AA, 27.4), ("adaptive", 34.8)):
        res[name]["concurrency@16"]["streamed_tokens_per_s"] = streamed
    add_ratios(res)
    g = compared_to_k0(res, "adaptive", noise_band(res))
    assert res["adaptive"]["concurrency@16"]["vs_k0"]["output_tokens_per_s"] < 0.7
    assert g["saturation_tokens_ratio"] == round(34.8 / 35.4, 4)


def test_each_point_is_run_by_every_configuration_in_alternating_order(monkeypatch, tmp_path):
    """run_dataset interleaves: every configuration runs a point before the next point starts, in the
    listed order at one point and reversed at the next, and the rates come from k = 0's saturation."""
    from specdec.bench import load
    from specdec.bench.load_plan import Mode

    calls: list[tuple[str, str, list]] = []
    tok = {K0: 32.0, "k4": 40.0, "adaptive": 44.0, K0_AA: 30.0}

    def fake_guidellm(args, cfg, dataset, phase, values, inp, sets=None):
        assert set(sets.values()) == {"grounded", "open"}  # reports are split by prompt set
        calls.append((cfg.name, phase, list(values)))
        (value,) = values
        strategy = (
            {"type_": "concurrent", "streams": value} if phase == CONCURRENCY else {"type_": "poisson", "rate": value}
        )
        row = parse_benchmark(
            _bench(strategy, n=10, tokens=16, duration=160.0 / tok[cfg.name] * 3, ttft=100.0, itl=40.0)
        )
        return [row], GUIDELLM_VERSION, load.Invocation(cfg.name, dataset, phase, list(values), 1.0, 0.1, [], [], "")

    monkeypatch.setattr(load, "run_guidellm", fake_guidellm)
    mode = Mode(
        concurrency=(1, 4),
        rate_fractions=(0.5, 1.0),
        requests_per_point=10,
        max_tokens=16,
        fixed_ks=(4,),
        datasets=("prompts",),
    )
    args = load.LoadArgs(mode=mode, mode_name="test", work_dir=str(tmp_path), configs=configurations((4,), 8))
    record = {"invocations": []}
    out = load.run_dataset(args, "prompts", None, record)
    names = [K0, "k4", "adaptive", K0_AA]
    assert [c[0] for c in calls] == names + names[::-1] + names + names[::-1]
    points = [(c[1], c[2][0]) for c in calls]
    assert points[:8] == [(CONCURRENCY, 1)] * 4 + [(CONCURRENCY, 4)] * 4  # one point at a time
    sat = 10 / (160.0 / 32.0 * 3)  # k = 0 at 4 streams, requests/s
    assert (
        out["rates"] == rate_list(sat, (0.5, 1.0))
        and [p[1] for p in points[8:]] == [out["rates"][0]] * 4 + [out["rates"][1]] * 4
    )
    assert set(out["configs"]["adaptive"]) == {"concurrency@1", "concurrency@4"} | {
        point_key(RATE, r) for r in out["rates"]
    }
    assert len(record["invocations"]) == 16 and out["compared_to_k0"].keys() == {"k4", "adaptive", K0_AA}


def _request(content: str, ttft: float, itl: float, latency: float) -> dict:
    args = {"body": {"messages": [{"role": "user", "content": content}]}}
    return {
        "request_args": json.dumps(args) if content == "O" else args,  # guidellm 0.8 writes a JSON string
        "time_to_first_token_ms": ttft,
        "inter_token_latency_ms": itl,
        "request_latency": latency,
    }


def _mixed_bench(streams: int, grounded_itl: float, open_itl: float, n_grounded: int, n_open: int) -> dict:
    """A point of the mixed set: grounded requests (long prompts: slow TTFT) and open ones (fast TTFT)."""
    reqs = [_request("G", 800.0 + i, grounded_itl, 3.0) for i in range(n_grounded)]
    reqs += [_request("O", 200.0 + i, open_itl, 2.0) for i in range(n_open)]
    bench = _bench({"type_": "concurrent", "streams": streams}, len(reqs), 32, 60.0, ttft=0.0, itl=0.0)
    bench["metrics"]["time_to_first_token_ms"] = _metric([r["time_to_first_token_ms"] for r in reqs])
    bench["metrics"]["inter_token_latency_ms"] = _metric([r["inter_token_latency_ms"] for r in reqs])
    bench["requests"]["successful"] = reqs
    return bench


def test_by_set_splits_a_two_mode_point_and_latency_is_read_per_set():
    """The mixed p50 jumps between the modes with the count of each kind (10 grounded + 9 open: the
    grounded mode; 9 + 10: the open one); per set it does not, and the comparison with k = 0 reads per set."""
    sets = {"G": "grounded", "O": "open"}
    row = parse_benchmark(_mixed_bench(4, 30.0, 60.0, 10, 9), sets)
    assert row["ttft_ms_p50"] >= 800 and row["by_set"]["grounded"]["requests"] == 10
    assert row["by_set"]["open"]["ttft_ms_p50"] == 204.0 and row["by_set"]["grounded"]["itl_ms_p90"] == 30.0
    assert row["by_set"]["open"]["latency_s_p50"] == 2.0
    flipped = parse_benchmark(_mixed_bench(4, 30.0, 60.0, 9, 10), sets)
    assert flipped["ttft_ms_p50"] < 300  # the mixed p50 flipped modes
    results = {
        K0: {
            "concurrency@4": parse_benchmark(_mixed_bench(4, 60.0, 60.0, 10, 9), sets),
            "rate@0.1": {
                **parse_benchmark(_mixed_bench(1, 60.0, 60.0, 9, 10), sets),
                "kind": RATE,
                "value": 0.1,
                "point": "rate@0.1",
            },
        },
        K0_AA: {"concurrency@4": parse_benchmark(_mixed_bench(4, 61.0, 61.0, 10, 9), sets)},
        "adaptive": {
            "concurrency@4": parse_benchmark(_mixed_bench(4, 25.0, 70.0, 9, 10), sets),
            "rate@0.1": {
                **parse_benchmark(_mixed_bench(1, 30.0, 60.0, 10, 9), sets),
                "kind": RATE,
                "value": 0.1,
                "point": "rate@0.1",
            },
        },
    }
    add_ratios(results)
    assert results["adaptive"]["concurrency@4"]["by_set"]["open"]["vs_k0"]["itl_ms_p50"] == round(70 / 60, 4)
    g = compared_to_k0(results, "adaptive", noise_band(results))
    assert g["read_on"] == "by_set" and g["set_noise_band"]["open"]["itl_ms_p50"] == round(61 / 60 - 1, 4)
    at_4 = {(v["set"], v["metric"]) for v in g["latency_outside_band"] if v["point"] == "concurrency@4"}
    assert ("open", "itl_ms_p50") in at_4 and ("open", "itl_ms_p90") in at_4
    assert not any(name == "grounded" and metric.startswith("itl") for name, metric in at_4)  # grounded ITL is better
    assert g["low_rate_set"] == "grounded" and g["low_rate_itl_p50_gain"] == 2.0
    assert "mixed_latency_outside_band" in g and g["mixed_low_rate_itl_p50_gain"] is not None


def test_reparse_rebuilds_a_record_from_its_guidellm_reports(tmp_path):
    from specdec.bench import load
    from specdec.bench.load_plan import chat_rows

    grounded, open_ = (r["messages"][0]["content"] for r in chat_rows()[:2])
    record = {"invocations": [], "datasets": {"prompts": {"rates": [], "configs": {K0: {}, K0_AA: {}, "k4": {}}}}}
    for name, itl in ((K0, 60.0), (K0_AA, 62.0), ("k4", 30.0)):
        bench = _mixed_bench(4, itl, 60.0, 3, 3)
        for req in bench["requests"]["successful"]:
            args = req["request_args"] if isinstance(req["request_args"], dict) else json.loads(req["request_args"])
            content = args["body"]["messages"][0]["content"]
            args["body"]["messages"][0]["content"] = grounded if content == "G" else open_
            req["request_args"] = json.dumps(args)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"metadata": {"guidellm_version": GUIDELLM_VERSION}, "benchmarks": [bench]}))
        record["invocations"].append({"dataset": "prompts", "config": name, "report": str(path)})
    out = load.reparse(record)["datasets"]["prompts"]
    assert out["configs"]["k4"]["concurrency@4"]["by_set"]["grounded"]["vs_k0"]["itl_ms_p50"] == 0.5
    assert out["compared_to_k0"]["k4"]["read_on"] == "by_set" and "reparsed" in record
