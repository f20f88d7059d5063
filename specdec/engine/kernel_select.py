"""At load: pick the linear kernels for this model on this CPU (specdec/models/kernels.py), check the
logits the chosen plan gives against nn.Linear's, and report the choice (log, Info, metrics)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specdec.config import KERNEL_BAND_ROWS, KernelConfig
from specdec.models.cpu_info import cpu_model_and_flags, load_per_core
from specdec.models.kernels import (
    AUTO,
    DEFAULT_KERNEL,
    INPUT_MAJOR,
    KERNELS,
    KernelPlan,
    PlanCache,
    apply_plan,
    available_kernels,
    choose_plan,
    forced_plan,
    linear_shapes,
    run_kernel,
)

log = logging.getLogger("specdec.kernels")
CACHE_SUBDIR = "kernels"


class KernelMismatch(RuntimeError):
    """A kernel's output disagrees with nn.Linear's beyond the tolerance."""


@dataclass
class _Probe:
    """One shape's probe: up to N layers' weights in both layouts and the inputs per row count."""

    weights: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]  # ([out, in], [in, out], bias)
    count: int  # layers of this shape
    inputs: dict[int, torch.Tensor]  # rows -> [1, rows, in]


def _probes(model: nn.Module, cfg: KernelConfig, dtype: torch.dtype) -> list[_Probe]:
    gen = torch.Generator().manual_seed(0)
    probes = []
    for (d_in, _, _), layers in linear_shapes(model).items():
        picked = layers[:: max(1, len(layers) // cfg.probe_instances)][: cfg.probe_instances]
        weights: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = [
            (m.weight.detach(), m.weight.detach().t().contiguous(), m.bias) for m in picked
        ]
        inputs = {rows: torch.randn(1, rows, d_in, generator=gen).to(dtype) for rows in cfg.band_rows}
        probes.append(_Probe(weights, len(layers), inputs))
    return probes


def _check(kernel: str, probe: _Probe, rows: int, atol: float) -> None:
    w, w_t, b = probe.weights[0]
    x = probe.inputs[rows]
    want, got = nn.functional.linear(x, w, b), run_kernel(kernel, x, w, w_t, b)
    scale = max(1.0, float(want.abs().max()))
    if not torch.allclose(got, want, rtol=0, atol=atol * scale):
        raise KernelMismatch(f"{kernel} at {rows} rows differs from nn.Linear by {float((got - want).abs().max()):.3g}")


def measure_fn(probes: list[_Probe]) -> Callable[[int, str], float]:
    """measure(rows, kernel) -> ms: one forward's estimated linear time on that kernel: each shape's
    least per-call time over its probe layers (at least two calls; each call's weights stream from
    memory) x the shape's layer count. The least time, not the mean: on a busy machine a call whose
    thread was preempted says nothing about the kernel."""

    def measure(rows: int, kernel: str) -> float:
        total = 0.0
        for probe in probes:
            x, best = probe.inputs[rows], float("inf")
            for i in range(max(2, len(probe.weights))):
                w, w_t, b = probe.weights[i % len(probe.weights)]
                start = time.perf_counter()
                run_kernel(kernel, x, w, w_t, b)
                best = min(best, time.perf_counter() - start)
            total += best * probe.count
        return total * 1000.0

    return measure


def usable_kernels(probes: list[_Probe], kernels: list[str], band_rows: tuple[int, ...], atol: float) -> list[str]:
    """The kernels whose output matches nn.Linear's on every probe shape and band (also a warm-up)."""
    usable = []
    for kernel in kernels:
        try:
            for rows in band_rows:
                for probe in probes:
                    _check(kernel, probe, rows, atol)
            usable.append(kernel)
        except (KernelMismatch, RuntimeError) as exc:
            log.warning("linear kernel %s left out: %s", kernel, exc)
    return usable or [DEFAULT_KERNEL]


def cache_key_parts(model: nn.Module, dtype: torch.dtype, band_rows: tuple[int, ...]) -> dict[str, Any]:
    """What decides the choice: CPU model and flags, torch version, threads, dtype, bands, shapes."""
    cpu, flags = cpu_model_and_flags()
    shapes = sorted(f"{i}x{o}{'+b' if b else ''}*{len(ls)}" for (i, o, b), ls in linear_shapes(model).items())
    return {
        "cpu": cpu,
        "flags": list(flags),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "dtype": str(dtype),
        "bands": list(band_rows),
        "shapes": shapes,
        "kernels": available_kernels(),
    }


def _measured(model: nn.Module, cfg: KernelConfig, dtype: torch.dtype) -> KernelPlan:
    probes = _probes(model, cfg, dtype)
    kernels = [k for k in available_kernels() if cfg.allow_input_major or KERNELS[k] != INPUT_MAJOR]
    kernels = usable_kernels(probes, kernels, cfg.band_rows, cfg.atol(dtype))
    return choose_plan(cfg.band_rows, kernels, measure_fn(probes), cfg.reps, cfg.budget_s, cfg.layout_slack)


def select_plan(model: nn.Module, cfg: KernelConfig, cache_root: Path | None) -> KernelPlan:
    """The plan for `model`'s linears: forced by cfg.kernel (SPECDEC_LINEAR_KERNEL), else cached for
    this CPU/torch/threads/shapes, else measured now (and cached where the filesystem allows). A
    cached plan measured on a busy machine is measured again when this load finds it quiet."""
    dtype = next(model.parameters()).dtype
    if cfg.kernel != AUTO:
        return forced_plan(cfg.kernel, cfg.band_rows)
    parts = {
        **cache_key_parts(model, dtype, cfg.band_rows),
        "allow_input_major": cfg.allow_input_major,
        "layout_slack": cfg.layout_slack,
    }
    cache = PlanCache(cache_root / CACHE_SUBDIR if cache_root is not None else None)
    key = PlanCache.key(parts)
    plan = cache.load(key)
    busy = load_per_core() >= cfg.busy_load_per_core
    if plan is not None and plan.busy and not busy:
        log.info("the cached kernel plan was measured on a busy machine: measuring again, now quieter")
        plan = None
    if plan is None:
        with torch.inference_mode():
            plan = _measured(model, cfg, dtype)
        plan.busy = busy
        cache.save(key, plan, parts)
    return plan


def logits_agree(before: torch.Tensor, after: torch.Tensor, atol: float) -> tuple[bool, float]:
    """Chosen-kernel logits vs nn.Linear's [..., V]: within atol (scaled by the largest logit beyond
    1) and the same argmax per row, unless the two argmax logits tie within atol. -> (ok, max diff)."""
    finite = torch.isfinite(before)  # a restricted draft head leaves -inf outside its tokens
    if not torch.equal(finite, torch.isfinite(after)):
        return False, float("inf")
    before, after = before.masked_fill(~finite, torch.finfo(before.dtype).min), after.masked_fill(~finite, 0.0)
    diff = float((after - before)[finite].abs().max())
    tol = atol * max(1.0, float(before[finite].abs().max()))
    after = after.masked_fill(~finite, torch.finfo(after.dtype).min)
    a, b = before.argmax(-1), after.argmax(-1)
    gap = (before.gather(-1, a.unsqueeze(-1)) - before.gather(-1, b.unsqueeze(-1))).abs()
    return bool(diff <= tol and bool((gap <= tol).all())), diff


def plan_model(
    model: nn.Module, root: nn.Module, cfg: KernelConfig, cache_root: Path | None, probe_ids: torch.Tensor | None
) -> KernelPlan:
    """Choose and apply the plan to `root`'s linears (the part of `model` it owns). With probe_ids
    [1, T] (a causal LM), check the model's logits before and after; if they disagree, fall back to
    nn.Linear everywhere."""
    plan = select_plan(root, cfg, cache_root)
    if set(plan.kernels) == {DEFAULT_KERNEL}:
        return plan
    before = _logits(model, probe_ids)
    replaced, extra = apply_plan(root, plan)
    after = _logits(model, probe_ids)
    if before is not None and after is not None:
        ok, diff = logits_agree(before, after, cfg.atol(next(root.parameters()).dtype))
        if not ok:
            log.warning("kernel plan %s: logits differ by %.3g from nn.Linear's; using nn.Linear", plan.kernels, diff)
            restore_linears(root)
            return KernelPlan(plan.band_rows, (DEFAULT_KERNEL,) * len(plan.band_rows), plan.timings_ms, "fallback")
    log.info("%d linear layers planned (+%d bytes of weight copies)", replaced, extra)
    return plan


def _logits(model: nn.Module, ids: torch.Tensor | None) -> torch.Tensor | None:
    if ids is None:
        return None
    with torch.inference_mode():
        return model(input_ids=ids, use_cache=False).logits.float()


def restore_linears(root: nn.Module) -> None:
    """Undo apply_plan: every PlannedLinear back to an nn.Linear with the [out, in] weight."""
    from specdec.models.kernels import PlannedLinear

    for parent in list(root.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, PlannedLinear):
                linear = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None, device="meta")
                linear.weight = (
                    child.weight_std
                    if child.weight_std is not None
                    else nn.Parameter(child.weight.contiguous(), requires_grad=False)
                )
                linear.bias = child.bias
                setattr(parent, name, linear)


def default_plan() -> KernelPlan:
    """nn.Linear everywhere (off CPU, or not float32/bfloat16)."""
    return KernelPlan(KERNEL_BAND_ROWS, (DEFAULT_KERNEL,) * len(KERNEL_BAND_ROWS), {}, "default")
