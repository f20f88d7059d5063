"""The OpenAI wire format as pydantic models: requests, responses, stream chunks, usage, errors.

Requests are strict (an int is not a bool, a string is not a number; an int is a float) and ignore
fields they do not know (OpenAI clients send many optional ones), except inside the `"specdec"`
extension, where an unknown name is refused. What a request asks for that cannot be expressed here
(wire ranges of the proto fields, lone surrogates, unsupported OpenAI features) is checked by
http_gateway/validation.py; the mapping to a GenerateRequest is http_gateway/openai_schema.py.

Responses are written with `model_dump()`: every field is written (null too, as OpenAI does),
except those a model names in OPTIONAL, which are left out when None (`usage` of a stream chunk,
the `specdec` extension's fields).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_serializer


def _number(value: Any) -> Any:
    """An int given for a float: converted here, so that one too large for a float is named as such."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise ValueError("is too large for a number") from None
    return value


Number = Annotated[float, BeforeValidator(_number)]


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class SpecdecOptions(_Request):
    """The `"specdec"` extension object of a request (openai client: `extra_body={"specdec": {...}}`)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    k: int | None = None
    draft_kind: str | None = None
    trace: bool | None = None
    session_id: str | None = None
    create_session: bool | None = None
    request_id: str | None = None
    resume_offset: int | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    max_rounds: int | None = None
    add_generation_prompt: bool | None = None
    adaptive_k: bool | None = None
    top_k: int | None = None  # SamplingParams
    repetition_penalty: Number | None = None  # SamplingParams
    draft_top_n: int | None = None  # SamplingParams


SAMPLING_OPTIONS = ("top_k", "repetition_penalty", "draft_top_n")  # extension fields that go to SamplingParams
VLLM_EXTRAS = ("top_k", "min_tokens", "ignore_eos", "repetition_penalty")  # also accepted at the top level


def _text_parts(content: Any) -> str:
    """Message content: a string, a list of {"type": "text", "text": ...} parts, or null (empty)."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise ValueError("must be a string or a list of text parts")
    parts = []
    for part in content:
        if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
            raise ValueError("only text parts are supported")
        parts.append(part["text"])
    return "".join(parts)


class ChatMessage(_Request):
    role: str
    content: Annotated[str, BeforeValidator(_text_parts)] = ""

    @field_validator("role")
    @classmethod
    def _developer_is_system(cls, role: str) -> str:
        return "system" if role == "developer" else role


def _one_prompt(prompt: Any) -> Any:
    """One prompt per request: a string, or a list holding one string."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        raise ValueError("token-id prompts are not supported; send the prompt as text")
    if not isinstance(prompt, str):
        raise ValueError("must be a string (one prompt per request)")
    if not prompt:
        raise ValueError("must not be empty")
    return prompt


def _stop_list(stop: Any) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise ValueError("must be a string or a list of strings")


class _GenerationRequest(_Request):
    """The fields /v1/completions and /v1/chat/completions share."""

    model: str | None = None
    n: Annotated[int, Field(ge=1)] | None = None
    best_of: Annotated[int, Field(ge=1, le=1)] | None = None
    echo: Literal[False] | None = None
    stream: bool | None = None
    stream_options: Any = None
    max_tokens: int | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    seed: int | None = None
    frequency_penalty: Number | None = None
    presence_penalty: Number | None = None
    stop: Annotated[list[str], BeforeValidator(_stop_list)] = []
    user: Any = None
    top_k: int | None = None  # vLLM's extras: the extension's fields of the same name
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    repetition_penalty: Number | None = None
    specdec: SpecdecOptions | None = None

    SAMPLING: ClassVar[tuple[str, ...]] = ("temperature", "top_p", "seed", "frequency_penalty", "presence_penalty")

    @property
    def include_usage(self) -> bool:
        opts = self.stream_options
        return bool(opts.get("include_usage")) if isinstance(opts, dict) else False

    @property
    def user_name(self) -> str | None:
        return self.user if isinstance(self.user, str) else None


class CompletionRequest(_GenerationRequest):
    prompt: Annotated[str, BeforeValidator(_one_prompt)]
    logprobs: Annotated[int, Field(ge=0)] | None = None


class ChatCompletionRequest(_GenerationRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


# -- responses ---------------------------------------------------------------------------------------


class _Wire(BaseModel):
    """A response object: the fields named in OPTIONAL are left out when None, the others always written."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _leave_out_unset(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        return {key: value for key, value in data.items() if value is not None or key not in self.OPTIONAL}


class PromptTokensDetails(_Wire):
    cached_tokens: int = 0


class Usage(_Wire):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = PromptTokensDetails()


class SpecdecResult(_Wire):
    """The per-request `"specdec"` object beside `usage` (stream chunks: token_ids and offset; the last: the rest)."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset(
        {
            "session_id",
            "request_id",
            "finish_reason",
            "finish_detail",
            "token_ids",
            "offset",
            "stats",
            "trace",
            "choices",
        }
    )

    session_id: str | None = None
    request_id: str | None = None
    finish_reason: str | None = None  # OpenAI's name: stop | length
    finish_detail: str | None = None  # which end: eos | stop | length | context | cancelled
    token_ids: list[int] | None = None
    offset: int | None = None
    stats: dict[str, Any] | None = None  # specdec.proto_json.stats_dict: every Stats field
    trace: list[dict[str, Any]] | None = None
    choices: list[dict[str, Any]] | None = None  # n > 1: each choice's extension, with its index


class TopLogprob(_Wire):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = []


class ChatLogprobs(_Wire):
    content: list[ChatTokenLogprob]


class CompletionLogprobs(_Wire):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int] = []


class AssistantMessage(_Wire):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(_Wire):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None


class CompletionChoice(_Wire):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None


class _Completion(_Wire):
    id: str
    object: str
    created: int
    model: str
    choices: list[Any]
    usage: Usage
    specdec: SpecdecResult


class ChatCompletion(_Completion):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]


class Completion(_Completion):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class Delta(_Wire):
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"role", "content"})

    role: Literal["assistant"] | None = None  # the first chunk of a choice only
    content: str | None = None


class ChatChunkChoice(_Wire):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class _Chunk(_Wire):
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"usage", "specdec"})

    id: str
    object: str
    created: int
    model: str
    choices: list[Any]
    specdec: SpecdecResult | None = None
    usage: Usage | None = None


class ChatCompletionChunk(_Chunk):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]


class CompletionChunk(_Chunk):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class ModelCard(_Wire):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "specdec"


class ModelList(_Wire):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(_Wire):
    message: str
    type: str
    param: str | None
    code: str


class ErrorResponse(_Wire):
    error: ErrorDetail
