"""The feature draft engine: proposes from the target's own hidden states (EAGLE-style).

The model and its notation are in specdec/models/feature_draft.py. Per session the draft keeps a
SessionKV whose position j was computed from (x_{j+1}, f_j): `tokens` = x_1..x_n, `anchor` = x_0,
`hidden` = the target's rows f_0.. it has received (possibly ahead of the cached positions).
After each proposal the positions fed with the draft's own predictions are rolled back, so the
cache only holds positions computed from the target's real features.

The target's rows arrive with the request (ProposeInput.target_hidden), relayed by the
orchestrator from the previous Verify. When the draft lacks rows (first round, a restarted or
different replica, an evicted session) it proposes nothing and says from which position it needs
them (ProposeOutput.target_hidden_from); the next Verify returns them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from specdec.core.sampling import token_counts
from specdec.engine.checks import check_lengths, check_token_ids
from specdec.engine.draft import MODEL, ModelDraft
from specdec.engine.kvcache import KVCachePool, SessionKV, common_prefix_len
from specdec.engine.types import ComputeStatsData, HiddenRows, ProposeInput, ProposeOutput, SparseDist
from specdec.errors import InvalidArgument

MS_PER_S = 1000.0


class FeatureDraft:
    """Proposes up to k tokens with a FeatureDraftModel and per-session caches.

    Args:
        model: the feature draft (its embedding and LM head are the target's).
        pool: the per-session caches (KV of its one layer + the target's rows).
        max_context: the model's context length.
        eos_ids: drafting stops after proposing one of these.
    """

    kind = MODEL
    needs_target_hidden = True

    def __init__(self, model: Any, pool: KVCachePool, max_context: int, eos_ids: Sequence[int]) -> None:
        self.model = model
        self.pool = pool
        self.max_context = max_context
        self.eos_ids = set(eos_ids)
        self.width = model.logits_width
        self.hidden_size = model.config.hidden_size

    @torch.inference_mode()
    def propose(self, inp: ProposeInput) -> ProposeOutput:
        """1. reuse the cache, 2. take the target's new rows, 3. catch up, 4. draft k tokens, 5. roll back."""
        ctx, L = inp.context_ids, len(inp.context_ids)
        check_lengths(L, inp.k, self.max_context)
        check_token_ids(ctx, self.width, "context_ids", inp.checked_ids)
        kv = self.pool.acquire(inp.session_id, L - 1 + max(inp.k, 1))
        try:
            self._reuse(kv, ctx)  # 1
            self._take_rows(kv, inp.target_hidden, inp.position_base)  # 2
            stats = ComputeStatsData(cached_tokens=len(kv.tokens))
            ready = self._catch_up(kv, ctx, stats)  # 3
            if ready is None or inp.k == 0:
                return ProposeOutput([], [], MODEL, stats, target_hidden_from=inp.position_base + kv.hidden.shape[0])
            ids, dists = self._draft(kv, inp, ready, stats)  # 4
            kv.truncate(L - 1)  # 5
        except BaseException:
            self.pool.release(inp.session_id)
            raise
        return ProposeOutput(ids, dists, MODEL, stats, target_hidden_from=inp.position_base + L - 1)

    def _reuse(self, kv: SessionKV, ctx: list[int]) -> None:
        """Keep the positions whose inputs are unchanged, but always recompute position L-2 (its output
        is the first draft token); keep the rows f_j whose prefix x_0..x_j is unchanged."""
        if kv.hidden is None:
            kv.hidden = torch.empty((0, self.hidden_size), dtype=torch.float32)
        if kv.anchor == ctx[0]:
            same = common_prefix_len(kv.tokens, ctx[1:])
            valid_rows = same + 1  # f_j depends on x_0..x_j: one row more than the pairs
        else:
            same = valid_rows = 0
        rows = kv.hidden[: min(kv.hidden.shape[0], valid_rows, len(ctx) - 1)]
        kv.truncate(max(0, min(same, len(ctx) - 2)))
        kv.anchor, kv.hidden = ctx[0], rows

    def _take_rows(self, kv: SessionKV, rows: HiddenRows | None, position_base: int) -> None:
        """Append the target's rows when they continue (or overlap) the ones held; a gap is ignored."""
        if rows is None:
            return
        if rows.rows.shape[1] != self.hidden_size:
            raise InvalidArgument(f"hidden states of size {rows.rows.shape[1]}, this draft needs {self.hidden_size}")
        first = rows.first_position - position_base
        held = kv.hidden.shape[0]
        if first <= held < first + rows.rows.shape[0]:
            kv.append_hidden(rows.rows[held - first :])

    def _catch_up(self, kv: SessionKV, ctx: list[int], stats: ComputeStatsData) -> torch.Tensor | None:
        """Run the positions not cached yet that have real rows; the predicted f^_{L-1} [1, 1, H], or None
        when rows up to L-2 are still missing."""
        L, c = len(ctx), len(kv.tokens)
        end = min(L - 1, kv.hidden.shape[0])
        if end <= c:
            return None
        start = time.perf_counter()
        dtype = self.model.fc.weight.dtype
        out = self.model(
            torch.tensor([ctx[c + 1 : end + 1]]),
            kv.hidden[None, c:end].to(dtype),
            torch.arange(c, end).unsqueeze(0),
            cache=kv.cache,
        )  # [1, end - c, H]
        kv.tokens = list(ctx[1 : end + 1])
        stats.computed_tokens += end - c
        stats.forward_ms += (time.perf_counter() - start) * MS_PER_S
        return out[:, -1:] if end == L - 1 else None

    def _draft(
        self, kv: SessionKV, inp: ProposeInput, feature: torch.Tensor, stats: ComputeStatsData
    ) -> tuple[list[int], list]:
        """k steps from f^_{L-1}: pick d_i from its logits, feed (d_i, f^) for the next."""
        cfg, L = inp.sampling, len(inp.context_ids)
        counts = token_counts(inp.context_ids, self.width) if cfg.has_penalties else None  # [V]
        dists: list[SparseDist] = []
        ids = list(inp.context_ids)
        start = time.perf_counter()
        for i in range(inp.k):
            token = ModelDraft.pick(
                self.model.full_logits(feature[0]).float(),
                cfg,
                counts,  # logits [1, V]
                inp.position_base + len(ids),
                dists,
            )
            ids.append(token)
            if counts is not None:
                counts[token] += 1
            if token in self.eos_ids or i == inp.k - 1:
                break
            position = torch.tensor([[L - 1 + i]])
            feature = self.model(torch.tensor([[token]]), feature, position, cache=kv.cache)  # [1, 1, H]
            kv.tokens.append(token)
            stats.computed_tokens += 1
        stats.forward_ms += (time.perf_counter() - start) * MS_PER_S
        return ids[L:], dists
