"""int8 linear weights for the CPU forward (`--dtype int8`): torch's own dynamic-quantized linear
(fbgemm: int8 x int8 GEMM, int32 accumulation), weights quantized per output channel at load.

Plain dynamic quantization (torch.ao quantize_dynamic) picks ONE activation scale per call from
all of its rows, so a token's logits would depend on which other tokens share the call: a decode
step (1 row) and a verify pass (k + 1 rows) would disagree, and speculation could not be checked
against the target as served. Here every row is scaled to max |x| = 1 first and a pinning row
[-1, 1, 0, ...] is appended, so the quantizer always sees the range [-1, 1]: each row is quantized
on its own (per-token activation scales) and its output is the same whatever rows share the call.
The output is scaled back per row and the bias added in float32.

Attention: these linears are row-invariant, but SDPA over k + 1 query rows rounds differently in
the last bits from the 1-row call, and a per-row int8 rounding can turn that into a whole
quantization step (seen in the bench: k = 4 left k = 0 on a grounded prompt at token 61, top-2 gap
0.32). So an int8 target runs row-invariant attention by default (SPECDEC_ROW_INVARIANT=auto,
specdec/engine/ragged.py): the rows whose logits a pass returns attend one at a time, exactly as a
1-row decode step does, and every such row is bitwise the 1-row step's (tested).

Embeddings stay float32; a tied LM head gets its own int8 copy. Activations, attention, norms and
the KV cache stay float32 (ModelInfo.dtype says "int8": int8 weights, float32 activations).
"""

from __future__ import annotations

import torch
from torch import nn

from specdec.models.kernels import plain_linears

INT8_DTYPES = ("int8", "qint8")
# Rows scaled to this max |x| before quantization (and the pinning row's values).
ROW_SCALE = 1.0
# fbgemm on x86 keeps activations to 7 bits so its int16 intermediate sums cannot overflow.
REDUCE_RANGE = True


def wants_int8(dtype: str) -> bool:
    """Whether a service's dtype option asks for int8 weights."""
    return dtype.strip().lower() in INT8_DTYPES


def int8_available() -> bool:
    """torch's fbgemm dynamic linear exists in this build (x86 CPUs)."""
    return "fbgemm" in torch.backends.quantized.supported_engines


class Int8Linear(nn.Module):
    """A drop-in for an inference-only float32 nn.Linear with per-channel int8 weights."""

    pin: torch.Tensor  # registered buffer

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach().float()  # [out, in]
        scales = (w.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny).double()
        q = torch.quantize_per_channel(w, scales, torch.zeros_like(scales, dtype=torch.long), 0, torch.qint8)
        self._packed = torch.ops.quantized.linear_prepack(q, None)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().float(), requires_grad=False)
        pin = torch.zeros(1, self.in_features)
        pin[0, 0], pin[0, -1] = -ROW_SCALE, ROW_SCALE
        self.register_buffer("pin", pin, persistent=False)

    @property
    def weight(self) -> torch.Tensor:  # [out, in], dequantized on each read (readers of the shape, head rows)
        return torch.ops.quantized.linear_unpack(self._packed)[0].dequantize()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        rows = x.reshape(-1, self.in_features).float()
        amax = rows.abs().amax(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
        scaled = torch.cat([rows * (ROW_SCALE / amax), self.pin], dim=0)
        y = torch.ops.quantized.linear_dynamic(scaled, self._packed, REDUCE_RANGE)[:-1] * (amax / ROW_SCALE)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


def quantize_linears(root: nn.Module) -> tuple[int, int]:
    """Replace every plain nn.Linear under `root` by an Int8Linear. Returns (layers, int8 weight bytes)."""
    if not int8_available():
        raise ValueError(
            "dtype int8 needs torch's fbgemm quantized engine (x86 CPUs); "
            f"this build has {torch.backends.quantized.supported_engines}"
        )
    torch.backends.quantized.engine = "fbgemm"
    replaced, nbytes = 0, 0
    for parent, name, child in plain_linears(root):
        setattr(parent, name, Int8Linear(child))
        replaced, nbytes = replaced + 1, nbytes + child.weight.numel()
    return replaced, nbytes
