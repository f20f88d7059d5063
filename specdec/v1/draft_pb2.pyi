from specdec.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NgramParams(_message.Message):
    __slots__ = ("min_n", "max_n")
    MIN_N_FIELD_NUMBER: _ClassVar[int]
    MAX_N_FIELD_NUMBER: _ClassVar[int]
    min_n: int
    max_n: int
    def __init__(self, min_n: _Optional[int] = ..., max_n: _Optional[int] = ...) -> None: ...

class ProposeRequest(_message.Message):
    __slots__ = ("session_id", "request_id", "context_ids", "k", "sampling", "draft_kind", "ngram", "target_hidden", "position_base", "prefix_hash")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_IDS_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    DRAFT_KIND_FIELD_NUMBER: _ClassVar[int]
    NGRAM_FIELD_NUMBER: _ClassVar[int]
    TARGET_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    POSITION_BASE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HASH_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    request_id: str
    context_ids: _containers.RepeatedScalarFieldContainer[int]
    k: int
    sampling: _common_pb2.SamplingParams
    draft_kind: str
    ngram: NgramParams
    target_hidden: _common_pb2.HiddenStates
    position_base: int
    prefix_hash: int
    def __init__(self, session_id: _Optional[str] = ..., request_id: _Optional[str] = ..., context_ids: _Optional[_Iterable[int]] = ..., k: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., draft_kind: _Optional[str] = ..., ngram: _Optional[_Union[NgramParams, _Mapping]] = ..., target_hidden: _Optional[_Union[_common_pb2.HiddenStates, _Mapping]] = ..., position_base: _Optional[int] = ..., prefix_hash: _Optional[int] = ...) -> None: ...

class ProposeResponse(_message.Message):
    __slots__ = ("draft_ids", "draft_probs", "stats", "draft_kind", "target_hidden_from")
    DRAFT_IDS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_PROBS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_KIND_FIELD_NUMBER: _ClassVar[int]
    TARGET_HIDDEN_FROM_FIELD_NUMBER: _ClassVar[int]
    draft_ids: _containers.RepeatedScalarFieldContainer[int]
    draft_probs: _containers.RepeatedCompositeFieldContainer[_common_pb2.SparseDistribution]
    stats: _common_pb2.ComputeStats
    draft_kind: str
    target_hidden_from: int
    def __init__(self, draft_ids: _Optional[_Iterable[int]] = ..., draft_probs: _Optional[_Iterable[_Union[_common_pb2.SparseDistribution, _Mapping]]] = ..., stats: _Optional[_Union[_common_pb2.ComputeStats, _Mapping]] = ..., draft_kind: _Optional[str] = ..., target_hidden_from: _Optional[int] = ...) -> None: ...
