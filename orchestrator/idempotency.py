"""Idempotency keys: a request_id names ONE request of its session.

A retry with the same session_id and request_id resumes (or, when finished, returns) that
request. To make "the same request" checkable, every request stores a fingerprint of the
fields that decide its output in the session's hash in Redis (field `fingerprint`, compared
by the store's begin script, atomically with the request's start: SessionStore.begin_request):

  input (prompt, or chat messages with their roles), max_new_tokens, k, draft_kind,
  adaptive_k, max_rounds, stop, ignore_eos, min_tokens, logprobs, add_generation_prompt,
  and the sampling parameters (seed only when the client set one: an unset seed is drawn
  per request and kept for its retries).

Not in it: resume_offset (a retry names the tokens it holds), trace (what is reported, not
what is generated), create_session, and the ids themselves; `stream` is not a request field
(Generate and GenerateStream run the same generation). The key reused with a different
fingerprint is ALREADY_EXISTS (`IDEMPOTENCY_KEY_REUSED`); the same request sent again while
it is still generating in this process is ABORTED (`REQUEST_IN_PROGRESS`) instead of a
second writer racing the first.

A request_id without a session_id is a key too, for the session store's TTL (as Stripe's
idempotency keys are): its first use claims it for the fresh session that request runs in
(`keyed_session`, SessionStore.claim_request_key), and every later request with that key runs
in the same session, so the checks above apply to it unchanged: a retry replays or resumes,
another request is ALREADY_EXISTS.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from specdec.errors import IDEMPOTENCY_KEY_REUSED, REQUEST_IN_PROGRESS, Aborted, AlreadyExists, InvalidArgument
from specdec.params import GenerationParams

FINGERPRINT_HEX = 32  # 128 bits of SHA-256


def request_fingerprint(request: Any, params: GenerationParams) -> str:
    """Hex digest of what decides a GenerateRequest's output (resolved values: unset == default)."""
    which = request.WhichOneof("input")
    if which == "messages":
        source: Any = [[m.role, m.content] for m in request.messages.messages]
    else:
        source = request.prompt if which == "prompt" else None
    sampling = dataclasses.asdict(params.sampling)
    explicit_seed = request.HasField("sampling") and request.sampling.HasField("seed")
    sampling["seed"] = params.sampling.seed if explicit_seed else None
    doc = {
        "input": [which, source],
        "sampling": sampling,
        "stop": list(params.stop),
        **{
            name: getattr(params, name)
            for name in (
                "max_new_tokens",
                "k",
                "draft_kind",
                "adaptive_k",
                "max_rounds",
                "ignore_eos",
                "min_tokens",
                "logprobs",
                "add_generation_prompt",
            )
        },
    }
    text = json.dumps(doc, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:FINGERPRINT_HEX]


def reused(session_id: str, request_id: str) -> AlreadyExists:
    """The error of a request_id reused for a different request."""
    return AlreadyExists(
        f"{IDEMPOTENCY_KEY_REUSED}: request_id {request_id!r} of session {session_id!r} was already used for "
        f"a different request (prompt/messages, sampling, limits, stop or draft settings differ); a retry "
        f"must repeat the request (only resume_offset, trace and streaming may change); give a new "
        f"request a new request_id"
    )


def check_reuse(session: Any, session_id: str, request_id: str, fingerprint: str) -> None:
    """ALREADY_EXISTS when the session's latest request has this request_id and another fingerprint.

    A session stored before fingerprints existed (fingerprint "") is taken as the same request. The
    session store checks the same atomically when the request begins (SessionStore.begin_request).
    """
    if session is None or session.request_id != request_id:
        return
    if session.fingerprint and session.fingerprint != fingerprint:
        raise reused(session_id, request_id)


@dataclass
class RunningRequests:
    """The requests generating in this orchestrator process: (session_id, request_id) -> fingerprint."""

    keys: dict[tuple[str, str], str] = field(default_factory=dict)

    def enter(self, session_id: str, request_id: str, fingerprint: str) -> None:
        """Register a request: ALREADY_EXISTS when its key is generating here for a different request,
        ABORTED when the same request is generating here already."""
        running = self.keys.get((session_id, request_id))
        if running is not None:
            check_reuse(_Latest(request_id, running), session_id, request_id, fingerprint)
            raise Aborted(
                f"{REQUEST_IN_PROGRESS}: request_id {request_id!r} of session {session_id!r} is still generating "
                f"(an earlier call with the same request is running); retry after it finished to get its "
                f"result, or with resume_offset to continue a stream after the tokens you hold"
            )
        self.keys[(session_id, request_id)] = fingerprint

    def leave(self, session_id: str, request_id: str) -> None:
        self.keys.pop((session_id, request_id), None)

    def __len__(self) -> int:
        """Generations running here (adaptive k's latency cap counts the sessions waiting for the target)."""
        return len(self.keys)


@dataclass
class _Latest:
    """What check_reuse reads of a session."""

    request_id: str
    fingerprint: str


async def keyed_session(store: Any, request: Any, max_id_chars: int) -> str:
    """The session of a request that gives a request_id but no session_id: the one its key was claimed for
    (a fresh one on the key's first use); "" for any other request (it names its session, or has no key)."""
    if request.HasField("session_id") or not request.HasField("request_id"):
        return ""
    check_id("request_id", request.request_id, max_id_chars)
    return await store.claim_request_key(request.request_id, uuid.uuid4().hex)


def check_id(name: str, value: str, max_chars: int) -> None:
    """Session and request ids: non-empty, at most max_chars characters (INVALID_ARGUMENT)."""
    if not value:
        raise InvalidArgument(f"{name} must not be empty (leave it unset for a new one)")
    if len(value) > max_chars:
        raise InvalidArgument(f"{name} is longer than {max_chars} characters")
