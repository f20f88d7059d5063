"""The start of one request: its session created or continued in Redis, its turn tokenized, its limits checked.

A retry of a request whose instance died waits for that instance's lease to expire, then takes the request over
(docs/reliability.md); a request that already finished is answered from what the session holds.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.deps import Deps
from orchestrator.idempotency import check_reuse
from orchestrator.prompting import Message
from orchestrator.session_store import Session, SessionBusy
from specdec.errors import InvalidArgument, NotFound
from specdec.params import GenerationParams, field_or_default
from specdec.proto_json import FINISH_BY_DETAIL
from specdec.v1 import orchestrator_pb2 as pb


@dataclass
class State:
    """The mutable state of one generation (its round state lives in `session`)."""

    session: Session  # as read when the request began
    ids: list[int]  # the whole context: prompt (all turns) + completion so far
    version: int  # the session's version after our last write
    prompt_len: int  # tokens before the completion
    completion: list[int] = field(default_factory=list)
    text: str = ""  # text delivered so far (after stop hold-back)
    finish: pb.FinishReason = pb.FINISH_REASON_UNSPECIFIED
    trace: list[pb.Round] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class RequestIds:
    """Who the request is: its session, its idempotency key and fingerprint, and the client's deadline."""

    session_id: str
    request_id: str
    fingerprint: str
    deadline: float | None  # time.monotonic() of the client's deadline (None = none)


async def begin(
    d: Deps, req: pb.GenerateRequest, params: GenerationParams, ids: RequestIds
) -> tuple[State, GenerationParams]:
    """Create or continue the session and register this request (idempotent on request_id). Returns its state and
    its parameters (a resumed request keeps the seed it started with)."""
    existing = await d.store.get(ids.session_id)  # a request_id alone may name one (keyed_session)
    if existing is None and req.HasField("session_id") and not field_or_default(req, "create_session"):
        raise NotFound(f"session {ids.session_id!r} does not exist; pass create_session=true to create it")
    check_reuse(existing, ids.session_id, ids.request_id, ids.fingerprint)
    turn = turn_ids(req, d, params, existing)
    resuming = existing is not None and existing.request_id == ids.request_id
    if not resuming:
        check_lengths(d, params, (len(existing.ids) if existing else 0) + len(turn))
    session = await _begin_request(d, params, ids, turn, existing is None, resuming)
    params = _keep_seed_of(session, ids.request_id, params)
    prompt_len = len(session.ids) - len(session.completion_ids)
    state = State(session, list(session.ids), session.version, prompt_len, list(session.completion_ids))
    if session.status == "idle" and session.request_id == ids.request_id and session.last_finish_reason:
        state.finish = FINISH_BY_DETAIL.get(session.last_finish_reason, pb.FINISH_REASON_UNSPECIFIED)
    return state, params


def _keep_seed_of(session: Session, request_id: str, params: GenerationParams) -> GenerationParams:
    """A resumed request continues with the seed it started with (stored in the session), so
    its remaining draws are the ones the first attempt would have made."""
    stored = session.params.get("seed") if session.request_id == request_id else None
    if stored is None or stored == params.sampling.seed:
        return params
    return replace(params, sampling=replace(params.sampling, seed=int(stored)))


async def _begin_request(
    d: Deps, params: GenerationParams, ids: RequestIds, turn: list[int], create: bool, resuming: bool
) -> Session:
    """begin_request; a retry of our own request waits for a dead instance's lease to expire."""
    give_up = time.monotonic() + d.cfg.lease.takeover_wait_s
    if ids.deadline is not None:
        give_up = min(give_up, ids.deadline)
    stored: dict[str, Any] = {"k": params.k, "max_new_tokens": params.max_new_tokens, "seed": params.sampling.seed}
    while True:
        try:
            session, _ = await d.store.begin_request(  # the same request_id, another fingerprint: refused
                ids.session_id,
                ids.request_id,
                d.owner,
                d.cfg.lease.seconds,
                turn,
                stored,
                create_missing=create,
                fingerprint=ids.fingerprint,
            )
            return session
        except SessionBusy:
            if not resuming or time.monotonic() + d.cfg.lease.poll_s >= give_up:
                raise
        await asyncio.sleep(d.cfg.lease.poll_s)


def turn_ids(req: pb.GenerateRequest, d: Deps, params: GenerationParams, existing: Session | None) -> list[int]:
    """Token ids of the new turn (closing the previous assistant turn when it lacked EOS)."""
    prompter, first = d.prompter, existing is None or not existing.ids
    which = req.WhichOneof("input")
    if which == "messages":
        msgs = [Message(m.role, m.content) for m in req.messages.messages]
        add = params.add_generation_prompt
        ids = prompter.first_turn(msgs, add) if first else prompter.next_turn(msgs, add)
    elif which == "prompt" and req.prompt:
        ids = prompter.encode_text(req.prompt, first_turn=first)
    else:
        raise InvalidArgument("the prompt is empty: give a prompt or chat messages")
    if not ids:
        raise InvalidArgument("the prompt tokenizes to nothing")
    if existing is not None and not first and existing.last_finish_reason not in ("", "eos") and which == "messages":
        ids = prompter.end_of_turn() + ids
    return ids


def check_lengths(d: Deps, params: GenerationParams, prompt_len: int) -> None:
    limits = d.cfg.limits
    if prompt_len > limits.max_prompt_tokens:
        raise InvalidArgument(f"the prompt has {prompt_len} tokens, over the limit of {limits.max_prompt_tokens}")
    if prompt_len + params.max_new_tokens > d.max_context:
        raise InvalidArgument(
            f"prompt ({prompt_len} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds "
            f"the model's context of {d.max_context} tokens"
        )
