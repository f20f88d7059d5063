"""Round streams: Propose/Verify calls over long-lived bidirectional streams (orchestrator/streams.py,
specdec/server/streams.py), against real servicers over loopback gRPC.

  * a generation's rounds ride one stream per pool, and the tokens are those of the unary path;
  * a context miss on a stream is resent whole in the same round and counted in
    specdec_context_resends_total;
  * per call: a deadline cancels the stream and the work behind it (DEADLINE_EXCEEDED), an error ends
    the stream with the call's status and trailing metadata, a cancelled caller cancels the service's
    handler, and the next call opens a new stream;
  * a draining service ends its idle streams at once with OK and finishes the call in flight; a call
    that finds its idle stream ended retries once on a new stream before failing over.
"""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from orchestrator.streams import RoundStreams
from specdec.config import ServerConfig
from specdec.errors import ContextMiss
from specdec.server.app import GrpcApp
from specdec.server.streams import call_timeout_s, serve_round_stream
from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import target_pb2, target_pb2_grpc
from tests.prompts import IDENTITY_PROMPTS
from tests.support import InProcessStack, make_tiny_pair

pytestmark = pytest.mark.integration

K = 4
MAX_NEW = 24
PROMPT = " ".join(IDENTITY_PROMPTS[:2])


@pytest.fixture(scope="module")
def stack(tmp_path_factory, redis_server):
    target_dir, draft_dir = make_tiny_pair(tmp_path_factory.mktemp("tiny"), IDENTITY_PROMPTS)
    s = InProcessStack(target_model=str(target_dir), draft_model=str(draft_dir), redis_url=redis_server.url).start()
    yield s
    s.stop()


def pools(stack):
    return stack.deps.runner.draft, stack.deps.runner.target


def opened(stack) -> int:
    return sum(r.streams.opened for pool in pools(stack) for r in pool.replicas.values())


def generate(stack, between=None) -> tuple[list[int], pb.Stats]:
    channel, stub = stack.stub()
    req = pb.GenerateRequest(
        prompt=PROMPT,
        k=K,
        max_new_tokens=MAX_NEW,
        ignore_eos=True,
        session_id=f"streams-{uuid.uuid4().hex[:8]}",
        create_session=True,
    )
    tokens, stats = [], None
    for chunk in stub.GenerateStream(req, timeout=120):
        if between is not None and tokens == [] and chunk.token_ids:
            stack.call(between(req.session_id))
        tokens += list(chunk.token_ids)
        stats = chunk.stats if chunk.HasField("stats") else stats
    channel.close()
    return tokens, stats


def test_rounds_ride_one_stream_per_pool_and_match_the_unary_path(stack):
    retry = stack.deps.cfg.retry
    assert all(r.info.round_streams for pool in pools(stack) for r in pool.replicas.values())
    retry.round_streams = False
    try:
        before = opened(stack)
        unary, _ = generate(stack)
        assert opened(stack) == before  # the old path opens no stream
    finally:
        retry.round_streams = True
    first, stats = generate(stack)
    after_first = opened(stack)
    second, _ = generate(stack)
    assert first == second == unary and len(first) == MAX_NEW
    assert stats.rounds > 3
    assert opened(stack) == after_first  # the next generation reuses the idle streams
    assert after_first <= 2  # one per pool, however many rounds


def test_a_context_miss_on_a_stream_is_resent_whole_and_counted(stack):
    reference, _ = generate(stack)
    metrics = stack.deps.metrics
    for pool in pools(stack):
        pool.on_context_resend = metrics.observe_context_resend

    async def evict(sid):
        for servicer in (stack.target_servicer, stack.draft_servicer):
            assert servicer.context_store().release(sid)

    before = {
        role: metrics.registry.get_sample_value("specdec_context_resends_total", {"role": role}) or 0.0
        for role in ("draft", "target")
    }
    tokens, stats = generate(stack, between=evict)
    assert tokens == reference
    assert stats.context_resends == 2  # draft and target, once each, same round
    for role in ("draft", "target"):
        assert metrics.registry.get_sample_value("specdec_context_resends_total", {"role": role}) == before[role] + 1


# -- semantics of one stream, against a real gRPC service whose Verify does what the request says -------


class Scripted(target_pb2_grpc.TargetServicer):
    """Verify: draft_ids[0] = milliseconds to take; session "miss" fails with a context miss."""

    def __init__(self) -> None:
        self.draining = asyncio.Event()
        self.started = self.finished = self.cancelled = 0
        self.timeouts: list[float | None] = []  # call_timeout_s as each call saw it

    async def Verify(self, request, context):
        self.started += 1
        self.timeouts.append(call_timeout_s(request, context))
        try:
            await asyncio.sleep(request.draft_ids[0] / 1000 if request.draft_ids else 0)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if request.session_id == "miss":
            raise ContextMiss("unknown-session", "no context held")
        self.finished += 1
        return target_pb2.VerifyResponse(next_token=len(request.context_ids))

    async def VerifyStream(self, requests, context):
        async for response in serve_round_stream(requests, lambda r: self.Verify(r, context), self.draining):
            yield response


@pytest.fixture
def scripted(stack):
    """A Scripted service on the stack's event loop (grpc.aio serves one loop per process)."""
    servicer = Scripted()

    async def start():
        app = GrpcApp("specdec.v1.Target", ServerConfig(host="127.0.0.1", port=0, drain_seconds=30.0))
        return app, await app.start(lambda s: target_pb2_grpc.add_TargetServicer_to_server(servicer, s))

    app, port = stack.call(start())
    yield stack, servicer, app, port
    stack.call(app.server.stop(grace=None))


def run(stack, port, body):
    async def main():
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        try:
            return await body(RoundStreams(target_pb2_grpc.TargetStub(channel), lambda: (), idle_max=4))
        finally:
            await channel.close()

    return stack.call(main())


def verify(ms: int = 0, session: str = "s", n: int = 3) -> target_pb2.VerifyRequest:
    return target_pb2.VerifyRequest(session_id=session, context_ids=list(range(n)), draft_ids=[ms])


def test_calls_share_a_stream_and_errors_end_it_with_their_status(scripted):
    stack, servicer, _, port = scripted

    async def body(streams):
        answers = [(await streams.call("Verify", verify(n=n), 5.0)).next_token for n in (1, 2, 3)]
        assert answers == [1, 2, 3] and streams.opened == 1
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await streams.call("Verify", verify(session="miss"), 5.0)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert ("specdec-context-miss", "unknown-session") in tuple(err.value.trailing_metadata())
        assert (await streams.call("Verify", verify(n=7), 5.0)).next_token == 7
        assert streams.opened == 2  # the failed call's stream was not reused

    run(stack, port, body)


def test_each_stream_call_carries_what_is_left_of_its_deadline(scripted):
    """A stream has no per-call gRPC deadline; the request's timeout_ms says the call's own, so the
    target's load shedding (BatchQueue._admit) sees the same wait on a stream as on a unary call."""
    stack, servicer, _, port = scripted

    async def body(streams):
        await streams.call("Verify", verify(), 5.0)
        await streams.call("Verify", verify(), 0.8)  # same stream, a shorter call
        return streams.opened

    opened_streams = run(stack, port, body)
    assert opened_streams == 1
    first, second = servicer.timeouts
    assert 4.0 < first <= 5.01 and 0.3 < second <= 0.81  # ceil'd to the millisecond

    async def unary():
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        try:
            request = verify()
            await target_pb2_grpc.TargetStub(channel).Verify(request, timeout=3.0)
            return request.HasField("timeout_ms")
        finally:
            await channel.close()

    assert stack.call(unary()) is False  # unary: the gRPC deadline alone
    assert 2.0 < servicer.timeouts[-1] <= 3.1  # gRPC's own deadline (its rounding)


def test_a_deadline_cancels_the_stream_and_the_work_behind_it(scripted):
    stack, servicer, _, port = scripted

    async def body(streams):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await streams.call("Verify", verify(ms=2000), 0.2)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        for _ in range(50):
            if servicer.cancelled:
                break
            await asyncio.sleep(0.02)
        assert servicer.cancelled == 1 and servicer.finished == 0
        assert (await streams.call("Verify", verify(n=5), 5.0)).next_token == 5

    run(stack, port, body)


def test_a_cancelled_caller_cancels_the_services_handler(scripted):
    stack, servicer, _, port = scripted

    async def body(streams):
        task = asyncio.ensure_future(streams.call("Verify", verify(ms=2000), 5.0))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(50):
            if servicer.cancelled:
                break
            await asyncio.sleep(0.02)
        assert servicer.cancelled == 1 and servicer.finished == 0

    run(stack, port, body)


def test_draining_finishes_the_call_in_flight_and_ends_idle_streams(scripted):
    stack, servicer, app, port = scripted

    async def body(streams):
        two = await asyncio.gather(*(streams.call("Verify", verify(ms=50, n=1), 5.0) for _ in range(2)))
        assert [r.next_token for r in two] == [1, 1] and streams.opened == 2
        idle = streams._idle["Verify"][0]  # stays idle: the next call takes the other one
        busy = asyncio.ensure_future(streams.call("Verify", verify(ms=300, n=2), 5.0))
        await asyncio.sleep(0.1)  # busy's call is being answered
        assert not idle.done()
        servicer.draining.set()
        stopping = asyncio.ensure_future(app.server.stop(grace=30.0))
        assert (await busy).next_token == 2  # the call in flight is finished, not lost
        assert await asyncio.wait_for(idle.code(), 5.0) == grpc.StatusCode.OK  # the idle one ended at once
        await asyncio.wait_for(stopping, 5.0)  # nothing holds the drain for its 30 s grace
        with pytest.raises(grpc.aio.AioRpcError) as err:  # the next call: its stream ended, a new one refused
            await streams.call("Verify", verify(n=3), 5.0)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert servicer.finished == 3

    run(stack, port, body)


def test_a_stream_without_the_token_is_unauthenticated_and_a_malformed_message_invalid(stack):
    """The auth and strict-parse interceptors cover the streams: a stream opened without the bearer token
    ends UNAUTHENTICATED; a message that does not parse ends its stream INVALID_ARGUMENT."""
    servicer = Scripted()

    async def body():
        app = GrpcApp("specdec.v1.Target", ServerConfig(host="127.0.0.1", port=0, drain_seconds=1.0), ("tok",))
        port = await app.start(lambda s: target_pb2_grpc.add_TargetServicer_to_server(servicer, s))
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        try:
            stub = target_pb2_grpc.TargetStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await RoundStreams(stub, lambda: (), 4).call("Verify", verify(), 5.0)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            authed = RoundStreams(stub, lambda: (("authorization", "Bearer tok"),), 4)
            assert (await authed.call("Verify", verify(n=4), 5.0)).next_token == 4
            raw = channel.stream_stream("/specdec.v1.Target/VerifyStream")(metadata=(("authorization", "Bearer tok"),))
            await raw.write(b"\xff\xff\xff")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await raw.read()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "malformed" in err.value.details()
        finally:
            await channel.close()
            await app.server.stop(grace=None)

    stack.call(body())


async def until(condition, timeout_s: float = 5.0) -> None:
    """Wait until condition() holds (AssertionError after timeout_s)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def test_a_draining_service_refuses_new_calls_unavailable_until_the_one_in_flight_ends(stack):
    """While a call is in flight the drain keeps the server running: each new call, unary or stream, is
    refused UNAVAILABLE (a status callers retry elsewhere; grpc's own stop would cancel it instead), health
    answers NOT_SERVING, the call in flight finishes, and the server stops right after it, not after the
    grace period."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    servicer = Scripted()

    async def body():
        app = GrpcApp("specdec.v1.Target", ServerConfig(host="127.0.0.1", port=0, drain_seconds=30.0))
        port = await app.start(lambda s: target_pb2_grpc.add_TargetServicer_to_server(servicer, s))
        await app.set_serving(True)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        try:
            stub = target_pb2_grpc.TargetStub(channel)
            in_flight = asyncio.ensure_future(stub.Verify(verify(ms=1500, n=5), timeout=10))
            await until(lambda: app.gate.in_flight == 1)
            app.request_stop()
            drain = asyncio.ensure_future(app.run_until_stopped(on_drain=servicer.draining.set))
            await until(lambda: app.gate.closed)
            with pytest.raises(grpc.aio.AioRpcError) as unary:
                await stub.Verify(verify(n=2), timeout=5)
            with pytest.raises(grpc.aio.AioRpcError) as streamed:
                await RoundStreams(stub, lambda: (), 4).call("Verify", verify(n=3), 5.0)
            health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert (await in_flight).next_token == 5
            started = asyncio.get_running_loop().time()
            await asyncio.wait_for(drain, timeout=10)
            return unary.value, streamed.value, health.status, asyncio.get_running_loop().time() - started
        finally:
            await channel.close()
            await app.server.stop(grace=None)

    unary, streamed, health, stop_s = stack.call(body())
    for err in (unary, streamed):
        assert err.code() == grpc.StatusCode.UNAVAILABLE and "draining" in err.details(), err
    assert health == health_pb2.HealthCheckResponse.NOT_SERVING
    assert servicer.finished == 1 and servicer.cancelled == 0
    assert stop_s < 5.0, stop_s  # not the 30 s grace
