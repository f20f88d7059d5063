from specdec.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NextKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NEXT_KIND_UNSPECIFIED: _ClassVar[NextKind]
    NEXT_KIND_RECOVERED: _ClassVar[NextKind]
    NEXT_KIND_BONUS: _ClassVar[NextKind]
    NEXT_KIND_TARGET: _ClassVar[NextKind]
NEXT_KIND_UNSPECIFIED: NextKind
NEXT_KIND_RECOVERED: NextKind
NEXT_KIND_BONUS: NextKind
NEXT_KIND_TARGET: NextKind

class VerifyRequest(_message.Message):
    __slots__ = ("session_id", "request_id", "context_ids", "draft_ids", "draft_probs", "sampling", "logprobs", "return_hidden_states", "position_base", "hidden_from", "prefix_hash", "verdict_only", "steps", "stop_ids", "stop_on_repeat")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_IDS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_IDS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_PROBS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    RETURN_HIDDEN_STATES_FIELD_NUMBER: _ClassVar[int]
    POSITION_BASE_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FROM_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HASH_FIELD_NUMBER: _ClassVar[int]
    VERDICT_ONLY_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    STOP_IDS_FIELD_NUMBER: _ClassVar[int]
    STOP_ON_REPEAT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    request_id: str
    context_ids: _containers.RepeatedScalarFieldContainer[int]
    draft_ids: _containers.RepeatedScalarFieldContainer[int]
    draft_probs: _containers.RepeatedCompositeFieldContainer[_common_pb2.SparseDistribution]
    sampling: _common_pb2.SamplingParams
    logprobs: int
    return_hidden_states: bool
    position_base: int
    hidden_from: int
    prefix_hash: int
    verdict_only: bool
    steps: int
    stop_ids: _containers.RepeatedScalarFieldContainer[int]
    stop_on_repeat: int
    def __init__(self, session_id: _Optional[str] = ..., request_id: _Optional[str] = ..., context_ids: _Optional[_Iterable[int]] = ..., draft_ids: _Optional[_Iterable[int]] = ..., draft_probs: _Optional[_Iterable[_Union[_common_pb2.SparseDistribution, _Mapping]]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., logprobs: _Optional[int] = ..., return_hidden_states: _Optional[bool] = ..., position_base: _Optional[int] = ..., hidden_from: _Optional[int] = ..., prefix_hash: _Optional[int] = ..., verdict_only: _Optional[bool] = ..., steps: _Optional[int] = ..., stop_ids: _Optional[_Iterable[int]] = ..., stop_on_repeat: _Optional[int] = ...) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ("num_accepted", "next_token", "next_kind", "target_ids", "matches", "logprobs", "hidden", "stats", "steps")
    NUM_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    NEXT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NEXT_KIND_FIELD_NUMBER: _ClassVar[int]
    TARGET_IDS_FIELD_NUMBER: _ClassVar[int]
    MATCHES_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    num_accepted: int
    next_token: int
    next_kind: NextKind
    target_ids: _containers.RepeatedScalarFieldContainer[int]
    matches: _containers.RepeatedScalarFieldContainer[bool]
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    hidden: _common_pb2.HiddenStates
    stats: _common_pb2.ComputeStats
    steps: _containers.RepeatedCompositeFieldContainer[DecodeStep]
    def __init__(self, num_accepted: _Optional[int] = ..., next_token: _Optional[int] = ..., next_kind: _Optional[_Union[NextKind, str]] = ..., target_ids: _Optional[_Iterable[int]] = ..., matches: _Optional[_Iterable[bool]] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ..., hidden: _Optional[_Union[_common_pb2.HiddenStates, _Mapping]] = ..., stats: _Optional[_Union[_common_pb2.ComputeStats, _Mapping]] = ..., steps: _Optional[_Iterable[_Union[DecodeStep, _Mapping]]] = ...) -> None: ...

class DecodeStep(_message.Message):
    __slots__ = ("token", "logprob", "stats")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    token: int
    logprob: _common_pb2.TokenLogprob
    stats: _common_pb2.ComputeStats
    def __init__(self, token: _Optional[int] = ..., logprob: _Optional[_Union[_common_pb2.TokenLogprob, _Mapping]] = ..., stats: _Optional[_Union[_common_pb2.ComputeStats, _Mapping]] = ...) -> None: ...
