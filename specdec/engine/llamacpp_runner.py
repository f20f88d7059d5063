"""The llama.cpp runner: a GGUF model on llama.cpp's CPU kernels, through llama-cpp-python's C API.

Sessions are sequence ids of ONE llama.cpp context with a unified KV cache (specdec/engine/llamacpp_cache.py).
A pass is one `llama_decode` over every session's new tokens, logits only on the rows the accept rule reads
(continuous batching, as llama.cpp's server slots do); chunked prefill is the engines' budget, as with the torch
runner. Logits come back as a [rows, V] float32 tensor, so the accept rule, sampling and seeds are unchanged.
"""

from __future__ import annotations

import ctypes
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from specdec.core.prefix_hash import PrefixHashes
from specdec.engine.kvcache import IdleRule, KVCachePool
from specdec.engine.llamacpp_cache import LlamaCacheOps
from specdec.engine.llamacpp_lib import LlamaCppLib, load_library
from specdec.engine.runner import ExtendItem, ExtendPlan, ForwardResult, count_extend, plan_extend
from specdec.errors import InvalidArgument, ResourceExhausted

MS_PER_S = 1000.0
MIN_KV_TOKENS = 256  # the smallest context llama.cpp is asked for (its cells come in blocks of 256)


@dataclass(frozen=True)
class LlamaCppSettings:
    """What a llama.cpp context is made with (SPECDEC_LLAMACPP_* settings, specdec/config.py)."""

    threads: int = 2  # n_threads and n_threads_batch
    kv_tokens: int = 8192  # KV cells shared by all sessions (n_ctx of the unified cache) ...
    budget_bytes: int = 0  # ... at most this many bytes of them (0: no cap)
    sessions: int = 64  # sequences held at once (n_seq_max; LRU-evicted beyond)
    batch_tokens: int = 2048  # tokens one llama_decode takes (n_batch); larger passes are split
    ubatch_tokens: int = 512  # tokens ggml computes at once (n_ubatch)
    flash_attn: bool = True  # flash attention (its CPU kernel skips masked cells of other sessions)
    share_min_tokens: int = 16  # prefix sharing's shortest shared prefix (0: off)
    idle_tokens: int = -1  # the most cells idle sessions hold, least recently used evicted beyond (-1: no limit)
    idle_seconds: float = 1.0  # unused this long, a session is idle


class _Batch:
    """A llama_batch over numpy buffers we own (never llama_batch_free'd): filled with vector writes."""

    def __init__(self, lib: LlamaCppLib, capacity: int, sessions: int) -> None:
        self.capacity = capacity
        self.token = np.zeros(capacity, np.int32)
        self.pos = np.zeros(capacity, np.int32)
        self.n_seq_id = np.ones(capacity, np.int32)
        self.logits = np.zeros(capacity, np.int8)
        self._seq_values = np.arange(sessions, dtype=np.int32)  # seq_id[i] points at one of these
        self._seq_table = np.zeros(capacity, np.uintp)
        self.struct = lib.llama_batch()
        self.struct.token = self.token.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.embd = None
        self.struct.pos = self.pos.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.seq_id = ctypes.cast(self._seq_table.ctypes.data, ctypes.POINTER(ctypes.POINTER(ctypes.c_int32)))
        self.struct.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))

    def fill(self, tokens: np.ndarray, pos: np.ndarray, seqs: np.ndarray, outputs: np.ndarray) -> None:
        n = len(tokens)
        self.token[:n], self.pos[:n], self.logits[:n] = tokens, pos, outputs
        self._seq_table[:n] = self._seq_values.ctypes.data + 4 * seqs.astype(np.uintp)
        self.struct.n_tokens = n


class LlamaCppRunner:
    """Computes logits for sessions' token sequences on one llama.cpp context (the Runner protocol).

    Args:
        path: the GGUF file.
        settings: the context's shape (threads, KV cells, sessions, batch sizes).
    """

    engine = "llamacpp"
    keep_hidden = False
    batching = True
    device = "cpu"

    def __init__(self, path: str | Path, settings: LlamaCppSettings) -> None:
        self.lib = load_library()
        self.path = str(path)
        self.model = self.lib.load_model(self.path)
        self.bytes_per_token = self.lib.kv_bytes_per_token(self.model)
        if settings.budget_bytes:
            cells = max(MIN_KV_TOKENS, min(settings.kv_tokens, settings.budget_bytes // self.bytes_per_token))
            settings = dataclasses.replace(settings, kv_tokens=cells)
        self.settings = settings
        self.ctx = self.lib.new_context(self.model, settings)
        self.vocab_width = self.lib.n_vocab(self.model)
        self.max_context = self.lib.n_ctx_train(self.model)
        self.hidden_size = self.lib.n_embd(self.model)
        self.description = self.lib.describe(self.model)
        self.file_type = self.description.rsplit(" ", 1)[-1]  # the GGUF's weight type: Q4_1, Q8_0, F16 ...
        self.kv_tokens = self.lib.n_ctx(self.ctx)
        memory = self.lib.memory(self.ctx)
        self.ops = LlamaCacheOps(
            settings.sessions,
            lambda s, p0, p1: self.lib.seq_rm(memory, s, p0, p1),
            lambda a, b, p0, p1: self.lib.seq_cp(memory, a, b, p0, p1),
        )
        # The pool counts a position per session; llama.cpp needs a cell per position (shared prefixes share cells).
        self.pool = KVCachePool(
            self.kv_tokens * self.bytes_per_token,
            self.bytes_per_token,
            share_min_tokens=settings.share_min_tokens,
            ops=self.ops,
            idle=IdleRule(settings.idle_tokens, settings.idle_seconds) if settings.idle_tokens >= 0 else None,
        )
        self._batch = _Batch(self.lib, settings.batch_tokens, settings.sessions)

    @property
    def engine_detail(self) -> str:
        """What Info metadata says of this engine: ggml's CPU kernels variant, threads and KV cells."""
        return f"cpu={self.lib.cpu_variant or 'built-in'},threads={self.settings.threads},kv={self.kv_tokens}"

    def close(self) -> None:
        if self.ctx is not None:
            self.lib.free_context(self.ctx)
            self.lib.free_model(self.model)
            self.ctx = self.model = None

    def extend(
        self, session_id: str, ids: Sequence[int], first: int, hashes: PrefixHashes | None = None, hidden: bool = True
    ) -> ForwardResult:
        """Make the session's cache cover `ids`; return logits of positions first..len(ids)-1 ([n, V])."""
        return self.extend_batch([ExtendItem(session_id, ids, first, hashes, hidden)])[0]

    def extend_batch(self, items: Sequence[ExtendItem]) -> list[ForwardResult]:
        """`extend` for distinct sessions in ONE llama_decode (split only past batch_tokens).

        Steps: 1. plan each session (acquire its sequence, reuse the longest cached prefix, roll back the rest),
        2. check that making room for a later session evicted no earlier one of this pass, 3. apply the queued
        KV edits and decode, 4. hand each session its logits rows. On any error the sessions' caches are
        dropped, so none is left half-updated."""
        if len({item.session_id for item in items}) != len(items):
            raise ValueError("a batch holds each session at most once")
        plans: list[ExtendPlan] = []
        try:
            for item in items:
                plans.append(self._plan(item))
            evicted = [p.item.session_id for p in plans if not self.pool.holds(p.item.session_id, p.kv)]
            if evicted:
                raise ResourceExhausted(
                    f"the KV cache ({self.kv_tokens} cells) cannot hold this pass's {len(plans)} sessions at once"
                )
            start = time.perf_counter()
            rows = self._decode(plans)
            elapsed = (time.perf_counter() - start) * MS_PER_S
        except BaseException:
            for item in items:
                self.pool.release(item.session_id)
            raise
        pass_tokens = sum(len(p.new_ids) for p in plans)
        results = []
        for plan, logits in zip(plans, rows):
            plan.kv.extend_tokens(plan.item.ids, plan.item.hashes)
            count_extend(self.pool.counters, plan)
            results.append(
                ForwardResult(logits, plan.reuse, len(plan.new_ids), plan.rolled_back, elapsed, len(items), pass_tokens)
            )
        return results

    def _plan(self, item: ExtendItem) -> ExtendPlan:
        if len(item.ids) > self.max_context:
            raise InvalidArgument(f"{len(item.ids)} tokens exceed the model's context of {self.max_context}")
        return plan_extend(self.pool, item)

    def _decode(self, plans: list[ExtendPlan]) -> list[torch.Tensor]:
        """One llama_decode over every plan's new tokens (more only past batch_tokens); each plan's logits rows."""
        tokens = np.fromiter((t for p in plans for t in p.new_ids), np.int32)
        pos = np.concatenate([np.arange(p.reuse, p.reuse + len(p.new_ids), dtype=np.int32) for p in plans])
        seqs = np.concatenate([np.full(len(p.new_ids), p.kv.cache.seq_id, np.int32) for p in plans])
        outputs = np.zeros(len(tokens), np.int8)
        end = 0
        for p in plans:
            end += len(p.new_ids)
            outputs[end - p.keep : end] = 1
        if (tokens < 0).any() or (tokens >= self.vocab_width).any():
            raise InvalidArgument(f"token ids must lie in [0, {self.vocab_width})")
        self.ops.flush()
        chunks = []
        step = self._batch.capacity
        for lo in range(0, len(tokens), step):
            hi = min(lo + step, len(tokens))
            self._batch.fill(tokens[lo:hi], pos[lo:hi], seqs[lo:hi], outputs[lo:hi])
            self.lib.decode(self.ctx, self._batch.struct)
            n_out = int(outputs[lo:hi].sum())
            if n_out:
                chunks.append(self.lib.logits(self.ctx, n_out, self.vocab_width))
        logits = torch.from_numpy(np.concatenate(chunks) if len(chunks) > 1 else chunks[0])
        return list(torch.split(logits, [p.keep for p in plans]))
