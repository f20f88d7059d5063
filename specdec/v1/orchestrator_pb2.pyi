from specdec.v1 import common_pb2 as _common_pb2
from specdec.v1 import target_pb2 as _target_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_EOS: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_CONTEXT: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_EOS: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_CONTEXT: FinishReason
FINISH_REASON_CANCELLED: FinishReason

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "messages", "session_id", "create_session", "request_id", "resume_offset", "max_new_tokens", "k", "draft_kind", "sampling", "stop", "trace", "ignore_eos", "min_tokens", "logprobs", "add_generation_prompt", "max_rounds", "adaptive_k")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_SESSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RESUME_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    DRAFT_KIND_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ADD_GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    ADAPTIVE_K_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    messages: ChatMessages
    session_id: str
    create_session: bool
    request_id: str
    resume_offset: int
    max_new_tokens: int
    k: int
    draft_kind: str
    sampling: _common_pb2.SamplingParams
    stop: _containers.RepeatedScalarFieldContainer[str]
    trace: bool
    ignore_eos: bool
    min_tokens: int
    logprobs: int
    add_generation_prompt: bool
    max_rounds: int
    adaptive_k: bool
    def __init__(self, prompt: _Optional[str] = ..., messages: _Optional[_Union[ChatMessages, _Mapping]] = ..., session_id: _Optional[str] = ..., create_session: _Optional[bool] = ..., request_id: _Optional[str] = ..., resume_offset: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., k: _Optional[int] = ..., draft_kind: _Optional[str] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., stop: _Optional[_Iterable[str]] = ..., trace: _Optional[bool] = ..., ignore_eos: _Optional[bool] = ..., min_tokens: _Optional[int] = ..., logprobs: _Optional[int] = ..., add_generation_prompt: _Optional[bool] = ..., max_rounds: _Optional[int] = ..., adaptive_k: _Optional[bool] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "total_tokens", "cached_prompt_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_prompt_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ...) -> None: ...

class Stats(_message.Message):
    __slots__ = ("rounds", "draft_tokens", "accepted_tokens", "recovered_tokens", "bonus_tokens", "acceptance_rate", "mean_accepted_length", "draft_ms", "target_ms", "overhead_ms", "total_ms", "wire_bytes", "wire_bytes_per_round", "target_passes", "degraded_rounds", "accepted_per_position", "drafted_per_position", "time_to_first_token_ms", "retries", "target_computed_tokens", "draft_computed_tokens", "context_resends")
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RECOVERED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BONUS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_RATE_FIELD_NUMBER: _ClassVar[int]
    MEAN_ACCEPTED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MS_FIELD_NUMBER: _ClassVar[int]
    TARGET_MS_FIELD_NUMBER: _ClassVar[int]
    OVERHEAD_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    WIRE_BYTES_FIELD_NUMBER: _ClassVar[int]
    WIRE_BYTES_PER_ROUND_FIELD_NUMBER: _ClassVar[int]
    TARGET_PASSES_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_PER_POSITION_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_PER_POSITION_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    TARGET_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_RESENDS_FIELD_NUMBER: _ClassVar[int]
    rounds: int
    draft_tokens: int
    accepted_tokens: int
    recovered_tokens: int
    bonus_tokens: int
    acceptance_rate: float
    mean_accepted_length: float
    draft_ms: float
    target_ms: float
    overhead_ms: float
    total_ms: float
    wire_bytes: int
    wire_bytes_per_round: float
    target_passes: int
    degraded_rounds: int
    accepted_per_position: _containers.RepeatedScalarFieldContainer[int]
    drafted_per_position: _containers.RepeatedScalarFieldContainer[int]
    time_to_first_token_ms: float
    retries: int
    target_computed_tokens: int
    draft_computed_tokens: int
    context_resends: int
    def __init__(self, rounds: _Optional[int] = ..., draft_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ..., recovered_tokens: _Optional[int] = ..., bonus_tokens: _Optional[int] = ..., acceptance_rate: _Optional[float] = ..., mean_accepted_length: _Optional[float] = ..., draft_ms: _Optional[float] = ..., target_ms: _Optional[float] = ..., overhead_ms: _Optional[float] = ..., total_ms: _Optional[float] = ..., wire_bytes: _Optional[int] = ..., wire_bytes_per_round: _Optional[float] = ..., target_passes: _Optional[int] = ..., degraded_rounds: _Optional[int] = ..., accepted_per_position: _Optional[_Iterable[int]] = ..., drafted_per_position: _Optional[_Iterable[int]] = ..., time_to_first_token_ms: _Optional[float] = ..., retries: _Optional[int] = ..., target_computed_tokens: _Optional[int] = ..., draft_computed_tokens: _Optional[int] = ..., context_resends: _Optional[int] = ...) -> None: ...

class Round(_message.Message):
    __slots__ = ("index", "k", "draft_ids", "matches", "target_ids", "num_accepted", "next_token", "next_kind", "text", "draft_ms", "target_ms", "overhead_ms", "draft_replica", "target_replica", "target_cached_tokens", "target_computed_tokens", "draft_computed_tokens", "target_batch_size", "draft_kind", "wire_bytes", "context_tokens", "context_resends", "target_service_ms", "draft_service_ms")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    DRAFT_IDS_FIELD_NUMBER: _ClassVar[int]
    MATCHES_FIELD_NUMBER: _ClassVar[int]
    TARGET_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    NEXT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NEXT_KIND_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MS_FIELD_NUMBER: _ClassVar[int]
    TARGET_MS_FIELD_NUMBER: _ClassVar[int]
    OVERHEAD_MS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_REPLICA_FIELD_NUMBER: _ClassVar[int]
    TARGET_REPLICA_FIELD_NUMBER: _ClassVar[int]
    TARGET_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TARGET_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TARGET_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    DRAFT_KIND_FIELD_NUMBER: _ClassVar[int]
    WIRE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_RESENDS_FIELD_NUMBER: _ClassVar[int]
    TARGET_SERVICE_MS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_SERVICE_MS_FIELD_NUMBER: _ClassVar[int]
    index: int
    k: int
    draft_ids: _containers.RepeatedScalarFieldContainer[int]
    matches: _containers.RepeatedScalarFieldContainer[bool]
    target_ids: _containers.RepeatedScalarFieldContainer[int]
    num_accepted: int
    next_token: int
    next_kind: _target_pb2.NextKind
    text: str
    draft_ms: float
    target_ms: float
    overhead_ms: float
    draft_replica: str
    target_replica: str
    target_cached_tokens: int
    target_computed_tokens: int
    draft_computed_tokens: int
    target_batch_size: int
    draft_kind: str
    wire_bytes: int
    context_tokens: int
    context_resends: int
    target_service_ms: float
    draft_service_ms: float
    def __init__(self, index: _Optional[int] = ..., k: _Optional[int] = ..., draft_ids: _Optional[_Iterable[int]] = ..., matches: _Optional[_Iterable[bool]] = ..., target_ids: _Optional[_Iterable[int]] = ..., num_accepted: _Optional[int] = ..., next_token: _Optional[int] = ..., next_kind: _Optional[_Union[_target_pb2.NextKind, str]] = ..., text: _Optional[str] = ..., draft_ms: _Optional[float] = ..., target_ms: _Optional[float] = ..., overhead_ms: _Optional[float] = ..., draft_replica: _Optional[str] = ..., target_replica: _Optional[str] = ..., target_cached_tokens: _Optional[int] = ..., target_computed_tokens: _Optional[int] = ..., draft_computed_tokens: _Optional[int] = ..., target_batch_size: _Optional[int] = ..., draft_kind: _Optional[str] = ..., wire_bytes: _Optional[int] = ..., context_tokens: _Optional[int] = ..., context_resends: _Optional[int] = ..., target_service_ms: _Optional[float] = ..., draft_service_ms: _Optional[float] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("session_id", "request_id", "text", "token_ids", "finish_reason", "usage", "stats", "trace", "logprobs", "model")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    request_id: str
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    usage: Usage
    stats: Stats
    trace: _containers.RepeatedCompositeFieldContainer[Round]
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    model: str
    def __init__(self, session_id: _Optional[str] = ..., request_id: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., stats: _Optional[_Union[Stats, _Mapping]] = ..., trace: _Optional[_Iterable[_Union[Round, _Mapping]]] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ..., model: _Optional[str] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("text_delta", "token_ids", "offset", "rounds", "logprobs", "finish_reason", "usage", "stats", "session_id", "request_id")
    TEXT_DELTA_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    text_delta: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    rounds: _containers.RepeatedCompositeFieldContainer[Round]
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    finish_reason: FinishReason
    usage: Usage
    stats: Stats
    session_id: str
    request_id: str
    def __init__(self, text_delta: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., rounds: _Optional[_Iterable[_Union[Round, _Mapping]]] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., stats: _Optional[_Union[Stats, _Mapping]] = ..., session_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ("session_id", "status", "prompt_tokens", "total_tokens", "turns", "version", "created_at", "updated_at", "request_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    status: str
    prompt_tokens: int
    total_tokens: int
    turns: int
    version: int
    created_at: float
    updated_at: float
    request_id: str
    def __init__(self, session_id: _Optional[str] = ..., status: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ..., turns: _Optional[int] = ..., version: _Optional[int] = ..., created_at: _Optional[float] = ..., updated_at: _Optional[float] = ..., request_id: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("address", "role", "healthy", "error", "in_flight", "info")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    address: str
    role: str
    healthy: bool
    error: str
    in_flight: int
    info: _common_pb2.ModelInfo
    def __init__(self, address: _Optional[str] = ..., role: _Optional[str] = ..., healthy: _Optional[bool] = ..., error: _Optional[str] = ..., in_flight: _Optional[int] = ..., info: _Optional[_Union[_common_pb2.ModelInfo, _Mapping]] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("protocol_version", "target_model", "replicas")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TARGET_MODEL_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: str
    target_model: str
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    def __init__(self, protocol_version: _Optional[str] = ..., target_model: _Optional[str] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ...) -> None: ...
