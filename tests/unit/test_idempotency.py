"""Idempotency keys (orchestrator/idempotency.py) and the request checks of specdec/params.py: pure, no servers."""

from __future__ import annotations

import grpc
import pytest

from orchestrator.idempotency import RunningRequests, check_reuse, request_fingerprint
from specdec.config import Limits
from specdec.errors import IDEMPOTENCY_KEY_REUSED, REQUEST_IN_PROGRESS, InvalidArgument, SpecDecError
from specdec.params import resolve_generation
from specdec.v1 import common_pb2
from specdec.v1 import orchestrator_pb2 as pb


def fingerprint(**fields) -> str:
    request = pb.GenerateRequest(**fields)
    return request_fingerprint(request, resolve_generation(request, Limits()))


BASE = dict(prompt="hello", max_new_tokens=8)


def test_fields_that_do_not_change_the_output_do_not_change_the_fingerprint():
    want = fingerprint(**BASE)
    assert fingerprint(**BASE, resume_offset=5) == want
    assert fingerprint(**BASE, trace=True) == want
    assert fingerprint(**BASE, session_id="s", create_session=True, request_id="r") == want
    # an unset field and its default are the same request; so is an unset seed (drawn per request); an unset k is
    # adaptive k with the default cap (greedy)
    assert fingerprint(**BASE, k=4, adaptive_k=True, sampling=common_pb2.SamplingParams(temperature=0.0)) == want


@pytest.mark.parametrize(
    "change",
    [
        dict(prompt="hello!"),
        dict(max_new_tokens=9),
        dict(k=2),
        dict(draft_kind="ngram"),
        dict(stop=["x"]),
        dict(ignore_eos=True),
        dict(min_tokens=1),
        dict(logprobs=0),
        dict(max_rounds=3),
        dict(adaptive_k=False),
        dict(add_generation_prompt=False),
        dict(sampling=common_pb2.SamplingParams(temperature=0.5)),
        dict(sampling=common_pb2.SamplingParams(seed=1)),
        dict(sampling=common_pb2.SamplingParams(top_k=3)),
    ],
)
def test_fields_that_change_the_output_change_the_fingerprint(change):
    assert fingerprint(**{**BASE, **change}) != fingerprint(**BASE)


def test_chat_messages_are_fingerprinted_with_their_roles():
    def chat(*pairs):
        req = pb.GenerateRequest(max_new_tokens=4)
        for role, content in pairs:
            req.messages.messages.add(role=role, content=content)
        return request_fingerprint(req, resolve_generation(req, Limits()))

    assert chat(("user", "hi")) == chat(("user", "hi"))
    assert chat(("user", "hi")) != chat(("system", "hi"))
    assert chat(("user", "hi")) != fingerprint(prompt="hi", max_new_tokens=4)


class Stored:
    def __init__(self, request_id: str, fingerprint: str) -> None:
        self.request_id, self.fingerprint = request_id, fingerprint


def test_check_reuse():
    check_reuse(None, "s", "r", "f1")  # new session
    check_reuse(Stored("other", "f0"), "s", "r", "f1")  # a new request on the session
    check_reuse(Stored("r", "f1"), "s", "r", "f1")  # a true retry
    check_reuse(Stored("r", ""), "s", "r", "f1")  # stored before fingerprints existed
    with pytest.raises(SpecDecError) as err:
        check_reuse(Stored("r", "f0"), "s", "r", "f1")
    assert err.value.code == grpc.StatusCode.ALREADY_EXISTS and str(err.value).startswith(IDEMPOTENCY_KEY_REUSED)


def test_running_requests():
    running = RunningRequests()
    running.enter("s", "r", "f1")
    running.enter("s", "r2", "f1")  # another key: no conflict here
    with pytest.raises(SpecDecError) as err:
        running.enter("s", "r", "f1")
    assert err.value.code == grpc.StatusCode.ABORTED and str(err.value).startswith(REQUEST_IN_PROGRESS)
    with pytest.raises(SpecDecError) as err:
        running.enter("s", "r", "f2")
    assert err.value.code == grpc.StatusCode.ALREADY_EXISTS
    assert len(running) == 2  # what adaptive k's latency cap counts
    running.leave("s", "r")
    assert len(running) == 1
    running.enter("s", "r", "f2")


def test_logprobs_minus_one_is_refused_when_set_and_draft_kind_lists_combined():
    with pytest.raises(InvalidArgument, match=r"logprobs must be in \[0, "):
        resolve_generation(pb.GenerateRequest(prompt="x", logprobs=-1), Limits())
    assert resolve_generation(pb.GenerateRequest(prompt="x"), Limits()).logprobs == -1  # unset: none
    assert resolve_generation(pb.GenerateRequest(prompt="x", logprobs=0), Limits()).logprobs == 0
    with pytest.raises(InvalidArgument) as err:
        resolve_generation(pb.GenerateRequest(prompt="x", draft_kind="bogus"), Limits())
    assert "'combined'" in str(err.value) and "'model'" in str(err.value) and "'ngram'" in str(err.value)
    assert resolve_generation(pb.GenerateRequest(prompt="x", draft_kind="combined"), Limits()).draft_kind == "combined"
