"""Ragged batched forward: several sessions, each with its own KV cache and length, in ONE pass.

Continuous batching for verification. The sessions' new tokens are packed into ONE
sequence [1, S] (S = the sum of their lengths, no padding), so the linear layers
(q/k/v/o projections, MLP, LM head) run once over all of them; attention runs per
session against that session's own cache. No session's
cache is copied into a padded batch tensor and back, each keeps its own length
and its own `truncate(n)` (SessionKV), and a row's result does not depend on
which other rows share the batch beyond float rounding of the batched matmuls.

How it plugs into a transformers model: the attention implementation of the model
is switched to `specdec_ragged` (registered below). For ordinary calls (a real
cache object) it is SDPA (`plain_attention`: transformers' own, except that on CPU
grouped K/V heads are never copied per query head); for a batched call the cache passed
in is a `RaggedCache`, whose `update` appends each row's new keys/values to that
row's session cache and hands attention the per-row tensors (`RaggedRows`).
A model whose attention does not go through transformers' attention interface
cannot be batched this way: `enable_ragged` says so loudly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTN_NAME = "specdec_ragged"
ROW_INVARIANT_ATTN_NAME = "specdec_row_invariant"


@dataclass
class RaggedRows:
    """Per-session keys (or values) after the cache update: rows[i] is [1, kv_heads, L_i, head_dim]."""

    rows: list[torch.Tensor]
    spans: list[tuple[int, int]]  # session i's new tokens are packed positions [start, end)
    alone: list[int] | None = None  # row-invariant attention: session i's last alone[i] rows attend one by one


class RaggedCache:
    """The cache object a packed forward sees: session i appends to its own cache.

    Args:
        caches: one transformers DynamicCache per session (the sessions' own caches).
        new_lengths: new tokens per session, packed in this order.
        alone: per session, how many of its last new tokens attend one row at a time under
            row-invariant attention (the rows whose logits are returned); None: all of them.
    """

    def __init__(self, caches: list[Any], new_lengths: list[int], alone: list[int] | None = None) -> None:
        self.caches = caches
        self.alone = alone
        ends = torch.tensor(new_lengths).cumsum(0).tolist()
        self.spans = [(end - n, end) for n, end in zip(new_lengths, ends)]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[RaggedRows, RaggedRows]:
        """key_states/value_states: [1, kv_heads, S, head_dim] for the packed new tokens."""
        keys, values = [], []
        for cache, (start, end) in zip(self.caches, self.spans):
            k, v = cache.update(key_states[:, :, start:end], value_states[:, :, start:end], layer_idx)
            keys.append(k)
            values.append(v)
        return RaggedRows(keys, self.spans, self.alone), RaggedRows(values, self.spans, self.alone)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # positions are always passed explicitly (position_ids)


def plain_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """One session's attention: transformers' SDPA path, except that on CPU grouped K/V heads are never
    copied to every query head (transformers' `repeat_kv` whenever a mask is passed, as in a verify pass of
    several rows over a cache: at 8,000 cached tokens that copy was most of a 5-row verify pass): decode
    steps and verify passes stack each K/V head's query heads as rows (`_grouped_rows_attention`), a
    prefill from an empty cache runs SDPA with `enable_gqa`. Same values up to float rounding
    (tests/unit/test_kvcache.py). On other devices SDPA's fast kernels take no mask with enable_gqa, so
    transformers' path stays.
    query: [B, heads, q, head_dim]; key/value: [B, kv_heads, L, head_dim]. Returns ([B, q, heads, head_dim], None)."""
    grouped = key.shape[1] != query.shape[1]
    if (
        not grouped
        or query.device.type != "cpu"
        or kwargs.get("position_bias") is not None
        or kwargs.get("softcap") is not None
        or kwargs.get("output_attentions")
    ):
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    q_length = query.shape[2]
    causal = kwargs.get("is_causal")
    causal = (
        q_length > 1 and attention_mask is None and (getattr(module, "is_causal", True) if causal is None else causal)
    )
    if causal and key.shape[2] > q_length:  # transformers' rule for an is_causal call (upper-left alignment)
        key, value = key[:, :, :q_length], value[:, :, :q_length]
    shared_mask = attention_mask.shape[1] == 1 if attention_mask is not None else q_length == 1
    if shared_mask and not kwargs.get("dropout"):  # a decode step, or a verify pass over a cache
        out = _grouped_rows_attention(query, key, value, attention_mask, scaling)
    else:
        out = F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attention_mask,
            dropout_p=kwargs.get("dropout", 0.0),
            scale=scaling,
            is_causal=causal,
            enable_gqa=True,
        )  # [B, heads, q, head_dim]
    return out.transpose(1, 2).contiguous(), None


def _grouped_rows_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scaling: float | None
) -> torch.Tensor:
    """SDPA with each K/V head's query heads stacked as rows of one head (query head h reads K/V head
    h // group, as repeat_kv has it), so each K/V head is read once per pass instead of once per query
    head: the attention of a decode step or verify pass at a long context is bound by reading the cache
    (SmolLM2: 9 query heads on 3 K/V heads, 3x fewer bytes). Same values up to float rounding.
    query: [B, heads, q, D]; key/value: [B, kv_heads, L, D]; mask: [B or 1, 1, q, L], or None when every row
    sees every key (one row). Returns [B, heads, q, D]."""
    batch, heads, q_length, head_dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    stacked = query.reshape(batch, kv_heads, group * q_length, head_dim)  # row r * q + j: head g*group + r, row j
    stacked_mask = None if mask is None else mask.repeat(1, 1, group, 1)
    out = F.scaled_dot_product_attention(stacked, key, value, attn_mask=stacked_mask, scale=scaling)
    return out.reshape(batch, heads, q_length, head_dim)


def ragged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: Any,
    value: Any,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """query: [1, heads, S, head_dim] when packed. Returns ([1, S, heads, head_dim], None)."""
    if not isinstance(key, RaggedRows):
        return plain_attention(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    _, heads, packed, head_dim = query.shape
    out = query.new_empty(1, packed, heads, head_dim)
    for k, v, (start, end) in zip(key.rows, value.rows, key.spans):
        n, total = end - start, k.shape[2]
        mask = None if n == 1 else offset_causal_mask(n, total, query.device)
        rows = query[:, :, start:end]
        if rows.device.type == "cpu":  # K/V heads read once (plain_attention)
            o = _grouped_rows_attention(rows, k, v, None if mask is None else mask[None, None], scaling)
        else:
            o = F.scaled_dot_product_attention(
                rows, k, v, attn_mask=mask, scale=scaling, enable_gqa=k.shape[1] != heads
            )  # [1, heads, n, head_dim]
        out[0, start:end] = o[0].transpose(0, 1)
    return out, None


def offset_causal_mask(n: int, total: int, device: torch.device) -> torch.Tensor:  # [n, total] bool
    """Query j (the (total-n+j)-th position) sees keys 0..total-n+j."""
    keys = torch.arange(total, device=device)
    last = torch.arange(total - n, total, device=device).unsqueeze(1)
    return keys.unsqueeze(0) <= last


def row_invariant_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: Any,
    value: Any,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention in which a row whose logits are returned is computed exactly as a 1-row decode step
    computes it (one SDPA call for that row over the keys it sees, no mask), whatever the number of
    rows in the pass; see `_attend_alone`. A session's other new rows (a prefill's, whose logits
    nobody reads) run as ONE causal SDPA call over the keys before them, so a prompt is prefilled the
    same way whatever k follows it. Rows follow the keys before them with no padding (what
    CausalLMRunner passes); `attention_mask` is ignored. query: [1, heads, S, head_dim]; key/value:
    [1, kv_heads, L, head_dim] (every row alone) or RaggedRows. Returns ([1, S, heads, head_dim], None).
    """
    _, heads, packed, head_dim = query.shape
    if isinstance(key, RaggedRows):
        alone = key.alone or [end - start for start, end in key.spans]
        groups = list(zip(key.rows, value.rows, key.spans, alone))
    else:
        groups = [(key, value, (0, packed), packed)]
    out = query.new_empty(1, packed, heads, head_dim)
    for k, v, (start, end), n_alone in groups:
        n, total = end - start, k.shape[2]
        together = n - n_alone
        if together > 0:  # prefill rows: keys 0 .. total - n_alone - 1, causal
            mask = None if together == 1 else offset_causal_mask(together, total - n_alone, query.device)
            o = F.scaled_dot_product_attention(
                query[:, :, start : start + together],
                k[:, :, : total - n_alone],
                v[:, :, : total - n_alone],
                attn_mask=mask,
                scale=scaling,
                enable_gqa=k.shape[1] != heads,
            )  # [1, heads, together, head_dim]
            out[0, start : start + together] = o[0].transpose(0, 1)
        for j in range(together, n):
            out[0, start + j] = _attend_alone(query[:, :, start + j : start + j + 1], k, v, total - n + j + 1, scaling)
    return out, None


def _attend_alone(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seen: int, scaling: float | None) -> torch.Tensor:
    """One query row [1, heads, 1, head_dim] over keys 0..seen-1 of k/v [1, kv_heads, L, head_dim], the
    call a 1-row decode step makes: SDPA over several query rows (blocks of rows in one GEMM, a
    causal mask) rounds differently in the last bits, which int8 activation rounding can amplify
    into another token (specdec/models/int8.py). Returns [heads, head_dim]."""
    o = _grouped_rows_attention(q, k[:, :, :seen], v[:, :, :seen], None, scaling)
    return o[0, :, 0]


AttentionInterface.register(ATTN_NAME, ragged_attention)
AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)
AttentionInterface.register(ROW_INVARIANT_ATTN_NAME, row_invariant_attention)
AttentionMaskInterface.register(ROW_INVARIANT_ATTN_NAME, sdpa_mask)


def enable_ragged(model: Any, row_invariant: bool = False) -> bool:
    """Switch the model to the ragged attention implementation (the row-invariant one, which also
    batches sessions, when asked); False when it cannot be."""
    name = ROW_INVARIANT_ATTN_NAME if row_invariant else ATTN_NAME
    try:
        model.set_attn_implementation(name)
    except (ValueError, AttributeError, TypeError, KeyError):
        return False
    return getattr(model.config, "_attn_implementation", None) == name


def packed_inputs(
    rows: list[list[int]], pasts: list[int], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed ids [1, S], their positions [1, S], and the 4D placeholder mask the model passes through.

    rows[i] are session i's new tokens, which follow its `pasts[i]` cached positions.
    """
    ids = torch.tensor([t for row in rows for t in row], dtype=torch.long).unsqueeze(0)
    positions = torch.cat([torch.arange(past, past + len(row)) for row, past in zip(rows, pasts)]).unsqueeze(0)
    placeholder = torch.ones(1, 1, 1, 1, dtype=torch.bool)  # a 4D mask is returned as-is by mask creation
    return ids.to(device), positions.to(device), placeholder.to(device)
