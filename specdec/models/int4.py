"""int4 linear weights for the CPU forward (`--dtype int4`): torch's own weight-only int4 GEMM
(`aten._weight_int4pack_mm_for_cpu`: 4-bit weights in groups of 32 along the input, one bfloat16
scale and zero per group, bfloat16 activations), quantized at load from the float32 weights.

Why this form: a decode step on CPU streams every weight once, so its time follows the weight bytes.
int4 weights are an eighth of float32's; the embedded SmolLM2's GGUF is itself Q4_1 (4-bit, blocks
of 32, a scale and a minimum per block), which is what llama.cpp serves. Quantizing its dequantized
float32 weights per group of 32 with min/max levels finds those blocks again (each block's minimum
and maximum are codes 0 and 15 of Q4_1), so the int4 target is the GGUF's own weights up to the
bfloat16 rounding of each block's scale and zero.

Row invariance: the int4 GEMM computes every output row on its own, so a token's result does not
depend on which rows share the call (tested). Its time grows with the rows, while oneDNN's bfloat16
GEMM (AMX where the CPU has it) stays nearly flat, so prefill rows run a bfloat16 GEMM over the
same dequantized weights. In a row-invariant runner's pass (specdec/models/row_groups.py) the
returned rows (a decode step's one row, a verify pass's k + 1) always take the int4 GEMM and each
session's prefill rows the bfloat16 GEMM on their own, exactly as that session's k = 0 prefill does;
with row-invariant attention (on by default for int4, specdec/engine/ragged.py) greedy speculation is
token-identical to the int4 target decoding alone, batched or not. Other calls (Hugging Face's
generate in the bench) take the int4 GEMM up to `max_rows` rows and the bfloat16 one beyond.

Activations, norms, attention and the KV cache are bfloat16; embeddings and a tied LM head stay
bfloat16 dense (the GGUF's head is Q8_0, finer than int4). ModelInfo.dtype says "int4".
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from specdec.models.kernels import plain_linears
from specdec.models.row_groups import current_row_groups

INT4_DTYPES = ("int4",)
# Weights per (scale, zero) group, along the input dimension: the block of the GGUF Q4_0/Q4_1 types.
GROUP_SIZE = 32
# Codes 0..15; the kernel dequantizes w = (q - ZERO_CODE) * scale + zero.
LEVELS = 15
ZERO_CODE = 8
# Innermost K tiles of torch's packed int4 layout (its CPU packer takes 1).
INNER_K_TILES = 1
# The kernel's shape rules: the input is a whole number of groups, the output of this many columns.
OUT_MULTIPLE = 16
ACTIVATION_DTYPE = torch.bfloat16


def wants_int4(dtype: str) -> bool:
    """Whether a service's dtype option asks for int4 weights."""
    return dtype.strip().lower() in INT4_DTYPES


def int4_available() -> bool:
    """torch's CPU weight-only int4 GEMM exists in this build."""
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(
        torch.ops.aten, "_convert_weight_to_int4pack_for_cpu"
    )


def int4_supported(linear: nn.Linear) -> bool:
    """Whether the kernel takes this layer's shape (a whole number of groups in, OUT_MULTIPLE out)."""
    return linear.in_features % GROUP_SIZE == 0 and linear.out_features % OUT_MULTIPLE == 0


def quantize_groups(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [out, in] float -> (codes [out, in] int32 in 0..LEVELS, scale [out, in/G], zero [out, in/G])
    with w ~ (codes - ZERO_CODE) * scale + zero: per group of GROUP_SIZE inputs, min/max levels."""
    out_f, in_f = w.shape
    groups = w.float().reshape(out_f, in_f // GROUP_SIZE, GROUP_SIZE)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scale = ((high - low) / LEVELS).clamp_min(torch.finfo(torch.float32).tiny)
    codes = torch.round((groups - low.unsqueeze(-1)) / scale.unsqueeze(-1)).clamp_(0, LEVELS)
    return codes.to(torch.int32).reshape(out_f, in_f), scale, low + ZERO_CODE * scale


def dequantize_groups(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """codes [out, in], scale and zero [out, in/G] -> w [out, in] float32: (codes - ZERO_CODE) * scale + zero,
    the kernel's own dequantization."""
    out_f, in_f = codes.shape
    groups = codes.reshape(out_f, in_f // GROUP_SIZE, GROUP_SIZE).float() - ZERO_CODE
    return (groups * scale.float().unsqueeze(-1) + zero.float().unsqueeze(-1)).reshape(out_f, in_f)


class Int4Linear(nn.Module):
    """A drop-in for an inference-only nn.Linear with group-wise int4 weights and bf16 activations."""

    packed: torch.Tensor  # registered buffers
    scale_zero: torch.Tensor
    dense: torch.Tensor

    def __init__(self, linear: nn.Linear, max_rows: int) -> None:
        super().__init__()
        if not int4_supported(linear):
            raise ValueError(
                f"int4: a linear of {linear.in_features} -> {linear.out_features} does not fit "
                f"the kernel (inputs a multiple of {GROUP_SIZE}, outputs of {OUT_MULTIPLE})"
            )
        self.in_features, self.out_features, self.max_rows = linear.in_features, linear.out_features, max_rows
        codes, scale, zero = quantize_groups(linear.weight.detach())
        scale_zero = torch.stack([scale.t(), zero.t()], dim=-1).to(ACTIVATION_DTYPE).contiguous()  # [in/G, out, 2]
        self.register_buffer(
            "packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, INNER_K_TILES), persistent=False
        )
        self.register_buffer("scale_zero", scale_zero, persistent=False)
        # The same weights, dequantized with the bf16 scale and zero the kernel reads, for wide calls.
        dense = dequantize_groups(codes, scale_zero[..., 0].t(), scale_zero[..., 1].t())
        self.register_buffer("dense", dense.to(ACTIVATION_DTYPE), persistent=False)
        self.bias = (
            None
            if linear.bias is None
            else nn.Parameter(linear.bias.detach().to(ACTIVATION_DTYPE), requires_grad=False)
        )

    @property
    def weight(self) -> torch.Tensor:  # [out, in] (readers of the shape)
        return self.dense

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        rows = x.reshape(-1, self.in_features).to(ACTIVATION_DTYPE)  # [n, in]
        groups = current_row_groups()
        if groups is not None and groups.total == rows.shape[0] and not groups.every_row_returned:
            y = rows.new_empty(rows.shape[0], self.out_features)
            for start, end in groups.prefill_spans:  # each session's prefill alone
                y[start:end] = F.linear(rows[start:end], self.dense, self.bias)
            returned = groups.returned
            y[returned] = self._int4(rows[returned])
        elif groups is None and rows.shape[0] > self.max_rows:
            y = F.linear(rows, self.dense, self.bias)
        else:
            y = self._int4(rows)
        return y.reshape(*x.shape[:-1], self.out_features)

    def _int4(self, rows: torch.Tensor) -> torch.Tensor:  # [n, in] bf16 -> [n, out], row by row
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, GROUP_SIZE, self.scale_zero)
        return y if self.bias is None else y + self.bias


def quantize_linears_int4(root: nn.Module, max_rows: int, keep: tuple[nn.Module, ...] = ()) -> tuple[int, int]:
    """Replace every plain nn.Linear under `root` (but those in `keep`: a tied LM head) that the kernel
    takes by an Int4Linear, then cast the rest of `root`'s parameters to bfloat16 (buffers such as
    rotary frequencies keep their float32, as a bfloat16 load keeps them). Returns (layers, packed bytes)."""
    if not int4_available():
        raise ValueError(
            "dtype int4 needs torch's CPU int4 GEMM (aten._weight_int4pack_mm_for_cpu); "
            f"torch {torch.__version__} lacks it"
        )
    replaced, nbytes = 0, 0
    for parent, name, child in plain_linears(root):
        if int4_supported(child) and not any(child is k for k in keep):
            quantized = Int4Linear(child, max_rows)
            setattr(parent, name, quantized)
            replaced, nbytes = replaced + 1, nbytes + quantized.packed.numel() * quantized.packed.element_size()
    for param in root.parameters():
        param.data = param.data.to(ACTIVATION_DTYPE)
    return replaced, nbytes
