"""OpenAI wire format <-> specdec.v1: request parsing and validation, responses, stream chunks, errors.

Pure functions (no I/O), so every mapping is unit-testable.

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

import grpc

from specdec.errors import IDEMPOTENCY_KEY_REUSED, REQUEST_IN_PROGRESS
from specdec.proto_json import message_to_dict
from specdec.v1 import orchestrator_pb2 as pb

from http_gateway import choices, validation
from http_gateway.validation import BadField, assign, typed

MODEL_ALIAS = "specdec"
SESSION_HEADER = "X-Specdec-Session"

FINISH_NAMES = {pb.FINISH_REASON_EOS: "eos", pb.FINISH_REASON_LENGTH: "length", pb.FINISH_REASON_STOP: "stop",
                pb.FINISH_REASON_CONTEXT: "context", pb.FINISH_REASON_CANCELLED: "cancelled",
                pb.FINISH_REASON_UNSPECIFIED: "unspecified"}
# OpenAI knows "stop" (natural end or stop sequence) and "length" (token or context limit).
OPENAI_FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length", "cancelled": "stop",
                 "unspecified": "stop"}

# gRPC status -> (HTTP status, OpenAI error type).
STATUS_MAP: dict[grpc.StatusCode, tuple[int, str]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error"),
    grpc.StatusCode.NOT_FOUND: (404, "not_found_error"),
    grpc.StatusCode.ALREADY_EXISTS: (409, "conflict_error"),
    grpc.StatusCode.ABORTED: (409, "conflict_error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable_error"),
    grpc.StatusCode.FAILED_PRECONDITION: (503, "service_unavailable_error"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout_error"),
}
INTERNAL = (500, "server_error")

# Extension fields: name -> (type(s), where in the GenerateRequest).
_EXT_REQUEST = {"k": int, "draft_kind": str, "trace": bool, "session_id": str, "create_session": bool,
                "request_id": str, "resume_offset": int, "ignore_eos": bool, "min_tokens": int,
                "max_rounds": int, "add_generation_prompt": bool, "adaptive_k": bool,
                "overlap": bool, "overlap_branches": int}
_EXT_SAMPLING = {"top_k": int, "repetition_penalty": float, "draft_top_n": int}
# Top-level OpenAI fields we map (others are ignored: OpenAI clients send many optional ones,
# except the features of http_gateway/validation.UNSUPPORTED, which are refused).
_SAMPLING_TOP = {"temperature": float, "top_p": float, "seed": int, "frequency_penalty": float,
                 "presence_penalty": float}
# vLLM's top-level extras (vLLM and SGLang clients send them): the extension's fields of the same name.
VLLM_EXTRAS = ("top_k", "min_tokens", "ignore_eos", "repetition_penalty")
TOP_K_OFF_VLLM = -1  # vLLM's "top_k disabled"; ours is 0


class ApiError(Exception):
    """An error the gateway answers with: HTTP status + OpenAI error object."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", param, code)


def from_grpc(code: grpc.StatusCode, details: str) -> ApiError:
    """The HTTP error for a gRPC status from the orchestrator."""
    status, type_ = STATUS_MAP.get(code, INTERNAL)
    err_code = code.name.lower() if code is not None else "internal"
    if code == grpc.StatusCode.NOT_FOUND and "session" in (details or ""):
        err_code = "session_not_found"
    for marker in (IDEMPOTENCY_KEY_REUSED, REQUEST_IN_PROGRESS):
        if marker in (details or ""):
            err_code = marker
    return ApiError(status, details or code.name, type_, None, err_code)


@dataclass
class Parsed:
    """A validated OpenAI request."""

    request: pb.GenerateRequest
    chat: bool
    stream: bool
    model: str
    include_usage: bool = False
    logprobs: int | None = None          # None = not asked
    session_id: str | None = None        # the session the request continues (header or extension)
    all_messages: list[dict[str, str]] = field(default_factory=list)
    user: str | None = None
    n: int = 1                           # choices (http_gateway/choices.py)


# -- messages, prompt, stop ------------------------------------------------------------------------


def _content_text(content: Any, i: int) -> str:
    """Message content: a string, or a list of {"type": "text", "text": ...} parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise bad_request(f"messages[{i}].content: only text parts are supported", f"messages[{i}].content")
            parts.append(part["text"])
        return "".join(parts)
    if content is None:
        return ""
    raise bad_request(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad_request("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request(f"messages[{i}] must be an object with a 'role'", f"messages[{i}]")
        role = "system" if m["role"] == "developer" else m["role"]
        out.append({"role": role, "content": _content_text(m.get("content"), i)})
    return out


def new_messages(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """With a session: the messages after the last assistant message (the session holds the rest)."""
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    tail = messages[last + 1:]
    if not tail:
        raise bad_request("with a session, the last message must be a new (user) message", "messages")
    return tail


def _prompt(body: dict[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        raise bad_request("token-id prompts are not supported; send the prompt as text", "prompt")
    if not isinstance(prompt, str):
        raise bad_request("'prompt' must be a string (one prompt per request)", "prompt")
    if not prompt:
        raise bad_request("'prompt' must not be empty", "prompt")
    return prompt


def _stop(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise bad_request("'stop' must be a string or a list of strings", "stop")


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
        return _parse(body, chat, session_header)
    except BadField as exc:
        raise bad_request(str(exc), exc.param) from None


def _parse(body: dict[str, Any], chat: bool, session_header: str | None) -> Parsed:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    n = typed(body, "n", int)
    if n is not None and n < 1:
        raise bad_request(f"'n' must be >= 1, got {n}", "n")
    if typed(body, "best_of", int) not in (None, 1):
        raise bad_request("only best_of=1 is supported", "best_of")
    if body.get("echo"):
        raise bad_request("echo is not supported", "echo")
    stream = bool(typed(body, "stream", bool))
    req = pb.GenerateRequest(stop=_stop(body))

    max_tokens = typed(body, "max_tokens", int)
    if chat and max_tokens is None:
        max_tokens = typed(body, "max_completion_tokens", int)
    if max_tokens is not None:
        limit = "max_completion_tokens" if body.get("max_tokens") is None else "max_tokens"
        assign(req, "max_new_tokens", max_tokens, limit)
    for name, kind in _SAMPLING_TOP.items():
        value = typed(body, name, kind)
        if value is not None:
            assign(req.sampling, name, value, name)

    logprobs = _logprobs(body, chat)
    if logprobs is not None:
        assign(req, "logprobs", logprobs, "top_logprobs" if chat else "logprobs")

    _apply_extension(req, body.get("specdec"), body)
    if session_header:
        if validation.lone_surrogate(session_header):  # aiohttp's decoding of bytes that are not UTF-8
            raise bad_request(f"header {SESSION_HEADER} is not valid UTF-8", SESSION_HEADER)
        if req.HasField("session_id") and req.session_id != session_header:
            raise bad_request(f"header {SESSION_HEADER} and specdec.session_id differ", "specdec.session_id")
        req.session_id = session_header
    session_id = req.session_id if req.HasField("session_id") else None
    if not req.HasField("request_id"):
        # Not a generation parameter: an id of our own makes the stream's chunk ids stable and lets a
        # client retry/resume the same generation (specdec.request_id in every response).
        req.request_id = uuid.uuid4().hex

    all_messages: list[dict[str, str]] = []
    if chat:
        all_messages = _messages(body)
        req.messages.SetInParent()
        for m in (new_messages(all_messages) if session_id else all_messages):
            req.messages.messages.add(role=m["role"], content=m["content"])
    else:
        req.prompt = _prompt(body)
    opts = body.get("stream_options") or {}
    include_usage = bool(opts.get("include_usage")) if isinstance(opts, dict) else False
    user = body.get("user") if isinstance(body.get("user"), str) else None
    n = n or 1
    if n > 1 and session_id:
        raise bad_request("n > 1 cannot be combined with a session: a session continues one conversation; "
                          "send n = 1", "n")
    if n > 1 and req.HasField("resume_offset"):
        raise bad_request("n > 1 cannot be combined with resume_offset: a resumed request continues one choice; "
                          "send n = 1", "n")
    return Parsed(req, chat, stream, model or MODEL_ALIAS, include_usage, logprobs, session_id, all_messages, user,
                  n)


def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
    """Completions: logprobs=N (0..); chat: logprobs=true + top_logprobs=N. None = not asked."""
    if chat:
        if not typed(body, "logprobs", bool):
            if body.get("top_logprobs") is not None:
                raise bad_request("'top_logprobs' requires 'logprobs': true", "top_logprobs")
            return None
        top = typed(body, "top_logprobs", int)
        return 0 if top is None else top
    value = typed(body, "logprobs", int)
    if value is not None and value < 0:
        raise bad_request("'logprobs' must be >= 0", "logprobs")
    return value


def _apply_extension(req: pb.GenerateRequest, ext: Any, body: dict[str, Any]) -> None:
    """The "specdec" object, and vLLM's top-level extras (VLLM_EXTRAS): one field given in both
    places must have the same value."""
    if ext is None:
        ext = {}
    if not isinstance(ext, dict):
        raise bad_request("'specdec' must be an object", "specdec")
    unknown = sorted(set(ext) - set(_EXT_REQUEST) - set(_EXT_SAMPLING))
    if unknown:
        known = ", ".join(sorted({*_EXT_REQUEST, *_EXT_SAMPLING}))
        raise bad_request(f"unknown field(s) in 'specdec': {', '.join(unknown)} (known: {known})",
                          f"specdec.{unknown[0]}")
    for table, target in ((_EXT_REQUEST, req), (_EXT_SAMPLING, req.sampling)):
        for name, kind in table.items():
            value = typed(ext, name, kind, "specdec.")
            param = f"specdec.{name}"
            if name in VLLM_EXTRAS and body.get(name) is not None:
                top = typed(body, name, kind)
                if value is not None and top != value:
                    raise bad_request(f"'{name}' ({top!r}) and 'specdec.{name}' ({value!r}) differ; give one",
                                      name)
                value, param = top, name
            if value is not None:
                assign(target, name, 0 if name == "top_k" and value == TOP_K_OFF_VLLM else value, param)


def model_matches(requested: str, served: str) -> bool:
    return requested in (MODEL_ALIAS, served)


# -- responses -------------------------------------------------------------------------------------


def usage(u: pb.Usage) -> dict[str, Any]:
    """The OpenAI usage object of one generation."""
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens, "prompt_tokens_details": {"cached_tokens": u.cached_prompt_tokens}}


def token_str(token_id: int) -> str:
    """The gateway has no tokenizer: logprob tokens are named 'token_id:N' (vLLM's convention)."""
    return f"token_id:{token_id}"


def completion_logprobs(lps: list[Any]) -> dict[str, Any]:
    return {"tokens": [token_str(t.token_id) for t in lps],
            "token_logprobs": [t.logprob for t in lps],
            "top_logprobs": [{token_str(i): lp for i, lp in zip(t.top_token_ids, t.top_logprobs)} for t in lps],
            "text_offset": []}


def chat_logprobs(lps: list[Any]) -> dict[str, Any]:
    return {"content": [{"token": token_str(t.token_id), "logprob": t.logprob, "bytes": None,
                         "top_logprobs": [{"token": token_str(i), "logprob": lp, "bytes": None}
                                          for i, lp in zip(t.top_token_ids, t.top_logprobs)]} for t in lps]}


def extension(session_id: str, request_id: str, finish: int | None, *, token_ids: list[int] | None = None,
              offset: int | None = None, stats: Any = None, trace: list[Any] | None = None) -> dict[str, Any]:
    """The per-request "specdec" field beside usage."""
    out: dict[str, Any] = {}
    if session_id:
        out["session_id"] = session_id
    if request_id:
        out["request_id"] = request_id
    if finish is not None:
        out["finish_reason"] = FINISH_NAMES.get(finish, "unspecified")
    if token_ids is not None:
        out["token_ids"] = list(token_ids)
    if offset is not None:
        out["offset"] = offset
    if stats is not None:
        out["stats"] = message_to_dict(stats, all_fields=True)
    if trace:
        out["trace"] = [message_to_dict(r, all_fields=True) for r in trace]
    return out


def response_body(parsed: Parsed, resp: pb.GenerateResponse, model: str) -> dict[str, Any]:
    """A whole (non-streamed) completion or chat completion."""
    finish = OPENAI_FINISH[FINISH_NAMES.get(resp.finish_reason, "unspecified")]
    lps = list(resp.logprobs) if parsed.logprobs is not None else None
    if parsed.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": resp.text},
                  "logprobs": chat_logprobs(lps) if lps is not None else None, "finish_reason": finish}
        obj, prefix = "chat.completion", "chatcmpl-"
    else:
        choice = {"index": 0, "text": resp.text, "logprobs": completion_logprobs(lps) if lps is not None else None,
                  "finish_reason": finish}
        obj, prefix = "text_completion", "cmpl-"
    return {"id": prefix + resp.request_id, "object": obj, "created": int(time.time()), "model": model,
            "choices": [choice], "usage": usage(resp.usage),
            "specdec": extension(resp.session_id, resp.request_id, resp.finish_reason,
                                 token_ids=list(resp.token_ids), stats=resp.stats, trace=list(resp.trace))}


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
    index: int = 0                  # the choice this writer's chunks belong to
    usage_chunk: bool = True        # False: with include_usage the caller sends one usage chunk for all choices
    _sent_role: bool = False

    def _base(self) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.parsed.chat else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _choice(self, text: str | None, finish: str | None, lps: list[Any] | None) -> dict[str, Any]:
        if self.parsed.chat:
            delta: dict[str, Any] = {}
            if not self._sent_role:
                delta["role"] = "assistant"
                self._sent_role = True
            if text is not None:
                delta["content"] = text
            return {"index": self.index, "delta": delta,
                    "logprobs": chat_logprobs(lps) if lps is not None else None, "finish_reason": finish}
        return {"index": self.index, "text": text or "",
                "logprobs": completion_logprobs(lps) if lps is not None else None, "finish_reason": finish}

    def usage_body(self, usages: list[dict[str, Any]]) -> dict[str, Any]:
        """The usage-only chunk (include_usage) for the usage of every choice."""
        return {**self._base(), "choices": [], "usage": choices.merged_usage(usages)}

    def chunks(self, chunk: pb.GenerateChunk) -> list[dict[str, Any]]:
        """The OpenAI chunks for one GenerateChunk (the final one may give a usage-only chunk too)."""
        if not self.id:
            self.id = stream_id(self.parsed, chunk.request_id)
        out = []
        lps = list(chunk.logprobs) if self.parsed.logprobs is not None else None
        final = chunk.HasField("finish_reason")
        if chunk.text_delta or chunk.token_ids or chunk.rounds or not final:
            body = self._base()
            body["choices"] = [self._choice(chunk.text_delta, None, lps)]
            body["specdec"] = extension("", "", None, token_ids=list(chunk.token_ids), offset=chunk.offset,
                                        trace=list(chunk.rounds))
            out.append(body)
        if final:
            body = self._base()
            finish = OPENAI_FINISH[FINISH_NAMES.get(chunk.finish_reason, "unspecified")]
            body["choices"] = [self._choice(None if self.parsed.chat else "", finish, None)]
            body["specdec"] = extension(chunk.session_id, chunk.request_id, chunk.finish_reason,
                                        stats=chunk.stats)
            if self.parsed.include_usage:
                out.append(body)
                if not self.usage_chunk:
                    return out
                body = self.usage_body([usage(chunk.usage)])
            else:
                body["usage"] = usage(chunk.usage)
            out.append(body)
        return out
