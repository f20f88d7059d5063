"""Conversions between the wire messages (specdec.v1) and the engines' dataclasses."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from specdec.core.sampling import SamplingConfig
from specdec.engine.types import ComputeStatsData, HiddenRows, SparseDist, TokenLogprobData
from specdec.errors import InvalidArgument
from specdec.params import SAMPLING_FIELDS, resolve_sampling
from specdec.v1 import common_pb2

if TYPE_CHECKING:
    from specdec.core.prefix_hash import PrefixHashes
    from specdec.engine.contexts import ContextStore

PROTOCOL_VERSION = "specdec.v1"
HIDDEN_WIRE_DTYPE = "float16"  # hidden states travel as fp16 (feature drafts are trained on fp16 features)
SAMPLING_CACHE_SIZE = 1024  # resolved sampling settings kept (sampling_from_proto)
MS_PER_S = 1000.0


def sampling_to_proto(cfg: SamplingConfig) -> common_pb2.SamplingParams:
    """Every field set explicitly: the model services never fall back to their own defaults."""
    msg = common_pb2.SamplingParams()
    for name in SAMPLING_FIELDS:
        value = getattr(cfg, name)
        if value is not None:
            setattr(msg, name, value)
    return msg


@functools.lru_cache(maxsize=SAMPLING_CACHE_SIZE)
def sampling_bytes(cfg: SamplingConfig) -> bytes:
    """sampling_to_proto(cfg) serialised, kept per (frozen) config: a generation's every call carries the same
    settings, merged into each request (`request.sampling.MergeFromString`) instead of built field by field."""
    return sampling_to_proto(cfg).SerializeToString()


def sampling_from_proto(msg: Any) -> SamplingConfig:
    """SamplingParams -> validated SamplingConfig (unset fields take the shared defaults).

    A message with its seed set always resolves to the same (frozen) config, and a generation sends the
    same one every round: those are kept by their bytes (SAMPLING_CACHE_SIZE of them), so a round pays
    one serialisation instead of reading and validating every field again (~35 us cache-cold). Without a
    seed each call draws a new one: never kept."""
    if msg is None or not msg.HasField("seed"):
        return resolve_sampling(msg)
    return _sampling_from_bytes(msg.SerializeToString(deterministic=True))


@functools.lru_cache(maxsize=SAMPLING_CACHE_SIZE)
def _sampling_from_bytes(data: bytes) -> SamplingConfig:
    return resolve_sampling(common_pb2.SamplingParams.FromString(data))  # an invalid one raises: not kept


def sparse_to_proto(rows: Iterable[SparseDist]) -> list[common_pb2.SparseDistribution]:
    return [common_pb2.SparseDistribution(token_ids=r.token_ids, probs=r.probs) for r in rows]


def sparse_from_proto(rows: Iterable[Any]) -> list[SparseDist]:
    return [SparseDist(list(r.token_ids), list(r.probs)) for r in rows]


def fill_stats(msg: common_pb2.ComputeStats, s: ComputeStatsData) -> None:
    """Write `s` into a response's ComputeStats in place (no message built and copied in: ≈ 20 µs less a round,
    cache-cold after a forward)."""
    msg.cached_tokens, msg.computed_tokens, msg.rolled_back = s.cached_tokens, s.computed_tokens, s.rolled_back
    msg.forward_ms, msg.queue_ms = s.forward_ms, s.queue_ms
    msg.batch_size, msg.batch_tokens = s.batch_size, s.batch_tokens


def ms_since(started: float) -> float:
    """Milliseconds from `started` (time.perf_counter()) to now: ComputeStats.service_ms."""
    return (time.perf_counter() - started) * MS_PER_S


def logprobs_to_proto(items: Iterable[TokenLogprobData]) -> list[common_pb2.TokenLogprob]:
    return [
        common_pb2.TokenLogprob(
            token_id=i.token_id, logprob=i.logprob, top_token_ids=i.top_token_ids, top_logprobs=i.top_logprobs
        )
        for i in items
    ]


def hidden_to_proto(h: HiddenRows) -> common_pb2.HiddenStates:
    """[n, H] rows -> HiddenStates (fp16, row-major, little-endian)."""
    rows = h.rows.detach().to("cpu", torch.float16).contiguous()
    return common_pb2.HiddenStates(
        data=rows.numpy().astype("<f2", copy=False).tobytes(),
        rows=rows.shape[0],
        hidden_size=rows.shape[1] if rows.dim() == 2 else 0,
        dtype=HIDDEN_WIRE_DTYPE,
        first_position=h.first_position,
    )


def hidden_from_proto(msg: Any, hidden_size: int) -> HiddenRows | None:
    """HiddenStates -> HiddenRows [rows, H] float32; None when the message is empty; INVALID_ARGUMENT when malformed."""
    if msg.rows == 0:
        return None
    if msg.dtype != HIDDEN_WIRE_DTYPE:
        raise InvalidArgument(f"hidden states must be {HIDDEN_WIRE_DTYPE}, got {msg.dtype!r}")
    if msg.hidden_size != hidden_size:
        raise InvalidArgument(
            f"hidden states of size {msg.hidden_size}; this draft needs {hidden_size} "
            "(is it paired with the target it was trained for?)"
        )
    if msg.rows < 0 or msg.first_position < 0 or len(msg.data) != 2 * msg.rows * msg.hidden_size:
        raise InvalidArgument(
            f"hidden states: {len(msg.data)} bytes for {msg.rows} rows of {msg.hidden_size} "
            f"from position {msg.first_position}"
        )
    rows = np.frombuffer(msg.data, dtype="<f2").reshape(msg.rows, msg.hidden_size)
    return HiddenRows(int(msg.first_position), torch.from_numpy(rows.astype(np.float32)))


def resolve_context(store: ContextStore, request: Any) -> tuple[list[int], int, PrefixHashes]:
    """A Propose/Verify request's whole context, the absolute position of its first token and the
    hashes of its prefixes (the caller's own copy).

    The delta form (prefix_hash set) continues the prefix the store holds for the session (ContextMiss
    when it holds another or none); the full form is the request's context_ids. Either way every id
    of the returned context has been checked against the store's vocabulary width.
    """
    if request.HasField("prefix_hash"):
        context, hashes = store.resolve(
            request.session_id, request.context_ids, request.position_base, request.prefix_hash
        )
        return context, 0, hashes
    context, hashes = store.resolve(request.session_id, request.context_ids, request.position_base, None)
    return context, request.position_base, hashes
