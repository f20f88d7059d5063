"""specdec.bench.report: the arithmetic of the bench on synthetic runs (no models, no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdec.bench import report, report_plot, report_table
from specdec.bench.identity import first_divergence
from specdec.bench.plan import Config, Prompt, RunRecord, make_configs

VERIFY = {
    "context_tokens": 300,
    "reps": 1,
    "threads": 1,
    "ms": {"1": 40.0, "2": 50.0, "3": 60.0, "4": 64.0, "5": 68.0},
    "ratio": {"1": 1.0, "2": 1.25, "3": 1.5, "4": 1.6, "5": 1.7},
    "spread_ms": {},
    "kv_bytes_per_token_measured": 46080.0,
}


def _rounds(k: int, accepted: list[int]) -> list[dict]:
    return [
        {"k": k, "drafted": k, "accepted": a, "draft_ms": 0.0, "target_ms": 40.0 * (1 + 0.1 * k), "overhead_ms": 2.0}
        for a in accepted
    ]


def _stats(k: int, accepted: list[int]) -> dict:
    return {
        "accepted_per_position": [sum(a > i for a in accepted) for i in range(k)],
        "drafted_per_position": [len(accepted)] * k,
    }


def _records() -> list[RunRecord]:
    recs = []
    for rep in range(3):
        jitter = 1.0 + 0.01 * rep
        # k = 0: 12 tokens, one per round, 50 ms each
        recs.append(
            RunRecord(
                "grounded",
                "p1",
                "k0",
                rep,
                list(range(12)),
                0.6 * jitter,
                [(0.05 * (i + 1) * jitter, 1) for i in range(12)],
                _stats(0, []),
                _rounds(0, [0] * 12),
                {"session_tokens": 100, "redis_bytes": 900},
            )
        )
        # k = 4: 3 rounds of 4 accepted (+1 bonus) = 15 tokens, cut to 12 by the length limit
        recs.append(
            RunRecord(
                "grounded",
                "p1",
                "k4",
                rep,
                list(range(12)),
                0.2 * jitter,
                [(0.06, 5), (0.12, 5), (0.2, 2)],
                _stats(4, [4, 4, 4]),
                _rounds(4, [4, 4, 4]),
                {"session_tokens": 100, "redis_bytes": 900},
            )
        )
        recs.append(
            RunRecord("grounded", "p1", "hf_assisted", rep, list(range(12)), 0.3 * jitter, [(0.1, 1), (0.3, 11)])
        )
    return recs


def test_build_ratios_bound_and_memory(tmp_path: Path) -> None:
    configs = [Config("k0", "stack", 0), Config("k4", "stack", 4), Config("hf_assisted", "hf", assisted=True)]
    prompts = [Prompt("grounded", "p1", "text", [1, 2, 3])]
    settings = {
        "draft_kind": "ngram",
        "configs": {c.name: c.label(4) for c in configs},
        "server_default_k": 4,
        "prompts": {"grounded": ["p1"]},
        "target_model_id": "t",
        "dtype": "float32",
        "max_new_tokens": 12,
        "repeats": 3,
        "threads": {"target_service": 1},
    }
    machine = {"cpu_model": "cpu", "cores": 2, "usable_cores": 2, "torch": "x", "transformers": "y"}
    result = report.build(
        _records(),
        configs,
        prompts,
        settings=settings,
        machine=machine,
        hf_settings={"draft_kind": "ngram"},
        verify=VERIFY,
        draft_step_cost=None,
        identity={"grounded": {}},
        rss={"target": {"bytes": 1, "source": "VmHWM"}},
        kv_per_token_model={"target": 46080},
        default_k=4,
    )
    g = result["grounded"]
    assert g["speedup"]["k4"]["median"] == pytest.approx(3.0)
    assert g["speedup"]["k4"]["n"] == 3
    assert g["vs_hf"]["k4"]["median"] == pytest.approx(1.5)
    assert g["mean_accepted_length"]["k4"] == pytest.approx(5.0)
    assert g["acceptance_rate"]["k4"] == pytest.approx(1.0)
    assert g["per_position_acceptance"]["k4"] == [1.0, 1.0, 1.0, 1.0]
    assert g["target_passes_per_token"]["k4"] == pytest.approx(3 / 12)
    assert g["bound"]["k4"] == pytest.approx(5.0 / 1.7)  # c = 0 for the n-gram draft
    assert g["overhead_ms_p50"]["k4"]["median"] == pytest.approx(2.0)
    # ITL: chunks of 5, 5, 2 tokens 60 and 80 ms apart -> gaps of 12 ms (x5) and 40 ms (x2)
    assert g["itl_ms_p50"]["k4"]["median"] == pytest.approx(12.0, abs=0.2)
    assert g["memory"]["target_kv_bytes_per_session"] == 46080 * 99
    assert g["memory"]["redis_bytes_per_session"] == 900
    text = report_table.table(result)
    assert "== grounded" in text and "ours k=4" in text
    png = tmp_path / "p.png"
    report_plot.plot(result, png)
    assert png.stat().st_size > 10_000


def test_helpers() -> None:
    assert report.pct([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert report.pct([], 50) is None
    assert report.spread([2.0, None, 1.0, 3.0])["median"] == 2.0
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    names = [c.name for c in make_configs([2, 4])]
    assert names == ["k0", "k2", "k4", "kdefault", "hf_target", "hf_assisted"]


def test_every_result_names_the_cpu_and_the_features_that_decide_kernels():
    from specdec.bench.machine import machine_info
    from specdec.bench.report import cpu_features

    m = machine_info()
    assert m["cpu_model"] and isinstance(m["cpu_flags"], list)
    assert m["avx512"] == ("avx512f" in m["cpu_flags"]) and m["amx"] == ("amx_tile" in m["cpu_flags"])
    assert cpu_features({"avx512": True, "amx": False, "bf16": True}) == " (AVX-512, no AMX, bf16)"
    assert cpu_features({"cpu_model": "old result"}) == ""


def test_the_llamacpp_column_is_skipped_with_a_note_or_set_beside_ours(monkeypatch):
    import builtins

    from specdec.bench.llamacpp import anchor_lines
    from tests.unit.test_llamacpp_anchor import llamacpp_anchor

    real_import = builtins.__import__
    monkeypatch.setattr(
        builtins,
        "__import__",
        lambda name, *a, **k: (
            (_ for _ in ()).throw(ImportError(name)) if name == "llama_cpp" else real_import(name, *a, **k)
        ),
    )
    skipped = llamacpp_anchor("embedded", [], 8, 1, 2)
    assert "not installed" in skipped["skipped"] and "make install" in skipped["skipped"]
    assert "skipped" in anchor_lines({"llamacpp": skipped})[1]
    result = {
        "llamacpp": {"version": "0.3", "gguf": "x.gguf", "threads": 2, "tok_s": {"grounded": 40.0}},
        "grounded": {
            "tokens_per_s": {"k0": {"median": 30.0}, "adaptive": {"median": 50.0}, "hf_target": {"median": 99.0}}
        },
    }
    assert anchor_lines(result)[2] == "  grounded: 40.0 tok/s; ours k = 0 30.0 (0.75x), best adaptive 50.0 (1.25x)"
