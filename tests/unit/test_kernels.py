"""CPU linear kernels chosen by measurement at load: the chooser, the cache, the override, the module."""

from __future__ import annotations

import pytest
import torch
from prometheus_client import generate_latest
from torch import nn

from specdec.config import KernelConfig
from specdec.engine import kernel_select
from specdec.engine.kernel_select import logits_agree, plan_model, select_plan
from specdec.metrics import model_service_registry
from specdec.models.kernels import (
    KERNELS,
    KernelPlan,
    PlanCache,
    PlannedLinear,
    apply_plan,
    available_kernels,
    band_labels,
    choose_plan,
    forced_plan,
    pick_fastest,
)
from tests.tiny_llama import tiny_llama

BANDS = (1, 5, 17, 32)


def test_band_labels_name_each_row_range():
    assert band_labels(BANDS) == ["1", "2-5", "6-17", "18+"]


def test_the_chooser_picks_the_fastest_kernel_per_band_from_fake_timings():
    fake = {  # (rows, kernel) -> ms; a different winner in every band, all of one layout per band pair
        1: {"linear": 3.0, "onednn": 4.0, "im_mkl": 2.0, "im_onednn": 2.5},
        5: {"linear": 9.0, "onednn": 5.0, "im_mkl": 8.0, "im_onednn": 4.0},
        17: {"linear": 20.0, "onednn": 7.0, "im_mkl": 19.0, "im_onednn": 6.0},
        32: {"linear": 30.0, "onednn": 9.0, "im_mkl": 31.0, "im_onednn": 12.0},
    }
    calls = []

    def measure(rows: int, kernel: str) -> float:
        calls.append((rows, kernel))
        return fake[rows][kernel] + (0.5 if len(calls) <= 16 else 0.0)  # the first round is slower

    plan = choose_plan(BANDS, list(KERNELS), measure, reps=3, budget_s=60.0)
    assert plan.kernels == ("im_mkl", "im_onednn", "im_onednn", "onednn")
    assert len(calls) == 3 * 16 and plan.source == "measured"
    assert plan.timings_ms["18+"]["onednn"] == 9.0  # the least time of the rounds
    assert [plan.kernel_for(r) for r in (1, 2, 5, 6, 17, 18, 512)] == [
        "im_mkl",
        "im_onednn",
        "im_onednn",
        "im_onednn",
        "im_onednn",
        "onednn",
        "onednn",
    ]


def test_one_layout_is_kept_when_mixing_layouts_buys_less_than_the_slack():
    times = {
        "1": {"linear": 2.1, "im_mkl": 2.0},
        "2-5": {"onednn": 4.0, "im_onednn": 6.0},
        "6-17": {"onednn": 6.0, "im_onednn": 9.0},
        "18+": {"onednn": 9.0, "im_onednn": 14.0},
    }
    assert pick_fastest(BANDS, times, layout_slack=0.0) == ("im_mkl", "onednn", "onednn", "onednn")
    assert pick_fastest(BANDS, times, layout_slack=0.1) == ("linear", "onednn", "onednn", "onednn")
    times["1"]["linear"] = 4.0  # now mixing pays: keep both
    assert pick_fastest(BANDS, times, layout_slack=0.1) == ("im_mkl", "onednn", "onednn", "onednn")


def test_the_budget_stops_after_one_full_round():
    ticks = iter(range(1000))
    plan = choose_plan(
        BANDS,
        ["linear", "onednn"],
        lambda r, k: 1.0 if k == "onednn" else 2.0,
        reps=5,
        budget_s=0.5,
        clock=lambda: float(next(ticks)),
    )
    assert plan.kernels == ("onednn",) * 4 and all(len(t) == 2 for t in plan.timings_ms.values())


def test_the_cache_round_trips_and_a_read_only_directory_is_no_error(tmp_path):
    plan = KernelPlan(BANDS, ("im_mkl", "linear", "linear", "linear"), {"1": {"im_mkl": 1.0}}, "measured")
    cache = PlanCache(tmp_path / "kernels")
    key = PlanCache.key({"cpu": "x", "shapes": ["32x32*4"]})
    assert cache.load(key) is None
    assert cache.save(key, plan, {"cpu": "x"})
    back = cache.load(key)
    assert back.kernels == plan.kernels and back.timings_ms == plan.timings_ms and back.source == "cache"
    assert PlanCache.key({"cpu": "y", "shapes": ["32x32*4"]}) != key
    blocked = tmp_path / "a-file"  # mkdir under a file fails as on a read-only root, even as root
    blocked.write_text("")
    assert not PlanCache(blocked / "kernels").save(key, plan, {})
    assert PlanCache(blocked / "kernels").load(key) is None
    assert not PlanCache(None).save(key, plan, {}) and PlanCache(None).load(key) is None


def test_a_restart_reads_the_cached_choice_instead_of_measuring(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_select, "load_per_core", lambda: 0.0)
    model, cfg = tiny_llama(), KernelConfig(kernel="auto", budget_s=0.5, reps=1)
    first = select_plan(model, cfg, tmp_path)
    assert first.source == "measured" and set(first.kernels) <= set(available_kernels())
    monkeypatch.setattr(kernel_select, "_measured", lambda *a: pytest.fail("measured again"))
    second = select_plan(model, cfg, tmp_path)
    assert second.source == "cache" and second.kernels == first.kernels


def test_a_plan_measured_busy_is_measured_again_once_the_machine_is_quiet(tmp_path, monkeypatch):
    """Load 3 per core at the first start: measured and cached as busy; busy again: the cache serves;
    quiet: measured again and cached as quiet; busy after that: the quiet plan is kept."""
    model, cfg = tiny_llama(), KernelConfig(kernel="auto", budget_s=0.5, reps=1)
    measured = []

    def measure(*args):
        measured.append(load)
        return KernelPlan(BANDS, ("linear",) * len(BANDS), {}, "measured")

    monkeypatch.setattr(kernel_select, "_measured", measure)
    monkeypatch.setattr(kernel_select, "load_per_core", lambda: load)
    sources = []
    for load in (3.0, 3.0, 0.2, 3.0):  # noqa: B007 - read by the patched load_per_core
        plan = select_plan(model, cfg, tmp_path)
        sources.append((plan.source, plan.busy))
    assert sources == [("measured", True), ("cache", True), ("measured", False), ("cache", False)]
    assert measured == [3.0, 0.2]


def test_the_environment_forces_a_choice_without_measuring(monkeypatch, tmp_path):
    monkeypatch.setattr(kernel_select, "_measured", lambda *a: pytest.fail("measured"))
    monkeypatch.setenv("SPECDEC_LINEAR_KERNEL", "im_mkl")
    plan = select_plan(tiny_llama(), KernelConfig(), tmp_path)
    assert plan.kernels == ("im_mkl",) * 4 and plan.source == "env"
    monkeypatch.setenv("SPECDEC_LINEAR_KERNEL", "im_mkl,linear,linear,linear")
    assert select_plan(tiny_llama(), KernelConfig(), tmp_path).kernels == ("im_mkl", "linear", "linear", "linear")
    with pytest.raises(ValueError, match="one of"):
        forced_plan("fastest", BANDS)
    with pytest.raises(ValueError, match="4 of them"):
        forced_plan("linear,onednn", BANDS)


@pytest.mark.parametrize("kernel", available_kernels())
def test_every_kernel_gives_nn_linear_s_output_at_every_band(kernel):
    gen = torch.Generator().manual_seed(4)
    linear = nn.Linear(48, 40, bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(40, 48, generator=gen))
        linear.bias.copy_(torch.randn(40, generator=gen))
    planned = PlannedLinear(linear, forced_plan(kernel, BANDS))
    assert planned.weight.shape == (40, 48)
    for rows in (1, 2, 5, 17, 40):
        x = torch.randn(1, rows, 48, generator=gen)
        with torch.inference_mode():
            assert torch.allclose(planned(x), linear(x), rtol=1e-5, atol=1e-4), rows


def test_a_mixed_plan_keeps_the_model_s_logits_and_counts_the_second_copy():
    standard, planned = tiny_llama(), tiny_llama()
    plan = KernelPlan(
        BANDS, ("im_mkl", "onednn" if "onednn" in available_kernels() else "linear", "linear", "linear"), {}, "env"
    )
    replaced, extra = apply_plan(planned, plan)
    assert replaced == 2 * 7 + 1
    assert extra == (2 * (32 * 32 * 2 + 32 * 16 * 2 + 32 * 64 * 3) + 96 * 32) * 4  # every weight twice
    assert planned.lm_head.weight_std is planned.model.embed_tokens.weight  # still tied
    ids = torch.tensor([[5, 9, 11, 3, 70, 2, 8]])
    with torch.inference_mode():
        for cut in (1, 5, 7):
            want, got = standard(input_ids=ids[:, :cut]).logits, planned(input_ids=ids[:, :cut]).logits
            assert logits_agree(want, got, 2e-4)[0]


def test_the_load_check_falls_back_to_nn_linear_when_logits_disagree(tmp_path, monkeypatch):
    model = tiny_llama()
    monkeypatch.setenv("SPECDEC_LINEAR_KERNEL", "im_mkl")
    monkeypatch.setattr(kernel_select, "logits_agree", lambda *a: (False, 1.0))
    plan = plan_model(model, model, KernelConfig(), tmp_path, torch.tensor([[1, 2, 3]]))
    assert plan.source == "fallback" and plan.kernels == ("linear",) * 4
    assert not any(isinstance(m, PlannedLinear) for m in model.modules())


def test_logits_agree_needs_the_same_argmax_and_allows_ties():
    before = torch.tensor([[1.0, 3.0, 2.0, float("-inf")]])
    assert logits_agree(before, before + 1e-5, 2e-4)[0]
    assert not logits_agree(before, torch.tensor([[1.0, 3.0, 3.1, float("-inf")]]), 2e-4)[0]
    assert logits_agree(torch.tensor([[3.0, 3.0]]), torch.tensor([[3.0, 3.0001]]), 2e-4)[0]
    assert not logits_agree(before, torch.tensor([[1.0, 3.0, 2.0, 0.0]]), 2e-4)[0]


def test_metrics_name_each_band_s_kernel_and_its_timings():
    from specdec.engine.worker import WorkerState

    plan = KernelPlan(BANDS, ("im_mkl", "onednn", "onednn", "linear"), {"1": {"im_mkl": 1.5, "linear": 2.0}}, "cache")
    text = generate_latest(model_service_registry("target", WorkerState, lambda: None, lambda: plan)).decode()
    assert 'specdec_linear_kernel_info{band="1",kernel="im_mkl",role="target",source="cache"} 1.0' in text
    assert 'specdec_linear_kernel_probe_ms{band="1",kernel="linear",role="target"} 2.0' in text


def test_info_metadata_names_each_band_s_kernel_and_its_source():
    from specdec.server.model_service import KERNEL_METADATA_KEY, KERNEL_SOURCE_KEY, kernel_metadata

    plan = KernelPlan(BANDS, ("im_mkl", "onednn", "onednn", "linear"), {}, "measured")
    assert dict(kernel_metadata(plan)) == {
        KERNEL_METADATA_KEY: "1=im_mkl,2-5=onednn,6-17=onednn,18+=linear",
        KERNEL_SOURCE_KEY: "measured",
    }
    assert kernel_metadata(None) == ()
