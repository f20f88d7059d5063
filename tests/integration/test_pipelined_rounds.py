"""Pipelined rounds: round r+1 runs on the draft and target while round r's tokens go to Redis.

The store is the real Redis-backed SessionStore; the test only wraps it to slow its appends down
(and, once, to fail one), so the order of events is visible.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from orchestrator.session_types import StoreUnavailable
from specdec.v1 import orchestrator_pb2 as pb
from tests.prompts import IDENTITY_PROMPTS
from tests.support import tiny_stack

pytestmark = pytest.mark.integration
MAX_NEW, APPEND_DELAY_S = 24, 0.03


@pytest.fixture(scope="module")
def stack(tmp_path_factory, redis_server):
    with tiny_stack(tmp_path_factory.mktemp("tiny"), IDENTITY_PROMPTS, redis_server.url) as s:
        yield s


class Recorder:
    """Wraps runner.run and store.append of the orchestrator: times, and an optional failing append."""

    def __init__(self, stack, fail_append: int = 0) -> None:
        self.deps, self.events, self.fail_append = stack.deps, [], fail_append
        self.run, self.append = self.deps.runner.run, self.deps.store.append

    async def _run(self, req):
        self.events.append(("run", time.monotonic()))
        try:
            return await self.run(req)
        except asyncio.CancelledError:
            self.events.append(("cancelled", time.monotonic()))
            raise

    async def _append(self, *args, **kwargs):
        self.events.append(("append", time.monotonic()))
        if sum(1 for e in self.events if e[0] == "append") == self.fail_append:
            assert self.events[-2][0] == "run"  # fail while the next round is on the wire
            raise StoreUnavailable("injected: Redis went away")
        await asyncio.sleep(APPEND_DELAY_S)
        written = await self.append(*args, **kwargs)
        self.events.append(("stored", time.monotonic()))
        return written

    def __enter__(self) -> Recorder:
        self.deps.runner.run, self.deps.store.append = self._run, self._append
        return self

    def __exit__(self, *exc) -> None:
        self.deps.runner.run, self.deps.store.append = self.run, self.append


def generate(stack, session_id: str, stream: bool = False, stop: str = ""):
    channel, stub = stack.stub()
    req = pb.GenerateRequest(
        prompt=IDENTITY_PROMPTS[0],
        max_new_tokens=MAX_NEW,
        ignore_eos=True,
        k=2,
        session_id=session_id,
        create_session=True,
        stop=[stop] if stop else [],
    )
    try:
        if stream:
            return list(stub.GenerateStream(req, timeout=60))
        return stub.Generate(req, timeout=60)
    finally:
        channel.close()


def test_the_next_round_runs_while_the_previous_tokens_are_stored(stack):
    plain = list(generate(stack, "plain").token_ids)
    with Recorder(stack) as rec:
        piped = generate(stack, "piped")
    assert list(piped.token_ids) == plain
    # round r+1 starts (its calls go out) before round r's append, and runs while it is in flight; the
    # last round has no successor
    rounds = piped.stats.rounds
    assert rounds > 3
    assert [kind for kind, _ in rec.events] == ["run"] + ["run", "append", "stored"] * (rounds - 1) + [
        "append",
        "stored",
    ]


def test_a_failed_store_cancels_the_round_in_flight_and_streams_nothing_unstored(stack):
    with Recorder(stack, fail_append=3) as rec:
        channel, stub = stack.stub()
        req = pb.GenerateRequest(
            prompt=IDENTITY_PROMPTS[0],
            max_new_tokens=MAX_NEW,
            ignore_eos=True,
            k=2,
            session_id="fails",
            create_session=True,
        )
        received = []
        with pytest.raises(grpc.RpcError) as err:
            for chunk in stub.GenerateStream(req, timeout=60):
                received += chunk.token_ids
        channel.close()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "injected" in err.value.details()
    kinds = [kind for kind, _ in rec.events]
    assert kinds == ["run", "run", "append", "stored", "run", "append", "stored", "run", "append", "cancelled"]
    stored = stack.call(stack.deps.store.get("fails"))
    assert received == stored.completion_ids and len(received) > 0  # the client holds only what Redis holds


def test_a_stop_string_cancels_the_round_started_after_it(stack):
    """The next round starts before the text is decoded; the round whose text completes a stop string ends
    the generation, so the round started after it is cancelled and nothing past the stop is stored."""
    plain = generate(stack, "plain-for-stop")
    text = plain.text
    cut = next(i for i in range(len(text) // 2, len(text) - 3) if text[i : i + 3].strip() == text[i : i + 3])
    stop = text[cut : cut + 3]
    with Recorder(stack) as rec:
        stopped = generate(stack, "stopped", stop=stop)
    assert stopped.finish_reason == pb.FINISH_REASON_STOP and stopped.text == text[: text.index(stop)]
    kinds = [kind for kind, _ in rec.events]
    last_run = len(kinds) - 1 - kinds[::-1].index("run")
    assert kinds.count("run") == stopped.stats.rounds + 1 and kinds.index("cancelled") > last_run
    assert list(stopped.token_ids) == list(plain.token_ids[: len(stopped.token_ids)])
    stored = stack.call(stack.deps.store.get("stopped"))
    assert stored.completion_ids == list(stopped.token_ids)
