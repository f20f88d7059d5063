"""Linear kernels and weight layouts chosen by measurement at load, per row-count band.

Which kernel runs a linear layer fastest depends on the CPU: input-major ([in, out]) weights on oneDNN
beat nn.Linear on an AMD EPYC with AVX-512 and lose to it on an Intel Xeon with AMX. So a model service times the
candidates below on this model's own linear shapes, on this machine, with its thread count, for a
few row counts (a decode step: 1 row; a verify pass: k + 1 rows; batched verifies and prefill
chunks: more) and runs each band on its fastest kernel.

Candidates (`KERNELS`), each one weight layout and one GEMM library:
  linear      nn.Linear's own call: [out, in] weights, x @ W^T on MKL
  onednn      the same [out, in] weights on oneDNN (torch.ops.mkldnn._linear_pointwise)
  im_mkl      input-major [in, out] weights, x @ W_t on MKL
  im_onednn   input-major weights on oneDNN (their [out, in] view)
A plan needing both layouts keeps both copies (reported as extra bytes at load).

The timing (`measure_kernel`) calls every distinct shape once per repetition, cycling over up to
`probe_instances` layers of that shape so the weights stream from memory as in a forward, and scales
by how many layers have the shape: an estimate of one forward's linear time. Every kernel's output
is compared with nn.Linear's on the probe rows first; one that disagrees is never chosen. The choice
is cached (`PlanCache`) by CPU model + flags, torch version, threads, dtype, bands and the model's
shapes, and SPECDEC_LINEAR_KERNEL forces one (a name, or one name per band).
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

log = logging.getLogger("specdec.kernels")

STANDARD, INPUT_MAJOR = "standard", "input-major"
KERNELS = {"linear": STANDARD, "onednn": STANDARD, "im_mkl": INPUT_MAJOR, "im_onednn": INPUT_MAJOR}
DEFAULT_KERNEL = "linear"
AUTO = "auto"
ONEDNN_KERNELS = ("onednn", "im_onednn")


def run_kernel(
    kernel: str, x: torch.Tensor, w: torch.Tensor | None, w_t: torch.Tensor | None, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [..., in] -> [..., out] with `kernel`: w is the [out, in] weight, w_t the [in, out] copy."""
    if kernel == "linear" or kernel == "onednn":
        assert w is not None, "a standard kernel reads the [out, in] weight"
        return (
            F.linear(x, w, bias)
            if kernel == "linear"
            else torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")
        )
    assert w_t is not None, "an input-major kernel reads the [in, out] copy"
    if kernel == "im_onednn":
        return torch.ops.mkldnn._linear_pointwise(x, w_t.t(), bias, "none", [], "")
    y = torch.matmul(x, w_t)
    return y if bias is None else y + bias


def available_kernels() -> list[str]:
    """The candidates this torch build can run (the oneDNN ones need torch's mkldnn linear op)."""
    has_onednn = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    return [k for k in KERNELS if has_onednn or k not in ONEDNN_KERNELS]


def band_labels(band_rows: Sequence[int]) -> list[str]:
    """Human names of the bands whose upper row counts are `band_rows` (the last one is open-ended)."""
    labels, low = [], 1
    for i, high in enumerate(band_rows):
        last = i == len(band_rows) - 1
        labels.append(f"{low}+" if last and low < high else (str(high) if low == high else f"{low}-{high}"))
        low = high + 1
    return labels


@dataclass
class KernelPlan:
    """Which kernel runs each row-count band: `kernels[i]` runs calls of up to `band_rows[i]` rows
    (the last band also every larger call). `timings_ms[label][kernel]`: the estimated linear time of
    one forward at the band's row count; `source`: measured | cache | env | default; `busy`: measured
    while the machine was busy (KernelConfig.busy_load_per_core), so measured again once it is not."""

    band_rows: tuple[int, ...]
    kernels: tuple[str, ...]
    timings_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    source: str = "measured"
    seconds: float = 0.0
    busy: bool = False

    def kernel_for(self, rows: int) -> str:
        """The kernel of the band `rows` falls in."""
        for high, kernel in zip(self.band_rows, self.kernels, strict=False):
            if rows <= high:
                return kernel
        return self.kernels[-1]

    def layouts(self) -> set[str]:
        """The weight layouts the plan's kernels read."""
        return {KERNELS[k] for k in self.kernels}

    def by_band(self) -> dict[str, str]:
        """band label -> kernel."""
        return dict(zip(band_labels(self.band_rows), self.kernels, strict=False))

    def describe(self) -> str:
        """One line for logs: each band's kernel, and its timings when measured."""
        parts = []
        for label, kernel in self.by_band().items():
            times = self.timings_ms.get(label, {})
            shown = " ".join(f"{k}={ms:.2f}" for k, ms in sorted(times.items(), key=lambda kv: kv[1]))
            parts.append(f"{label} rows: {kernel}" + (f" ({shown} ms)" if shown else ""))
        return f"[{self.source}{', on a busy machine' if self.busy else ''}] " + "; ".join(parts)


def pick_fastest(
    band_rows: Sequence[int], timings_ms: dict[str, dict[str, float]], layout_slack: float = 0.0
) -> tuple[str, ...]:
    """Per band, the kernel with the least time (DEFAULT_KERNEL where a band has no timing).

    Where the per-band winners need both weight layouts (two copies of every weight), one layout's
    own per-band winners are taken instead when they cost at most `layout_slack` more, each band's
    time relative to its winner's, averaged over the bands."""
    labels = band_labels(band_rows)
    times = [timings_ms.get(label) or {DEFAULT_KERNEL: 1.0} for label in labels]
    fastest = tuple(min(t, key=t.__getitem__) for t in times)
    if len({KERNELS[k] for k in fastest}) == 1:
        return fastest
    best_single, best_cost = fastest, float("inf")
    for layout in (STANDARD, INPUT_MAJOR):
        found = [min((k for k in t if KERNELS[k] == layout), key=t.__getitem__, default=None) for t in times]
        picks = [k for k in found if k is not None]
        if len(picks) < len(found):  # a band without a timing of this layout
            continue
        cost = sum(t[k] / t[f] for t, k, f in zip(times, picks, fastest, strict=False)) / len(times)
        if cost < best_cost:
            best_single, best_cost = tuple(picks), cost
    return best_single if best_cost <= 1.0 + layout_slack else fastest


def choose_plan(
    band_rows: Sequence[int],
    kernels: Sequence[str],
    measure: Callable[[int, str], float],
    reps: int,
    budget_s: float,
    layout_slack: float = 0.0,
    clock: Callable[[], float] = time.perf_counter,
) -> KernelPlan:
    """Time `measure(rows, kernel)` (ms) for every band and kernel, `reps` rounds or until `budget_s`
    is spent (at least one full round), keeping each pair's least time; pick the fastest per band
    (one layout when that costs at most `layout_slack` more: `pick_fastest`).
    Rounds interleave the kernels so a busy machine slows them alike."""
    start, labels = clock(), band_labels(band_rows)
    best: dict[str, dict[str, float]] = {label: {} for label in labels}
    for rep in range(max(1, reps)):
        if rep and clock() - start > budget_s:
            break
        for label, rows in zip(labels, band_rows, strict=False):
            for kernel in kernels:
                ms = measure(rows, kernel)
                best[label][kernel] = min(ms, best[label].get(kernel, float("inf")))
    kernels_by_band = pick_fastest(band_rows, best, layout_slack)
    return KernelPlan(tuple(band_rows), kernels_by_band, best, "measured", clock() - start)


def forced_plan(spec: str, band_rows: Sequence[int]) -> KernelPlan:
    """SPECDEC_LINEAR_KERNEL: one kernel name for every band, or a comma list, one per band."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if len(names) == 1:
        names = names * len(band_rows)
    unknown = [n for n in names if n not in KERNELS]
    if unknown or len(names) != len(band_rows):
        raise ValueError(
            f"linear kernel {spec!r}: give auto, one of {sorted(KERNELS)}, or "
            f"{len(band_rows)} of them comma-separated (bands {band_labels(band_rows)})"
        )
    missing = [n for n in names if n not in available_kernels()]
    if missing:
        raise ValueError(f"linear kernel(s) {missing} are not available in this torch build")
    return KernelPlan(tuple(band_rows), tuple(names), {}, "env")


def plain_linears(root: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute name, layer) of every plain nn.Linear under `root` (not a subclass, not one
    already replaced), listed before any is replaced: what the layer-swapping loops walk."""
    return [
        (parent, name, child)
        for parent in list(root.modules())
        for name, child in list(parent.named_children())
        if type(child) is nn.Linear
    ]


def linear_shapes(model: nn.Module) -> dict[tuple[int, int, bool], list[nn.Linear]]:
    """The model's plain nn.Linear layers grouped by (in, out, has bias), in model order."""
    groups: dict[tuple[int, int, bool], list[nn.Linear]] = {}
    seen: set[int] = set()
    for module in model.modules():
        if type(module) is nn.Linear and id(module) not in seen:
            seen.add(id(module))
            groups.setdefault((module.in_features, module.out_features, module.bias is not None), []).append(module)
    return groups


class PlanCache:
    """Kernel plans on disk, one JSON file per key under `<cache root>/kernels/`. A read-only or
    missing directory is no error: the plan is then measured at every load."""

    def __init__(self, root: Path | None) -> None:
        self.root = root

    @staticmethod
    def key(parts: dict) -> str:
        """A short stable hash of what decides the choice (CPU, torch, threads, dtype, shapes, bands)."""
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]

    def _path(self, key: str) -> Path | None:
        return None if self.root is None else self.root / f"{key}.json"

    def load(self, key: str) -> KernelPlan | None:
        """The cached plan for `key`, or None (absent, unreadable or malformed)."""
        path = self._path(key)
        try:
            raw = json.loads(path.read_text()) if path is not None else None
            if raw is None:
                return None
            plan = KernelPlan(
                tuple(raw["band_rows"]),
                tuple(raw["kernels"]),
                raw.get("timings_ms", {}),
                "cache",
                busy=bool(raw.get("busy", False)),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return plan if set(plan.kernels) <= set(available_kernels()) else None

    def save(self, key: str, plan: KernelPlan, parts: dict) -> bool:
        """Write the plan (atomically); False where the filesystem refuses (read-only root)."""
        path = self._path(key)
        if path is None:
            return False
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{id(plan)}")
            tmp.write_text(json.dumps({**asdict(plan), "source": "measured", "key_parts": parts}, indent=1))
            tmp.replace(path)
        except OSError as exc:
            log.info("kernel choice not cached (%s): it is measured again at the next load", exc)
            return False
        return True


class PlannedLinear(nn.Module):
    """A drop-in for an inference-only nn.Linear that runs each call on its band's kernel.

    Keeps the [out, in] weight (the same Parameter: a tied embedding stays tied) where a standard
    kernel is planned, and an [in, out] copy where an input-major one is. `weight` always reads as
    [out, in] (what get_output_embeddings() callers read the vocabulary width from).
    """

    def __init__(self, linear: nn.Linear, plan: KernelPlan) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        layouts = plan.layouts()
        self.weight_std = linear.weight if STANDARD in layouts else None
        self.weight_t = (
            nn.Parameter(linear.weight.detach().t().contiguous(), requires_grad=False)
            if INPUT_MAJOR in layouts
            else None
        )  # [in, out]
        self.bias = linear.bias
        self.bands = [(high, kernel) for high, kernel in zip(plan.band_rows, plan.kernels, strict=False)]
        self.bands[-1] = (sys.maxsize, self.bands[-1][1])

    @property
    def weight(self) -> torch.Tensor:  # [out, in]
        if self.weight_std is not None:
            return self.weight_std
        assert self.weight_t is not None, "a plan keeps one layout at least"
        return self.weight_t.t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        rows = x.numel() // self.in_features
        for high, kernel in self.bands:
            if rows <= high:
                return run_kernel(kernel, x, self.weight_std, self.weight_t, self.bias)
        raise AssertionError("the last band is open-ended")


def apply_plan(model: nn.Module, plan: KernelPlan) -> tuple[int, int]:
    """Replace every plain nn.Linear under `model` by a PlannedLinear (nothing when the plan is
    nn.Linear everywhere). Returns (layers replaced, extra weight bytes the plan's copies take)."""
    if set(plan.kernels) == {"linear"}:
        return 0, 0
    replaced, extra = 0, 0
    for parent, name, child in plain_linears(model):
        planned = PlannedLinear(child, plan)
        if planned.weight_t is not None and (planned.weight_std is not None or _tied(model, child)):
            extra += planned.weight_t.numel() * planned.weight_t.element_size()
        setattr(parent, name, planned)
        replaced += 1
    return replaced, extra


def _tied(model: nn.Module, linear: nn.Linear) -> bool:
    """Whether the linear's weight is also reachable under another name (a tied embedding)."""
    names = [n for n, p in model.named_parameters(remove_duplicate=False) if p is linear.weight]
    return len(names) > 1
