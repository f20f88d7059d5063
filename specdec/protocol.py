"""Conversions between the wire messages (specdec.v1) and the engines' dataclasses."""

from __future__ import annotations

from typing import Any, Iterable

from specdec.core.sampling import SamplingConfig
from specdec.engine.types import ComputeStatsData, SparseDist, TokenLogprobData
from specdec.params import SAMPLING_FIELDS, resolve_sampling
from specdec.v1 import common_pb2

PROTOCOL_VERSION = "specdec.v1"


def sampling_to_proto(cfg: SamplingConfig) -> common_pb2.SamplingParams:
    """Every field set explicitly: the model services never fall back to their own defaults."""
    msg = common_pb2.SamplingParams()
    for name in SAMPLING_FIELDS:
        value = getattr(cfg, name)
        if value is not None:
            setattr(msg, name, value)
    return msg


def sampling_from_proto(msg: Any) -> SamplingConfig:
    """SamplingParams -> validated SamplingConfig (unset fields take the shared defaults)."""
    return resolve_sampling(msg)


def sparse_to_proto(rows: Iterable[SparseDist]) -> list[common_pb2.SparseDistribution]:
    return [common_pb2.SparseDistribution(token_ids=r.token_ids, probs=r.probs) for r in rows]


def sparse_from_proto(rows: Iterable[Any]) -> list[SparseDist]:
    return [SparseDist(list(r.token_ids), list(r.probs)) for r in rows]


def stats_to_proto(s: ComputeStatsData) -> common_pb2.ComputeStats:
    return common_pb2.ComputeStats(cached_tokens=s.cached_tokens, computed_tokens=s.computed_tokens,
                                   rolled_back=s.rolled_back, forward_ms=s.forward_ms, queue_ms=s.queue_ms,
                                   batch_size=s.batch_size)


def logprobs_to_proto(items: Iterable[TokenLogprobData]) -> list[common_pb2.TokenLogprob]:
    return [common_pb2.TokenLogprob(token_id=i.token_id, logprob=i.logprob, top_token_ids=i.top_token_ids,
                                    top_logprobs=i.top_logprobs) for i in items]
