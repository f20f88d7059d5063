"""Delta rounds end to end: real servicers over loopback gRPC, sessions in a real Redis.

Each test runs a greedy generation while the replicas lose or change what they hold of the
session's context between rounds (eviction, a restart's empty store, another client's context
under the same session: a hash mismatch), and checks that the orchestrator resent the whole
context in the same round (Stats.context_resends) and that the tokens are those of an undisturbed
run. Old clients (full form, no prefix hash) and old services (Info without context_delta) keep
working. Replica failover and restarts as separate processes run on this path in
tests/integration/test_reliability_scenarios.py.
"""

from __future__ import annotations

import uuid

import grpc
import pytest

from specdec.core.prefix_hash import prefix_hash
from specdec.errors import CONTEXT_MISS_METADATA
from specdec.v1 import draft_pb2, draft_pb2_grpc, target_pb2, target_pb2_grpc
from specdec.v1 import orchestrator_pb2 as pb
from tests.prompts import IDENTITY_PROMPTS
from tests.support import InProcessStack, make_tiny_pair

pytestmark = pytest.mark.integration

K = 4
MAX_NEW = 40
LONG_PROMPT = " ".join(IDENTITY_PROMPTS) * 3  # a few hundred tokens: the full form is much larger


@pytest.fixture(scope="module")
def stack(tmp_path_factory, redis_server):
    target_dir, draft_dir = make_tiny_pair(tmp_path_factory.mktemp("tiny"), IDENTITY_PROMPTS)
    s = InProcessStack(target_model=str(target_dir), draft_model=str(draft_dir), redis_url=redis_server.url).start()
    yield s
    s.stop()


def servicers(stack):
    return {"target": stack.target_servicer, "draft": stack.draft_servicer}


def stream(stack, prompt: str, between=None, sid: str = "") -> tuple[list[int], pb.Stats]:
    """A greedy generation; `between(session_id)` runs on the stack's loop after the first chunk."""
    channel, stub = stack.stub()
    sid = sid or f"delta-{uuid.uuid4().hex[:8]}"
    req = pb.GenerateRequest(
        prompt=prompt, k=K, max_new_tokens=MAX_NEW, ignore_eos=True, session_id=sid, create_session=True
    )
    tokens, stats, done = [], None, False
    for chunk in stub.GenerateStream(req, timeout=120):
        tokens += list(chunk.token_ids)
        if chunk.HasField("stats"):
            stats = chunk.stats
        if between is not None and not done and tokens:
            stack.call(between(sid))
            done = True
    channel.close()
    return tokens, stats


def evict(roles):
    async def run(sid):
        for servicer in roles:
            assert servicer.context_store().release(sid)

    return run


def restart(roles):
    async def run(sid):
        for servicer in roles:
            servicer._contexts = None  # what a restarted replica holds: nothing

    return run


def rewrite(roles):
    """Another client's call on the same session with a context of the same length (other tokens)."""

    async def run(sid):
        for servicer in roles:
            store = servicer.context_store()
            held = store._held[sid].tokens
            store.resolve(sid, [held[0]] + [(t + 1) % 100 for t in held[1:]], 0, None)

    return run


@pytest.fixture(scope="module")
def reference(stack):
    tokens, stats = stream(stack, LONG_PROMPT)
    assert stats.context_resends == 0 and len(tokens) == MAX_NEW
    return tokens, stats


def test_rounds_send_only_new_tokens(stack, reference):
    tokens, stats = reference
    hits = {role: s.context_store().counters.hits for role, s in servicers(stack).items()}
    again, again_stats = stream(stack, LONG_PROMPT)
    assert again == tokens
    for role, s in servicers(stack).items():
        assert s.context_store().counters.hits - hits[role] >= again_stats.rounds - 2, role
    prompt = target_pb2.VerifyRequest(context_ids=stack.tokenizer.encode(LONG_PROMPT)).ByteSize()
    # The first round carries the prompt twice (draft and target); every later round a few tokens
    # (at most 400 bytes a round, whatever the context length).
    later_rounds = (again_stats.wire_bytes - 2 * prompt) / (again_stats.rounds - 1)
    assert later_rounds < 400 < prompt, (later_rounds, prompt, again_stats.wire_bytes, again_stats.rounds)


@pytest.mark.parametrize("change", [evict, restart, rewrite])
@pytest.mark.parametrize("roles", ["target", "draft", "both"])
def test_a_replica_without_the_prefix_gets_the_whole_context(stack, reference, change, roles):
    chosen = [stack.target_servicer, stack.draft_servicer] if roles == "both" else [servicers(stack)[roles]]
    misses = [s.context_store().counters.misses for s in chosen]
    tokens, stats = stream(stack, LONG_PROMPT, change(chosen))
    assert tokens == reference[0]
    assert stats.context_resends == len(chosen), stats
    expected = [1] * len(chosen) if change is restart else [m + 1 for m in misses]  # a restart's store is new
    assert [s.context_store().counters.misses for s in chosen] == expected
    assert stats.retries == 0 and stats.degraded_rounds == 0


def test_old_services_get_the_whole_context(stack, reference):
    """A replica whose Info lacks context_delta (an older service) is always sent the full form."""
    target = stack.deps.runner.target
    replica = next(iter(target.replicas.values()))
    hits = stack.target_servicer.context_store().counters.hits
    replica.info.context_delta = False
    try:
        tokens, stats = stream(stack, LONG_PROMPT)
    finally:
        replica.info.context_delta = True
    assert tokens == reference[0]
    assert stack.target_servicer.context_store().counters.hits == hits
    assert stats.wire_bytes_per_round > 2 * reference[1].wire_bytes_per_round


def target_stub(stack):
    channel = grpc.insecure_channel(f"127.0.0.1:{stack.target_app.port}")
    return channel, target_pb2_grpc.TargetStub(channel)


def test_old_clients_full_form_and_the_miss_status(stack):
    ids = stack.tokenizer.encode(LONG_PROMPT)[:40]
    assert len(ids) == 40
    channel, stub = target_stub(stack)
    full = stub.Verify(target_pb2.VerifyRequest(session_id="old", context_ids=ids, draft_ids=[5, 6]), timeout=30)
    again = stub.Verify(target_pb2.VerifyRequest(session_id="old", context_ids=ids, draft_ids=[5, 6]), timeout=30)
    delta = stub.Verify(
        target_pb2.VerifyRequest(
            session_id="old",
            context_ids=ids[-3:],
            draft_ids=[5, 6],
            position_base=len(ids) - 3,
            prefix_hash=prefix_hash(ids[:-3]),
        ),
        timeout=30,
    )
    assert list(full.target_ids) == list(again.target_ids) == list(delta.target_ids)
    assert full.num_accepted == delta.num_accepted
    with pytest.raises(grpc.RpcError) as err:
        stub.Verify(
            target_pb2.VerifyRequest(
                session_id="never-seen",
                context_ids=[5],
                draft_ids=[6],
                position_base=4,
                prefix_hash=prefix_hash(ids[:4]),
            ),
            timeout=30,
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (CONTEXT_MISS_METADATA, "unknown-session") in tuple(err.value.trailing_metadata())
    channel.close()
    dchannel = grpc.insecure_channel(f"127.0.0.1:{stack.draft_app.port}")
    draft = draft_pb2_grpc.DraftStub(dchannel)
    one = draft.Propose(draft_pb2.ProposeRequest(session_id="old", context_ids=ids, k=3), timeout=30)
    two = draft.Propose(
        draft_pb2.ProposeRequest(
            session_id="old", context_ids=ids[5:], k=3, position_base=5, prefix_hash=prefix_hash(ids[:5])
        ),
        timeout=30,
    )
    assert list(one.draft_ids) == list(two.draft_ids)
    with pytest.raises(grpc.RpcError) as err:
        draft.Propose(
            draft_pb2.ProposeRequest(
                session_id="old", context_ids=[1], k=3, position_base=5, prefix_hash=prefix_hash(ids[:4] + [0])
            ),
            timeout=30,
        )
    assert (CONTEXT_MISS_METADATA, "hash-mismatch") in tuple(err.value.trailing_metadata())
    dchannel.close()


def test_release_drops_the_context(stack):
    sid = f"release-{uuid.uuid4().hex[:8]}"
    stream(stack, IDENTITY_PROMPTS[1], sid=sid)
    assert all(sid in s.context_store()._held for s in servicers(stack).values())
    stack.call(stack.pair.release_session(sid))
    assert not any(sid in s.context_store()._held for s in servicers(stack).values())


@pytest.mark.parametrize("trace, rejected_rows, asked", [(False, True, True), (True, True, False), (True, False, True)])
def test_the_target_is_asked_for_the_verdict_only_unless_a_trace_shows_rejected_rows(
    stack, reference, trace, rejected_rows, asked
):
    """Untraced rounds (and traces with SPECDEC_TRACE_REJECTED_ROWS=0) ask for VerifyRequest.verdict_only, so the
    target skips the argmax of rows after the rejection; the tokens are the same either way."""
    engine, seen = stack.target_bundle.engines["target"], []
    real = engine._judge
    engine._judge = lambda inp, fwd: seen.append((len(inp.draft_ids), inp.verdict_only)) or real(inp, fwd)
    stack.deps.cfg.trace_rejected_rows = rejected_rows
    try:
        channel, stub = stack.stub()
        req = pb.GenerateRequest(prompt=LONG_PROMPT, k=K, max_new_tokens=MAX_NEW, ignore_eos=True, trace=trace)
        reply = stub.Generate(req, timeout=120)
        channel.close()
    finally:
        del engine._judge
        stack.deps.cfg.trace_rejected_rows = True
    assert list(reply.token_ids) == reference[0]
    assert {flag for k, flag in seen if k} == {asked}  # rounds with a draft (k = 0: nothing to cut)
    rejected = [r for r in reply.trace if r.num_accepted < len(r.draft_ids)]
    assert not trace or rejected
    cut = {len(r.matches) == r.num_accepted + 1 and len(r.target_ids) == r.num_accepted + 1 for r in rejected}
    assert cut <= {asked}


def test_a_round_is_answered_at_once_when_the_service_is_idle_and_through_its_queue_otherwise(stack):
    """verify_now / propose_now (what Verify / Propose call first): with nothing else in flight a
    decode round's call returns its response (no task, lock or queue); with another call in flight it returns
    the awaitable that queues it. Both give the same answer; the target answers at once only a session whose
    last pass it ran alone (a second session's call goes through the queue, which batches)."""
    import functools
    import inspect

    ids = stack.tokenizer.encode(IDENTITY_PROMPTS[0])[:6]

    async def body():
        draft, target = stack.draft_servicer, stack.target_servicer
        out = {}
        for name, servicer, call, request in (
            ("draft", draft, draft.propose_now, draft_pb2.ProposeRequest(session_id="now", context_ids=ids, k=2)),
            (
                "target",
                target,
                functools.partial(target.verify_now, deadline_s=None),
                target_pb2.VerifyRequest(session_id="now", context_ids=ids, draft_ids=[ids[1]]),
            ),
        ):
            first = call(request)
            first = await first if inspect.isawaitable(first) else first  # the target: another session ran last
            at_once = call(request)
            async with servicer.worker.session_slot("someone-else"):  # another call in flight
                queued = call(request)
            out[name] = (first, at_once, inspect.isawaitable(at_once), inspect.isawaitable(queued), await queued)
        return out

    for name, (first, at_once, awaitable_idle, awaitable_busy, queued) in stack.call(body()).items():
        assert not awaitable_idle and awaitable_busy, name
        fields = ("draft_ids",) if name == "draft" else ("num_accepted", "next_token", "target_ids")
        for f in fields:
            assert getattr(at_once, f) == getattr(queued, f) == getattr(first, f), (name, f)
        assert at_once.stats.service_ms >= at_once.stats.forward_ms > 0


def test_a_lone_sessions_next_context_is_held_once_its_round_is_answered(stack):
    """A round answered at once leaves the context store holding the context + the emitted tokens
    (ContextStore.hold_next), so the next delta round finds its tokens held, reuses the cache up to the accepted
    drafts (rolling back the rejected ones) and answers as a fresh session sent the whole context does."""
    import inspect

    ids = stack.tokenizer.encode(LONG_PROMPT)[:8]
    target = stack.target_servicer
    store = target.context_store()

    async def verify(request):
        answer = target.verify_now(request, None)
        return await answer if inspect.isawaitable(answer) else answer

    async def body():
        full = target_pb2.VerifyRequest(session_id="prep", context_ids=ids, draft_ids=[ids[2], ids[3], ids[4]])
        await verify(full)  # the first call of a session may queue
        first = await verify(full)  # answered at once
        emitted = list(first.target_ids[: first.num_accepted]) + [first.next_token]
        held = store._held["prep"].tokens
        hits = store.counters.hits
        draft = [emitted[-1], ids[5]]
        delta = target_pb2.VerifyRequest(
            session_id="prep",
            context_ids=emitted,
            position_base=len(ids),
            prefix_hash=prefix_hash(ids),
            draft_ids=draft,
        )
        fresh = target_pb2.VerifyRequest(session_id="prep-fresh", context_ids=ids + emitted, draft_ids=draft)
        return held, first, await verify(delta), store.counters.hits - hits, await verify(fresh)

    held, first, nxt, hits, fresh = stack.call(body())
    assert held == ids + list(first.target_ids[: first.num_accepted]) + [first.next_token]
    assert hits == 1 and nxt.stats.cached_tokens == len(held) - 1
    assert nxt.stats.rolled_back == 3 - first.num_accepted  # the rejected drafts' positions
    for f in ("num_accepted", "next_token", "target_ids"):
        assert getattr(nxt, f) == getattr(fresh, f), f
