"""What the Python client's calls return (specdec/client.py): whole results, stream chunks, errors,
and the bookkeeping that lets a retried stream resume without delivering a token twice.

The stats are ``specdec.proto_json.stats_dict`` (every field, as the HTTP API and
``specdec generate --json`` give them), ``finish_reason`` OpenAI's name and ``finish_detail`` which
end it was (specdec/proto_json.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc

from specdec.proto_json import finish_detail, finish_reason, message_to_dict, stats_dict
from specdec.v1 import orchestrator_pb2 as pb


class ClientError(Exception):
    """A call failed: `code` is the gRPC status code, `details` the server's message."""

    def __init__(self, code: grpc.StatusCode, details: str, attempts: int = 1) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code, self.details, self.attempts = code, details, attempts


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_prompt_tokens: int = 0


@dataclass(frozen=True)
class GenerateResult:
    """One whole generation."""

    text: str
    token_ids: list[int]
    finish_reason: str  # OpenAI's name: "stop" | "length" (specdec/proto_json.py)
    usage: Usage
    stats: dict[str, Any]
    trace: list[dict[str, Any]]  # the per-round table (with trace=True)
    session_id: str
    request_id: str
    model: str = ""
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    attempts: int = 1  # calls made (1 + retries)
    finish_detail: str = ""  # which end: "eos" | "stop" | "length" | "context" | "cancelled"


@dataclass(frozen=True)
class Chunk:
    """One piece of a stream; the last one has finish_reason, usage and stats."""

    text: str
    token_ids: list[int]
    offset: int  # completion-token offset of token_ids[0]
    rounds: list[dict[str, Any]] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None
    stats: dict[str, Any] | None = None
    session_id: str = ""
    request_id: str = ""
    finish_detail: str | None = None


def _to_dict(message: Any) -> dict[str, Any]:
    """Every field, int64 counters as ints (specdec/proto_json.py)."""
    return message_to_dict(message, all_fields=True)


def _usage(u: pb.Usage) -> Usage:
    return Usage(u.prompt_tokens, u.completion_tokens, u.total_tokens, u.cached_prompt_tokens)


def result_from_response(resp: pb.GenerateResponse, attempts: int = 1) -> GenerateResult:
    return GenerateResult(
        text=resp.text,
        token_ids=list(resp.token_ids),
        finish_reason=finish_reason(resp.finish_reason),
        usage=_usage(resp.usage),
        stats=stats_dict(resp.stats),
        trace=[_to_dict(r) for r in resp.trace],
        session_id=resp.session_id,
        request_id=resp.request_id,
        model=resp.model,
        logprobs=[_to_dict(t) for t in resp.logprobs],
        attempts=attempts,
        finish_detail=finish_detail(resp.finish_reason),
    )


def collect(chunks: Iterable[Chunk]) -> GenerateResult:
    """A whole result from a stream's chunks."""
    text, ids, rounds, lps, last = [], [], [], [], None
    for c in chunks:
        text.append(c.text)
        ids += c.token_ids
        rounds += c.rounds
        lps += c.logprobs
        last = c
    if last is None or last.finish_reason is None:
        raise ClientError(grpc.StatusCode.INTERNAL, "the stream ended without a final chunk")
    return GenerateResult(
        "".join(text),
        ids,
        last.finish_reason,
        last.usage or Usage(),
        last.stats or {},
        rounds,
        last.session_id,
        last.request_id,
        logprobs=lps,
        finish_detail=last.finish_detail or "",
    )


class StreamResume:
    """Bookkeeping of one streamed generation across retries: never deliver a token twice."""

    def __init__(self, request: pb.GenerateRequest) -> None:
        self.request = request
        self.received = int(request.resume_offset) if request.HasField("resume_offset") else 0
        self.done = False

    def next_request(self) -> pb.GenerateRequest:
        req = pb.GenerateRequest()
        req.CopyFrom(self.request)
        if self.received:
            req.resume_offset = self.received
        return req

    def accept(self, c: pb.GenerateChunk) -> Chunk | None:
        """The chunk to deliver (tokens before `received` dropped), or None for a pure duplicate."""
        final = c.HasField("finish_reason")
        ids, offset = list(c.token_ids), int(c.offset)
        skip = max(0, self.received - offset) if ids else 0
        if ids and skip >= len(ids) and not final:
            return None  # all of it was delivered before the retry
        if skip:
            # Only possible when a server replays more than asked; its text cannot be split by token.
            raise ClientError(
                grpc.StatusCode.INTERNAL,
                f"resumed stream overlaps: chunk at offset {offset}, {self.received} tokens held",
            )
        ids = ids[skip:]
        self.received = max(self.received, offset + len(ids)) if ids else self.received
        self.done = final
        return Chunk(
            text=c.text_delta,
            token_ids=ids,
            offset=offset + skip,
            rounds=[_to_dict(r) for r in c.rounds],
            logprobs=[_to_dict(t) for t in c.logprobs],
            finish_reason=finish_reason(c.finish_reason) if final else None,
            usage=_usage(c.usage) if final else None,
            stats=stats_dict(c.stats) if final else None,
            session_id=c.session_id,
            request_id=c.request_id,
            finish_detail=finish_detail(c.finish_reason) if final else None,
        )
