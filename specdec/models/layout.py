"""Weight layout for the CPU forward: linear layers stored input-major ([in, out]) in float32.

Used by the target (every nn.Linear) and by trained drafts (their own layers and their
restricted head; the target's embedding and LM head they share are left alone).

`nn.Linear` keeps W as [out, in] and computes x @ W^T. For the few rows a decode step
or a verify pass runs (M = 1 .. k+1), MKL's fp32 kernels stream an [in, out] matrix
much faster than an [out, in] one on this CPU: SmolLM2-135M's whole forward over 300
cached tokens measured v(1) = 39.2 -> 30.9 ms, v(2) 65.5 -> 49.7, v(3) 81.0 -> 60.0,
v(5) 68.6 -> 63.1, v(9) 79.6 -> 73.3 ms (1 thread), with bit-identical logits. In
bfloat16 the standard layout is faster (oneDNN), so only float32 on CPU is changed.

A tied LM head (SmolLM2 ties it to the token embedding) gets its own transposed copy:
vocab x hidden more weight memory (113 MB for SmolLM2 in fp32), reported at load.
"""

from __future__ import annotations

import torch
from torch import nn


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
        y = torch.matmul(x, self.weight_t)
        return y if self.bias is None else y + self.bias


def wants_input_major(device: torch.device, dtype: torch.dtype) -> bool:
    """Where the input-major layout is faster: float32 on CPU."""
    return device.type == "cpu" and dtype == torch.float32


def use_input_major_linears(model: nn.Module) -> tuple[int, int]:
    """Replace every plain `nn.Linear` of `model` (inference only) by an InputMajorLinear.

    Returns (layers replaced, extra bytes: tied weights that now exist twice).
    """
    shared = _shared_weights(model)
    replaced, extra = 0, 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not nn.Linear:
                continue
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
    model.register_buffer("head_weight_t", model.head_weight.t().contiguous(), persistent=False)
    return model.head_weight_t.numel() * model.head_weight_t.element_size()
