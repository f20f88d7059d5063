"""The torch runner: a transformers causal LM over a session's tokens, reusing and rolling back its KV cache."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Sequence
from typing import Any

import torch

from specdec.core.prefix_hash import PrefixHashes
from specdec.engine.cuda_graphs import GraphSlot
from specdec.engine.kvcache import KVCachePool
from specdec.engine.ragged import RaggedCache, enable_ragged, packed_inputs
from specdec.engine.runner import ExtendItem, ExtendPlan, ForwardResult, count_extend, keeps_hidden, plan_extend
from specdec.models.compat import cache_argument
from specdec.models.row_groups import RowGroups, row_groups

MS_PER_S = 1000.0


class CausalLMRunner:
    """Computes logits for a session's token sequence with its KV cache.

    Args:
        model: a transformers causal LM in eval mode.
        pool: the per-session KV caches of this service.
        batching: allow `extend_batch` over several sessions (needs the model's attention switched to
            specdec_ragged, which is tried in any case; stays False when it cannot be switched).
        keep_hidden: store the final (normed) hidden state of every cached position beside the
            KV cache (SessionKV.hidden), for feature drafts; needs a `model.model.norm` module. Only
            for sessions that ask (ExtendItem.hidden); a session that asks late recomputes its prefix.
        row_invariant: every row whose logits a pass returns is computed bitwise as a 1-row step
            computes it, whatever the number of rows in the pass (those rows attend one at a time,
            specdec/engine/ragged.py; the int8 target's option: its linears already are row-invariant).
            Raises ValueError where the model's attention cannot be switched.
    """

    engine = "torch"
    engine_detail = ""  # Info metadata: the linear kernels are reported on their own (kernel_metadata)

    def __init__(
        self,
        model: Any,
        pool: KVCachePool,
        batching: bool = False,
        keep_hidden: bool = False,
        row_invariant: bool = False,
    ) -> None:
        self.model = model
        self.vocab_width = model.get_output_embeddings().weight.shape[0]
        self.pool = pool
        self.keep_hidden = keep_hidden
        self._captured: list[torch.Tensor] = []
        if keep_hidden:
            norm = getattr(getattr(model, "model", None), "norm", None)
            if norm is None:
                raise ValueError(f"{type(model).__name__} has no model.norm: cannot keep its hidden states")
            norm.register_forward_hook(lambda _m, _i, out: self._captured.append(out.detach()))
        # Batched forwards need the model's attention switched to the ragged implementation.
        self.row_invariant = row_invariant
        if row_invariant and not enable_ragged(model, row_invariant=True):
            raise ValueError(f"{type(model).__name__}: attention cannot be switched to row-invariant attention")
        # Switched whether or not it batches: its single-session path is GQA-aware SDPA (ragged.plain_attention).
        ragged = row_invariant or enable_ragged(model)
        self.batching = batching and ragged
        self.device = next(model.parameters()).device
        self._cache_arg = cache_argument(model)

    @torch.inference_mode()
    def extend(
        self, session_id: str, ids: Sequence[int], first: int, hashes: PrefixHashes | None = None, hidden: bool = True
    ) -> ForwardResult:
        """Make the session's cache cover `ids`; return logits of positions first..len(ids)-1.

        The longest common prefix with the cached tokens is reused, but never past
        `first` (its logits must be computed); the rest is truncated (rollback). `hashes` (prefix
        hashes covering at least `ids`) find that prefix without comparing the whole context.
        On any error the session's cache is dropped, so it can never be left half-updated.
        """
        return self.extend_batch([ExtendItem(session_id, ids, first, hashes, hidden)])[0]

    @torch.inference_mode()
    def extend_batch(self, items: Sequence[ExtendItem]) -> list[ForwardResult]:
        """`extend` for several distinct sessions in ONE forward pass (continuous batching).

        One item runs the plain path; several are packed into one sequence with
        per-session attention (specdec/engine/ragged.py), which needs `batching`.
        Making room for a later item may evict an earlier one's cache from the pool:
        that session is still computed correctly and simply misses next time.
        """
        if len({item.session_id for item in items}) != len(items):
            raise ValueError("a batch holds each session at most once")
        if len(items) > 1 and not self.batching:
            raise ValueError("batches of one only (no ragged attention, or CUDA graphs)")
        plans = [self._plan(item) for item in items]
        try:
            start = time.perf_counter()
            self._captured.clear()
            logits = self._forward_plans(plans)
            elapsed = (time.perf_counter() - start) * MS_PER_S
            self._store_hidden(plans)
        except BaseException:
            for item in items:
                self.pool.release(item.session_id)
            raise
        results, pass_tokens = [], sum(len(plan.new_ids) for plan in plans)
        for plan, rows in zip(plans, logits):
            plan.kv.extend_tokens(plan.item.ids, plan.item.hashes)
            count_extend(self.pool.counters, plan)
            results.append(
                ForwardResult(
                    rows,
                    plan.reuse,
                    len(plan.new_ids),
                    plan.rolled_back,
                    elapsed,
                    len(items),
                    pass_tokens,
                    plan.kv.hidden,
                )
            )
        return results

    def _store_hidden(self, plans: list[ExtendPlan]) -> None:
        """Append each session's new hidden rows (captured at the final norm) to its SessionKV.hidden."""
        if not self.keep_hidden:
            return
        rows = self._captured[-1][0]  # [sum of new tokens, H]
        self._captured.clear()
        starts = itertools.accumulate((len(p.new_ids) for p in plans), initial=0)
        for plan, start in zip(plans, starts):
            if not keeps_hidden(plan.item, plan.kv):
                continue
            new = rows[start : start + len(plan.new_ids)]  # [its new tokens, H]
            kv = plan.kv
            if kv.hidden is None or kv.hidden.shape[0] != plan.reuse:  # nothing (consistent) kept
                kv.hidden = None
                if plan.reuse:
                    continue  # rows of the reused prefix are missing: keep none
            kv.append_hidden(new)

    def _plan(self, item: ExtendItem) -> ExtendPlan:
        return plan_extend(self.pool, item, self.keep_hidden)

    def _forward_plans(self, plans: list[ExtendPlan]) -> list[torch.Tensor]:
        if len(plans) == 1 and not self.row_invariant:
            p = plans[0]
            return [self._forward(p.kv.cache, p.new_ids, p.reuse, p.keep)]
        return self._forward_packed(plans)

    def _forward(self, cache: Any, new_ids: list[int], past: int, keep: int) -> torch.Tensor:
        if isinstance(cache, GraphSlot):  # CUDA graphs (specdec/engine/cuda_graphs.py): a static cache
            return cache.forward(new_ids, past, keep)
        input_ids = torch.tensor([new_ids], dtype=torch.long, device=self.device)  # [1, t]
        positions = torch.arange(past, past + len(new_ids), device=self.device).unsqueeze(0)  # [1, t]
        out = self.model(
            input_ids=input_ids, position_ids=positions, use_cache=True, logits_to_keep=keep, **{self._cache_arg: cache}
        )
        return out.logits[0, -keep:].float().cpu()  # [keep, V]

    def _forward_packed(self, plans: list[ExtendPlan]) -> list[torch.Tensor]:
        ids, positions, mask = packed_inputs([p.new_ids for p in plans], [p.reuse for p in plans], self.device)
        cache = RaggedCache(
            [p.kv.cache for p in plans],
            [len(p.new_ids) for p in plans],
            [p.keep for p in plans] if self.row_invariant else None,
        )
        groups = RowGroups(
            tuple(s for s, _ in cache.spans), tuple(e for _, e in cache.spans), tuple(p.keep for p in plans)
        )
        with row_groups(groups) if self.row_invariant else contextlib.nullcontext():
            out = self.model(
                input_ids=ids,
                position_ids=positions,
                attention_mask=mask,
                use_cache=True,
                logits_to_keep=groups.returned.to(self.device),
                **{self._cache_arg: cache},
            )
        rows = out.logits[0].float().cpu()  # [sum of keep, V]
        return list(torch.split(rows, [p.keep for p in plans]))
