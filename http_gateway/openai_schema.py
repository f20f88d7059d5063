"""OpenAI requests -> specdec.v1 GenerateRequests, GenerateResponses/Chunks -> OpenAI responses and chunks.

Pure functions (no I/O), so every mapping is unit-testable. The wire format itself is the pydantic
models of http_gateway/protocol.py; the errors are http_gateway/errors.py.

Defaults: a field the HTTP request leaves out stays UNSET in the GenerateRequest,
so the orchestrator applies the one defaults table (specdec/params.py), exactly
as for a gRPC request that leaves it unset. In particular temperature defaults to
0 (greedy, output identical to the target alone), NOT OpenAI's 1.0.

Speculative-decoding extras travel in an extension object, `"specdec": {...}`
(openai client: `extra_body={"specdec": {...}}`); per-request results come back
in a `"specdec"` field beside `usage`.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from http_gateway import choices, validation
from http_gateway import protocol as wire
from http_gateway.errors import bad_request
from http_gateway.validation import BadField
from specdec.proto_json import finish_detail, finish_reason, message_to_dict, stats_dict
from specdec.v1 import orchestrator_pb2 as pb

MODEL_ALIAS = "specdec"
SESSION_HEADER = "X-Specdec-Session"
TOP_K_OFF_VLLM = -1  # vLLM's "top_k disabled"; ours is 0


@dataclass
class Parsed:
    """A validated OpenAI request."""

    request: pb.GenerateRequest
    chat: bool
    stream: bool
    model: str
    include_usage: bool = False
    logprobs: int | None = None  # None = not asked
    session_id: str | None = None  # the session the request continues (header or extension)
    all_messages: list[dict[str, str]] = field(default_factory=list)
    user: str | None = None
    n: int = 1  # choices (http_gateway/choices.py)
    params: dict[str, str] = field(default_factory=dict)  # GenerateRequest field -> the request field that set it


class _Builder:
    """A GenerateRequest being filled: every value through validation.assign, remembering which field set it."""

    def __init__(self, stop: list[str]) -> None:
        self.request = pb.GenerateRequest(stop=stop)
        self.params: dict[str, str] = {}

    def set(self, name: str, value: Any, param: str, sampling: bool = False) -> None:
        if value is None:
            return
        validation.assign(self.request.sampling if sampling else self.request, name, value, param)
        self.params[name] = param


def new_messages(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """With a session: the messages after the last assistant message (the session holds the rest)."""
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    tail = messages[last + 1 :]
    if not tail:
        raise bad_request("with a session, the last message must be a new (user) message", "messages")
    return tail


# -- request ---------------------------------------------------------------------------------------


def parse_request(body: Any, *, chat: bool, session_header: str | None = None) -> Parsed:
    """An OpenAI /v1/completions or /v1/chat/completions body -> Parsed (ApiError 400 when invalid).

    Unset fields stay unset in the GenerateRequest (server defaults from specdec/params.py).
    """
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        validation.check_strings(body)
        validation.check_unsupported(body)
        model = validation.validated(wire.ChatCompletionRequest if chat else wire.CompletionRequest, body)
        return _translate(model, body, chat, session_header)
    except BadField as exc:
        raise bad_request(str(exc), exc.param) from None


def _translate(model: Any, body: dict[str, Any], chat: bool, session_header: str | None) -> Parsed:
    build = _Builder(model.stop)
    if chat and model.max_tokens is None:
        build.set("max_new_tokens", model.max_completion_tokens, "max_completion_tokens")
    else:
        build.set("max_new_tokens", model.max_tokens, "max_tokens")
    for name in wire.ChatCompletionRequest.SAMPLING:
        build.set(name, getattr(model, name), name, sampling=True)
    logprobs = _logprobs(model, chat)
    build.set("logprobs", logprobs, "top_logprobs" if chat else "logprobs")
    _apply_extension(build, model, body)
    req = build.request
    session_id = _session(req, session_header)
    if not req.HasField("request_id"):
        # Not a generation parameter: an id of our own makes the stream's chunk ids stable and lets a
        # client retry/resume the same generation (specdec.request_id in every response).
        req.request_id = uuid.uuid4().hex
    all_messages: list[dict[str, str]] = []
    if chat:
        all_messages = [{"role": m.role, "content": m.content} for m in model.messages]
        req.messages.SetInParent()
        for m in new_messages(all_messages) if session_id else all_messages:
            req.messages.messages.add(role=m["role"], content=m["content"])
    else:
        req.prompt = model.prompt
    n = model.n or 1
    if n > 1 and session_id:
        raise bad_request(
            "n > 1 cannot be combined with a session: a session continues one conversation; send n = 1", "n"
        )
    if n > 1 and req.HasField("resume_offset"):
        raise bad_request(
            "n > 1 cannot be combined with resume_offset: a resumed request continues one choice; send n = 1", "n"
        )
    return Parsed(
        req,
        chat,
        bool(model.stream),
        model.model or MODEL_ALIAS,
        model.include_usage,
        logprobs,
        session_id,
        all_messages,
        model.user_name,
        n,
        build.params,
    )


def _session(req: pb.GenerateRequest, header: str | None) -> str | None:
    """The session the request continues: the header and specdec.session_id must agree."""
    if header:
        if validation.lone_surrogate(header):  # aiohttp's decoding of bytes that are not UTF-8
            raise bad_request(f"header {SESSION_HEADER} is not valid UTF-8", SESSION_HEADER)
        if req.HasField("session_id") and req.session_id != header:
            raise bad_request(f"header {SESSION_HEADER} and specdec.session_id differ", "specdec.session_id")
        req.session_id = header
    return req.session_id if req.HasField("session_id") else None


def _logprobs(model: Any, chat: bool) -> int | None:
    """Completions: logprobs=N (0..); chat: logprobs=true + top_logprobs=N. None = not asked."""
    if not chat:
        return model.logprobs
    if not model.logprobs:
        if model.top_logprobs is not None:
            raise bad_request("'top_logprobs' requires 'logprobs': true", "top_logprobs")
        return None
    return 0 if model.top_logprobs is None else model.top_logprobs


def _apply_extension(build: _Builder, model: Any, body: dict[str, Any]) -> None:
    """The "specdec" object, and vLLM's top-level extras (protocol.VLLM_EXTRAS): one field given in both
    places must have the same value."""
    ext = model.specdec or wire.SpecdecOptions()
    for name in wire.SpecdecOptions.model_fields:
        value, param = getattr(ext, name), f"specdec.{name}"
        if name in wire.VLLM_EXTRAS and body.get(name) is not None:
            top = getattr(model, name)
            if value is not None and top != value:
                raise bad_request(f"'{name}' ({top!r}) and 'specdec.{name}' ({value!r}) differ; give one", name)
            value, param = top, name
        if name == "top_k" and value == TOP_K_OFF_VLLM:
            value = 0
        build.set(name, value, param, sampling=name in wire.SAMPLING_OPTIONS)


def model_matches(requested: str, served: str) -> bool:
    return requested in (MODEL_ALIAS, served)


# -- responses -------------------------------------------------------------------------------------


def usage(u: pb.Usage) -> dict[str, Any]:
    """The OpenAI usage object of one generation."""
    return wire.Usage(
        prompt_tokens=u.prompt_tokens,
        completion_tokens=u.completion_tokens,
        total_tokens=u.total_tokens,
        prompt_tokens_details=wire.PromptTokensDetails(cached_tokens=u.cached_prompt_tokens),
    ).model_dump()


def token_str(token_id: int) -> str:
    """The gateway has no tokenizer: logprob tokens are named 'token_id:N' (vLLM's convention)."""
    return f"token_id:{token_id}"


def completion_logprobs(lps: list[Any]) -> wire.CompletionLogprobs:
    return wire.CompletionLogprobs(
        tokens=[token_str(t.token_id) for t in lps],
        token_logprobs=[t.logprob for t in lps],
        top_logprobs=[{token_str(i): lp for i, lp in zip(t.top_token_ids, t.top_logprobs, strict=True)} for t in lps],
    )


def chat_logprobs(lps: list[Any]) -> wire.ChatLogprobs:
    return wire.ChatLogprobs(
        content=[
            wire.ChatTokenLogprob(
                token=token_str(t.token_id),
                logprob=t.logprob,
                top_logprobs=[
                    wire.TopLogprob(token=token_str(i), logprob=lp)
                    for i, lp in zip(t.top_token_ids, t.top_logprobs, strict=True)
                ],
            )
            for t in lps
        ]
    )


def extension(
    session_id: str,
    request_id: str,
    finish: int | None,
    *,
    token_ids: list[int] | None = None,
    offset: int | None = None,
    stats: Any = None,
    trace: list[Any] | None = None,
) -> dict[str, Any]:
    """The per-request "specdec" field beside usage."""
    return _extension(
        session_id, request_id, finish, token_ids=token_ids, offset=offset, stats=stats, trace=trace
    ).model_dump()


def _extension(
    session_id: str,
    request_id: str,
    finish: int | None,
    *,
    token_ids: list[int] | None = None,
    offset: int | None = None,
    stats: Any = None,
    trace: list[Any] | None = None,
) -> wire.SpecdecResult:
    return wire.SpecdecResult(
        session_id=session_id or None,
        request_id=request_id or None,
        finish_reason=None if finish is None else finish_reason(finish),
        finish_detail=None if finish is None else finish_detail(finish),
        token_ids=None if token_ids is None else list(token_ids),
        offset=offset,
        stats=None if stats is None else stats_dict(stats),
        trace=[message_to_dict(r, all_fields=True) for r in trace] if trace else None,
    )


def response_body(parsed: Parsed, resp: pb.GenerateResponse, model: str) -> dict[str, Any]:
    """A whole (non-streamed) completion or chat completion."""
    finish = finish_reason(resp.finish_reason)
    lps = list(resp.logprobs) if parsed.logprobs is not None else None
    ext = _extension(
        resp.session_id,
        resp.request_id,
        resp.finish_reason,
        token_ids=list(resp.token_ids),
        stats=resp.stats,
        trace=list(resp.trace),
    )
    common = {"created": int(time.time()), "model": model, "usage": usage(resp.usage), "specdec": ext}
    if parsed.chat:
        chat = wire.ChatChoice(
            index=0,
            message=wire.AssistantMessage(content=resp.text),
            finish_reason=finish,
            logprobs=chat_logprobs(lps) if lps is not None else None,
        )
        return wire.ChatCompletion(id="chatcmpl-" + resp.request_id, choices=[chat], **common).model_dump()
    text = wire.CompletionChoice(
        index=0, text=resp.text, finish_reason=finish, logprobs=completion_logprobs(lps) if lps is not None else None
    )
    return wire.Completion(id="cmpl-" + resp.request_id, choices=[text], **common).model_dump()


def stream_id(parsed: Parsed, request_id: str) -> str:
    """The id every chunk of a stream carries: the request id of its first message (or of the request)."""
    prefix = "chatcmpl-" if parsed.chat else "cmpl-"
    return prefix + (request_id or parsed.request.request_id or "stream")


@dataclass
class ChunkWriter:
    """Turns GenerateChunks into OpenAI stream chunks (one id and creation time per stream)."""

    parsed: Parsed
    model: str
    created: int = field(default_factory=lambda: int(time.time()))
    id: str = ""
    index: int = 0  # the choice this writer's chunks belong to
    usage_chunk: bool = True  # False: with include_usage the caller sends one usage chunk for all choices
    _sent_role: bool = False

    def _body(self, choice: Any, ext: wire.SpecdecResult | None = None, usage_: Any = None) -> dict[str, Any]:
        kind = wire.ChatCompletionChunk if self.parsed.chat else wire.CompletionChunk
        return kind(
            id=self.id,
            created=self.created,
            model=self.model,
            choices=[choice] if choice else [],
            specdec=ext,
            usage=usage_,
        ).model_dump()

    def _choice(self, text: str | None, finish: str | None, lps: list[Any] | None) -> Any:
        if self.parsed.chat:
            delta = wire.Delta(role=None if self._sent_role else "assistant", content=text)
            self._sent_role = True
            return wire.ChatChunkChoice(
                index=self.index,
                delta=delta,
                finish_reason=finish,
                logprobs=chat_logprobs(lps) if lps is not None else None,
            )
        return wire.CompletionChoice(
            index=self.index,
            text=text or "",
            finish_reason=finish,
            logprobs=completion_logprobs(lps) if lps is not None else None,
        )

    def usage_body(self, usages: list[dict[str, Any]]) -> dict[str, Any]:
        """The usage-only chunk (include_usage) for the usage of every choice."""
        return self._body(None, usage_=choices.merged_usage(usages))

    def chunks(self, chunk: pb.GenerateChunk) -> list[dict[str, Any]]:
        """The OpenAI chunks for one GenerateChunk (the final one may give a usage-only chunk too)."""
        if not self.id:
            self.id = stream_id(self.parsed, chunk.request_id)
        out = []
        lps = list(chunk.logprobs) if self.parsed.logprobs is not None else None
        final = chunk.HasField("finish_reason")
        if chunk.text_delta or chunk.token_ids or chunk.rounds or not final:
            ext = _extension(
                "", "", None, token_ids=list(chunk.token_ids), offset=chunk.offset, trace=list(chunk.rounds)
            )
            out.append(self._body(self._choice(chunk.text_delta, None, lps), ext))
        if final:
            choice = self._choice(None if self.parsed.chat else "", finish_reason(chunk.finish_reason), None)
            ext = _extension(chunk.session_id, chunk.request_id, chunk.finish_reason, stats=chunk.stats)
            if not self.parsed.include_usage:
                return [*out, self._body(choice, ext, usage(chunk.usage))]
            out.append(self._body(choice, ext))
            if self.usage_chunk:
                out.append(self.usage_body([usage(chunk.usage)]))
        return out
