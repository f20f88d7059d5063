from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "seed", "repetition_penalty", "frequency_penalty", "presence_penalty", "draft_top_n")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOP_N_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    seed: int
    repetition_penalty: float
    frequency_penalty: float
    presence_penalty: float
    draft_top_n: int
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., repetition_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., draft_top_n: _Optional[int] = ...) -> None: ...

class SparseDistribution(_message.Message):
    __slots__ = ("token_ids", "probs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    probs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., probs: _Optional[_Iterable[float]] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "logprob", "top_token_ids", "top_logprobs")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    top_token_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., top_token_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class HiddenStates(_message.Message):
    __slots__ = ("data", "rows", "hidden_size", "dtype", "first_position")
    DATA_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    FIRST_POSITION_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    rows: int
    hidden_size: int
    dtype: str
    first_position: int
    def __init__(self, data: _Optional[bytes] = ..., rows: _Optional[int] = ..., hidden_size: _Optional[int] = ..., dtype: _Optional[str] = ..., first_position: _Optional[int] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("protocol_version", "role", "model_id", "draft_kind", "vocab_size", "logits_width", "tokenizer_fingerprint", "eos_token_ids", "max_context", "special_tokens", "device", "dtype", "hidden_size", "cache_budget_bytes", "max_k", "max_batch", "needs_target_hidden", "keeps_hidden", "context_delta", "context_store_tokens")
    class SpecialTokensEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    DRAFT_KIND_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    LOGITS_WIDTH_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    CACHE_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_K_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    NEEDS_TARGET_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    KEEPS_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_DELTA_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_STORE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: str
    role: str
    model_id: str
    draft_kind: str
    vocab_size: int
    logits_width: int
    tokenizer_fingerprint: str
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    max_context: int
    special_tokens: _containers.ScalarMap[str, int]
    device: str
    dtype: str
    hidden_size: int
    cache_budget_bytes: int
    max_k: int
    max_batch: int
    needs_target_hidden: bool
    keeps_hidden: bool
    context_delta: bool
    context_store_tokens: int
    def __init__(self, protocol_version: _Optional[str] = ..., role: _Optional[str] = ..., model_id: _Optional[str] = ..., draft_kind: _Optional[str] = ..., vocab_size: _Optional[int] = ..., logits_width: _Optional[int] = ..., tokenizer_fingerprint: _Optional[str] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., max_context: _Optional[int] = ..., special_tokens: _Optional[_Mapping[str, int]] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., hidden_size: _Optional[int] = ..., cache_budget_bytes: _Optional[int] = ..., max_k: _Optional[int] = ..., max_batch: _Optional[int] = ..., needs_target_hidden: _Optional[bool] = ..., keeps_hidden: _Optional[bool] = ..., context_delta: _Optional[bool] = ..., context_store_tokens: _Optional[int] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class ComputeStats(_message.Message):
    __slots__ = ("cached_tokens", "computed_tokens", "rolled_back", "forward_ms", "queue_ms", "batch_size", "batch_tokens", "service_ms")
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ROLLED_BACK_FIELD_NUMBER: _ClassVar[int]
    FORWARD_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SERVICE_MS_FIELD_NUMBER: _ClassVar[int]
    cached_tokens: int
    computed_tokens: int
    rolled_back: int
    forward_ms: float
    queue_ms: float
    batch_size: int
    batch_tokens: int
    service_ms: float
    def __init__(self, cached_tokens: _Optional[int] = ..., computed_tokens: _Optional[int] = ..., rolled_back: _Optional[int] = ..., forward_ms: _Optional[float] = ..., queue_ms: _Optional[float] = ..., batch_size: _Optional[int] = ..., batch_tokens: _Optional[int] = ..., service_ms: _Optional[float] = ...) -> None: ...

class ServiceStats(_message.Message):
    __slots__ = ("calls", "failures", "in_flight", "cached_sessions", "cache_used_bytes", "cache_budget_bytes", "cache_hits", "cache_misses", "cache_rollbacks", "rolled_back_tokens", "cache_evictions", "computed_tokens", "reused_tokens", "last_call_ok", "last_error", "batches", "batched_calls", "context_hits", "context_misses", "context_evictions")
    CALLS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    CACHED_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    CACHE_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CACHE_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    CACHE_MISSES_FIELD_NUMBER: _ClassVar[int]
    CACHE_ROLLBACKS_FIELD_NUMBER: _ClassVar[int]
    ROLLED_BACK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REUSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LAST_CALL_OK_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    BATCHED_CALLS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_HITS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_MISSES_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    calls: int
    failures: int
    in_flight: int
    cached_sessions: int
    cache_used_bytes: int
    cache_budget_bytes: int
    cache_hits: int
    cache_misses: int
    cache_rollbacks: int
    rolled_back_tokens: int
    cache_evictions: int
    computed_tokens: int
    reused_tokens: int
    last_call_ok: bool
    last_error: str
    batches: int
    batched_calls: int
    context_hits: int
    context_misses: int
    context_evictions: int
    def __init__(self, calls: _Optional[int] = ..., failures: _Optional[int] = ..., in_flight: _Optional[int] = ..., cached_sessions: _Optional[int] = ..., cache_used_bytes: _Optional[int] = ..., cache_budget_bytes: _Optional[int] = ..., cache_hits: _Optional[int] = ..., cache_misses: _Optional[int] = ..., cache_rollbacks: _Optional[int] = ..., rolled_back_tokens: _Optional[int] = ..., cache_evictions: _Optional[int] = ..., computed_tokens: _Optional[int] = ..., reused_tokens: _Optional[int] = ..., last_call_ok: _Optional[bool] = ..., last_error: _Optional[str] = ..., batches: _Optional[int] = ..., batched_calls: _Optional[int] = ..., context_hits: _Optional[int] = ..., context_misses: _Optional[int] = ..., context_evictions: _Optional[int] = ...) -> None: ...
