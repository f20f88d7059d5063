"""Weight layout and kernel for the CPU forward: linear layers stored input-major ([in, out]) in float32.

Model services time this layout against nn.Linear and oneDNN at load and keep the fastest per row-count
band (specdec/models/kernels.py): it wins on some CPUs and loses on others. What stays here: the
restricted-head helpers (`head_logits`, `input_major_head`) a draft's plan uses, and `InputMajorLinear`
behind `input_major()` of the drafts (their own layers and restricted head; the target's embedding and LM
head they share are left alone).

`nn.Linear` keeps W as [out, in] and computes x @ W^T. For the few rows a decode step or a verify pass runs
(M = 1 .. k+1), MKL's fp32 kernels can stream an [in, out] matrix much faster than an [out, in] one, with
bit-identical logits. In bfloat16 the standard layout is faster (oneDNN), so only float32 on CPU is changed.
A tied LM head (SmolLM2 ties it to the token embedding) gets its own transposed copy: vocab x hidden more
weight memory, reported at load.

Kernel. MKL's fp32 GEMM costs about M times its one-row cost for a few rows (it streams the weights once
per row); oneDNN, reading the SAME [in, out] tensor (passed as its [out, in] view), streams them once for
all rows. So oneDNN runs every call of two rows or more, and one row too when torch runs more than one
thread; MKL keeps the one-row call on one thread, where it is a little faster. Where oneDNN is missing the
MKL path runs everywhere.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from specdec.models.kernels import plain_linears

# Rows (tokens) at or above which an input-major linear runs on oneDNN rather than MKL
# (one thread; with more threads oneDNN runs every call): see the module docstring.
ONEDNN_MIN_ROWS = 2


class InputMajorLinear(nn.Module):
    """A drop-in for an inference-only `nn.Linear` whose weight is stored as [in, out].

    `weight` stays readable as the usual [out, in] view (what `get_output_embeddings()`
    callers read the vocabulary width from).
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight_t = nn.Parameter(linear.weight.detach().t().contiguous(), requires_grad=False)  # [in, out]
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    @property
    def weight(self) -> torch.Tensor:  # [out, in], a view
        return self.weight_t.t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if use_onednn(x.numel() // self.in_features):
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        y = torch.matmul(x, self.weight_t)
        return y if self.bias is None else y + self.bias


def use_onednn(rows: int) -> bool:
    """Whether a float32 input-major linear over `rows` rows runs on oneDNN (the module docstring's rule)."""
    if rows >= ONEDNN_MIN_ROWS or (rows == 1 and torch.get_num_threads() > 1):
        return onednn_available()
    return False


@functools.cache
def onednn_available() -> bool:
    """torch's oneDNN linear kernel exists here and agrees with matmul on a small probe."""
    op = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
    if op is None or not torch.backends.mkldnn.is_available():
        return False
    gen = torch.Generator().manual_seed(0)
    x, w_t = torch.randn(3, 16, generator=gen), torch.randn(16, 8, generator=gen)
    try:
        y = op(x, w_t.t(), None, "none", [], "")
    except RuntimeError:
        return False
    return bool(torch.allclose(y, x @ w_t, rtol=1e-4, atol=1e-5))


def wants_input_major(device: torch.device, dtype: torch.dtype) -> bool:
    """Where the input-major layout is faster: float32 on CPU."""
    return device.type == "cpu" and dtype == torch.float32


def use_input_major_linears(model: nn.Module) -> tuple[int, int]:
    """Replace every plain `nn.Linear` of `model` (inference only) by an InputMajorLinear.

    Returns (layers replaced, extra bytes: tied weights that now exist twice).
    """
    shared = _shared_weights(model)
    replaced, extra = 0, 0
    for parent, name, child in plain_linears(model):
        if id(child.weight) in shared:
            extra += child.weight.numel() * child.weight.element_size()
        setattr(parent, name, InputMajorLinear(child))
        replaced += 1
    return replaced, extra


def _shared_weights(model: nn.Module) -> set[int]:
    """ids of parameters reachable under more than one name (tied embeddings)."""
    seen: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        seen[id(param)] = seen.get(id(param), 0) + 1
    return {key for key, count in seen.items() if count > 1}


def head_logits(hidden: torch.Tensor, head: torch.Tensor, head_t: torch.Tensor | None) -> torch.Tensor:
    """[..., H] -> [..., N] logits of a restricted head: `head` [N, H], or its input-major copy `head_t` [H, N]."""
    if head_t is not None:
        return torch.matmul(hidden, head_t.to(hidden.dtype))
    return torch.nn.functional.linear(hidden, head.to(hidden.dtype))


def input_major_head(model: nn.Module) -> int:
    """Give a restricted head (`model.head_weight` [N, H]) its input-major copy `head_weight_t` [H, N],
    which `head_logits` then uses; returns the copy's bytes. Call again after `head_weight` changes."""
    head = model.head_weight
    assert isinstance(head, torch.Tensor), "a restricted head is an [N, H] buffer"
    head_t = head.t().contiguous()
    model.register_buffer("head_weight_t", head_t, persistent=False)
    return head_t.numel() * head_t.element_size()
