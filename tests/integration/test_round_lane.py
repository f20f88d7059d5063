"""The round lane: Propose/Verify over plain TCP (specdec/server/lane.py, orchestrator/lane.py), against a
real lane server over loopback, with the round streams' semantics:

  * calls reuse one connection and carry what is left of their deadline (timeout_ms);
  * an error comes back with the unary call's status and trailing metadata, and the connection stays usable;
  * a deadline or a cancelled caller closes the connection and cancels the service's handler;
  * the bearer token is checked once per connection; a malformed request is INVALID_ARGUMENT;
  * draining: the call in flight is answered, idle connections close, a new call is UNAVAILABLE;
  * a lane nobody listens on is LaneUnreachable at once, and the pool then calls over gRPC;
  * FORWARD_DONE: a caller that asks (NOTIFY) hears that its forward has finished before the answer; one
    that does not, or a service that does not offer it, sees plain calls; a stale notice is dropped;
  * in a real stack of processes, generations ride the lane and give the round streams' tokens.
"""

from __future__ import annotations

import asyncio
import queue
import socket
import struct
import threading
import time

import grpc
import pytest

from orchestrator.lane import LaneUnreachable, RoundLane, lane_error
from orchestrator.replicas import ReplicaPool, lane_host
from specdec.config import RetryConfig, ServerConfig
from specdec.errors import InvalidArgument
from specdec.metrics import OrchestratorMetrics
from specdec.server.app import GrpcApp
from specdec.server.lane import HEADER, HELLO, OK, VERIFY, LaneMethod, RoundLaneServer, frame
from specdec.v1 import common_pb2, target_pb2, target_pb2_grpc
from tests.integration.test_round_streams import Scripted, until, verify

pytestmark = pytest.mark.integration

MAX_BYTES = 1 << 20


@pytest.fixture
def lane_server():
    """A Scripted Verify behind a GrpcApp (for its DrainGate and gRPC port) and a round lane, on one loop."""
    loop = asyncio.new_event_loop()
    servicer = Scripted()

    async def start(token: str = "", hello_timeout_s: float = 10.0):
        app = GrpcApp("specdec.v1.Target", ServerConfig(host="127.0.0.1", port=0, drain_seconds=30.0))
        grpc_port = await app.start(lambda s: target_pb2_grpc.add_TargetServicer_to_server(servicer, s))
        methods = {VERIFY: LaneMethod("Verify", target_pb2.VerifyRequest.FromString, servicer.Verify)}
        lane = RoundLaneServer(methods, app.gate, token, MAX_BYTES, hello_timeout_s)
        return app, lane, grpc_port, await lane.start("127.0.0.1", 0)

    yield loop, servicer, start
    loop.close()


def client(port: int, token: str = "", retry_s: float = 60.0) -> RoundLane:
    return RoundLane("127.0.0.1", port, token, MAX_BYTES, idle_max=4, connect_timeout_s=1.0, retry_s=retry_s)


async def wait_cancelled(servicer: Scripted) -> None:
    for _ in range(100):
        if servicer.cancelled:
            return
        await asyncio.sleep(0.02)


def test_calls_share_a_connection_errors_keep_it_and_carry_their_metadata(lane_server):
    loop, servicer, start = lane_server

    async def body():
        app, lane, _, port = await start()
        lane_client = client(port)
        answers = [(await lane_client.call("Verify", verify(n=n), 5.0)).next_token for n in (1, 2, 3)]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await lane_client.call("Verify", verify(session="miss"), 5.0)
        after = (await lane_client.call("Verify", verify(n=7), 0.8)).next_token
        await app.server.stop(grace=None)
        return answers, err.value, after, lane_client.opened

    answers, err, after, opened = loop.run_until_complete(body())
    assert answers == [1, 2, 3] and after == 7
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert ("specdec-context-miss", "unknown-session") in tuple(err.trailing_metadata())
    assert opened == 1  # the error did not cost the connection
    assert 4.0 < servicer.timeouts[0] <= 5.01 and 0.3 < servicer.timeouts[-1] <= 0.81


@pytest.mark.parametrize("how", ["deadline", "cancel"])
def test_a_deadline_or_a_cancelled_caller_cancels_the_work_behind_the_call(lane_server, how):
    loop, servicer, start = lane_server

    async def body():
        app, _, _, port = await start()
        lane_client = client(port)
        if how == "deadline":
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await lane_client.call("Verify", verify(ms=2000), 0.2)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        else:
            task = asyncio.ensure_future(lane_client.call("Verify", verify(ms=2000), 5.0))
            await until(lambda: servicer.started == 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await wait_cancelled(servicer)
        again = (await lane_client.call("Verify", verify(n=5), 5.0)).next_token
        await app.server.stop(grace=None)
        return again, lane_client.opened

    again, opened = loop.run_until_complete(body())
    assert servicer.cancelled == 1 and servicer.finished == 1 and again == 5
    assert opened == 2  # the abandoned call's connection was closed


def test_the_token_is_checked_and_a_malformed_request_is_invalid(lane_server):
    loop, servicer, start = lane_server

    async def body():
        app, _, _, port = await start(token="tok")
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await client(port, token="wrong").call("Verify", verify(), 5.0)
        ok = (await client(port, token="tok").call("Verify", verify(n=4), 5.0)).next_token
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(frame(HELLO, b"tok") + frame(VERIFY, b"\xff\xff\xff"))
        answers = []
        for _ in range(2):
            size, kind = struct.unpack("<IB", await reader.readexactly(HEADER.size))
            answers.append((kind, await reader.readexactly(size)))
        writer.close()
        await app.server.stop(grace=None)
        return denied.value, ok, answers

    denied, ok, answers = loop.run_until_complete(body())
    assert denied.code() == grpc.StatusCode.UNAUTHENTICATED and ok == 4
    assert answers[0][0] == OK
    malformed = lane_error(answers[1][1])
    assert malformed.code() == grpc.StatusCode.INVALID_ARGUMENT and "malformed Verify" in malformed.details()
    assert servicer.finished == 1


def test_a_connection_must_open_with_hello_and_say_it_in_time(lane_server):
    """Without a token too: a call before HELLO is refused UNAUTHENTICATED and closed, and a connection
    that says nothing is closed after hello_timeout_s (no idle unauthenticated connections pile up)."""
    loop, servicer, start = lane_server

    async def answer(reader):
        size, kind = struct.unpack("<IB", await reader.readexactly(HEADER.size))
        return kind, await reader.readexactly(size)

    async def body():
        app, _, _, port = await start(hello_timeout_s=0.3)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(frame(VERIFY, verify(n=2).SerializeToString()))
        no_hello = await answer(reader)
        closed_at_once = await reader.read() == b""
        silent_reader, silent = await asyncio.open_connection("127.0.0.1", port)
        started = loop.time()
        overdue = await asyncio.wait_for(answer(silent_reader), 5.0)
        waited = loop.time() - started
        for w in (writer, silent):
            w.close()
        await app.server.stop(grace=None)
        return no_hello, closed_at_once, overdue, waited

    no_hello, closed_at_once, overdue, waited = loop.run_until_complete(body())
    for _kind, payload in (no_hello, overdue):
        assert lane_error(payload).code() == grpc.StatusCode.UNAUTHENTICATED
    assert "HELLO" in lane_error(no_hello[1]).details() and closed_at_once
    assert 0.25 < waited < 3.0 and servicer.started == 0


def test_draining_answers_the_call_in_flight_closes_idle_connections_and_refuses_new_ones(lane_server):
    loop, servicer, start = lane_server

    async def body():
        app, lane, _, port = await start()
        lane_client = client(port)
        two = await asyncio.gather(*(lane_client.call("Verify", verify(ms=50, n=1), 5.0) for _ in range(2)))
        busy = asyncio.ensure_future(lane_client.call("Verify", verify(ms=400, n=2), 5.0))
        await until(lambda: servicer.started == 3)  # busy's call is being answered
        app.request_stop()
        drain = asyncio.ensure_future(app.run_until_stopped(on_drain=lane.close))
        await until(lambda: not any(conn.usable() for conn in lane_client._idle))
        idle_closed = [not conn.usable() for conn in lane_client._idle]
        with pytest.raises(LaneUnreachable):  # the idle connection was closed, no new one taken
            await lane_client.call("Verify", verify(n=3), 5.0)
        busy_token = (await busy).next_token
        await asyncio.wait_for(drain, 5.0)  # not the 30 s grace
        return [r.next_token for r in two], busy_token, idle_closed

    two, busy_token, idle_closed = loop.run_until_complete(body())
    assert two == [1, 1] and busy_token == 2 and idle_closed == [True]
    assert servicer.finished == 3


def test_a_lane_nobody_listens_on_is_unreachable_and_the_pool_calls_over_grpc(lane_server):
    loop, servicer, start = lane_server
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]

    async def body():
        app, _, grpc_port, _ = await start()
        with pytest.raises(LaneUnreachable):
            await client(dead_port).call("Verify", verify(), 5.0)
        pool = ReplicaPool("target", f"127.0.0.1:{grpc_port}", ServerConfig(), RetryConfig(lane_retry_s=60.0))
        metrics = OrchestratorMetrics()
        pool.on_lane_fallback = metrics.observe_lane_fallback
        await pool.refresh()  # (Scripted has no Info: set it as a service would)
        replica = pool.replicas[f"127.0.0.1:{grpc_port}"]
        replica.info, replica.error = common_pb2.ModelInfo(round_streams=True, round_lane_port=dead_port), ""
        pool.set.mark_healthy(replica.address)  # a lane advertised, but blocked
        pool._attach_lane(replica)
        answer, _, _ = await pool.call("s", "Verify", verify(n=6), 5.0)
        await pool.call("s", "Verify", verify(n=7), 5.0)  # skips the lane: no second connect, no count
        skipped = not replica.lane.usable()
        fallbacks = metrics.registry.get_sample_value("specdec_round_lane_fallbacks_total", {"role": "target"})
        await pool.close()
        await app.server.stop(grace=None)
        return answer.next_token, skipped, replica.streams.opened, fallbacks

    token, skipped, streams_opened, fallbacks = loop.run_until_complete(body())
    assert token == 6 and skipped and streams_opened == 1 and fallbacks == 1


def busy_lane_service(busy_s: float, port_ready: queue.Queue[int]) -> None:
    """A lane service (a thread, raw sockets) whose event loop is in a forward when a connection comes: the
    kernel accepts it at once, HELLO is answered busy_s later, then one Verify."""

    def read_frame(conn: socket.socket) -> tuple[int, bytes]:
        size, kind = HEADER.unpack(conn.recv(HEADER.size, socket.MSG_WAITALL))
        return kind, conn.recv(size, socket.MSG_WAITALL) if size else b""

    with socket.create_server(("127.0.0.1", 0)) as server:
        port_ready.put(server.getsockname()[1])
        conn, _ = server.accept()
        with conn:
            time.sleep(busy_s)
            assert read_frame(conn)[0] == HELLO
            conn.sendall(frame(OK))
            kind, payload = read_frame(conn)
            request = target_pb2.VerifyRequest.FromString(payload)
            conn.sendall(frame(OK, target_pb2.VerifyResponse(next_token=len(request.context_ids)).SerializeToString()))


def test_a_hello_answered_late_by_a_busy_service_is_waited_for_not_taken_as_unreachable():
    """Forwards on the service's event loop (SPECDEC_LOOP_FORWARDS) hold HELLO up to a pass: a connection that
    was accepted waits for it within the call's deadline, past connect_timeout_s (1 s), and the lane stays in
    use; only a connect that fails marks it unreachable (the test above)."""
    ports: queue.Queue[int] = queue.Queue()
    service = threading.Thread(target=busy_lane_service, args=(1.5, ports), daemon=True)
    service.start()
    lane = client(ports.get(timeout=5))

    async def body():
        started = time.monotonic()
        answer = await lane.call("Verify", verify(n=5), 10.0)
        return answer.next_token, time.monotonic() - started, lane.usable()

    token, waited, usable = asyncio.run(body())
    service.join(timeout=5)
    assert token == 5 and waited >= 1.4 and usable and lane.opened == 1


def test_a_hello_still_unanswered_at_the_call_s_deadline_is_deadline_exceeded_and_the_lane_stays_in_use():
    """Accepted but silent past the call's deadline (a pass longer than the call may wait): the call ends
    DEADLINE_EXCEEDED, saying so; the lane is not marked unreachable."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        lane = client(server.getsockname()[1])

        async def body():
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await lane.call("Verify", verify(n=5), 0.5)
            return raised.value

        error = asyncio.run(body())
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "HELLO was not answered" in error.details()
    assert lane.usable() and lane.opened == 0


class Notifying(target_pb2_grpc.TargetServicer):
    """Verify that reports the end of its "forward" from another thread, as the model thread does, and
    answers only once the caller has heard it (session "plain": never reports; "stale": reports with the
    previous call's notifier first)."""

    def __init__(self) -> None:
        self.notifiers: list = []  # context.forward_done as each call saw it
        self.client: RoundLane | None = None

    async def Verify(self, request, context):
        self.notifiers.append(context.forward_done)
        if request.session_id == "stale" and self.notifiers[-2] is not None:
            await asyncio.to_thread(self.notifiers[-2])
        if context.forward_done is not None and request.session_id != "plain":
            heard = self.client.forward_done
            await asyncio.to_thread(context.forward_done)
            await until(lambda: self.client.forward_done == heard + 1)  # heard before the answer exists
        return target_pb2.VerifyResponse(next_token=len(request.context_ids))


@pytest.mark.parametrize("offered, asked", [(True, True), (True, False), (False, True)])
def test_forward_done_reaches_a_caller_that_asks_before_its_answer(offered, asked):
    loop = asyncio.new_event_loop()
    servicer = Notifying()

    async def body():
        app = GrpcApp("specdec.v1.Target", ServerConfig(host="127.0.0.1", port=0, drain_seconds=30.0))
        await app.start(lambda s: target_pb2_grpc.add_TargetServicer_to_server(servicer, s))
        methods = {VERIFY: LaneMethod("Verify", target_pb2.VerifyRequest.FromString, servicer.Verify)}
        lane = RoundLaneServer(methods, app.gate, "", MAX_BYTES, forward_done=offered)
        servicer.client = RoundLane(
            "127.0.0.1",
            await lane.start("127.0.0.1", 0),
            "",
            MAX_BYTES,
            idle_max=4,
            connect_timeout_s=1.0,
            retry_s=60.0,
            notify=asked,
        )
        answers = [
            (await servicer.client.call("Verify", verify(session=s, n=n), 5.0)).next_token
            for s, n in (("a", 1), ("plain", 2), ("stale", 3))
        ]
        await app.server.stop(grace=None)
        return answers, lane.forward_done_frames

    try:
        answers, sent = loop.run_until_complete(body())
    finally:
        loop.close()
    assert answers == [1, 2, 3]  # the NOTIFY bit never changes the call
    if offered and asked:
        assert all(n is not None for n in servicer.notifiers)
        assert sent == servicer.client.forward_done == 2  # "a" and "stale": the stale notice sent nothing
    else:
        assert servicer.notifiers == [None] * 3 and sent == servicer.client.forward_done == 0


class AnswersAtOnce:
    """A LaneMethod.now handler (as TargetServicer.verify_now): session "now" reports its forward and is answered
    at once, "bad" fails at once, any other session is answered later (an awaitable, as a queued call)."""

    def __init__(self) -> None:
        self.in_task: dict[str, bool] = {}  # session -> whether the handler ran inside an asyncio task

    def now(self, request, context):
        self.in_task[request.session_id] = asyncio.current_task() is not None
        if request.session_id == "bad":
            raise InvalidArgument("bad request")
        if request.session_id == "now":
            context.forward_done()
            return target_pb2.VerifyResponse(next_token=len(request.context_ids))
        return self.later(request)

    @staticmethod
    async def later(request):
        await asyncio.sleep(0.01)
        return target_pb2.VerifyResponse(next_token=10 * len(request.context_ids))


def test_a_call_answered_at_once_runs_without_a_task_and_keeps_forward_done_errors_and_the_drain_count():
    loop = asyncio.new_event_loop()
    handler = AnswersAtOnce()

    async def body():
        app = GrpcApp("specdec.v1.Target", ServerConfig(host="127.0.0.1", port=0, drain_seconds=30.0))
        await app.start(lambda s: None)
        methods = {VERIFY: LaneMethod("Verify", target_pb2.VerifyRequest.FromString, None, handler.now)}
        lane = RoundLaneServer(methods, app.gate, "", MAX_BYTES, forward_done=True)
        caller = RoundLane(
            "127.0.0.1",
            await lane.start("127.0.0.1", 0),
            "",
            MAX_BYTES,
            idle_max=4,
            connect_timeout_s=1.0,
            retry_s=60.0,
            notify=True,
        )
        answers = [
            (await caller.call("Verify", verify(session=s, n=n), 5.0)).next_token
            for s, n in (("now", 1), ("later", 2), ("now", 3))
        ]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await caller.call("Verify", verify(session="bad"), 5.0)
        after = (await caller.call("Verify", verify(session="now", n=4), 5.0)).next_token
        in_flight = app.gate.in_flight
        await app.server.stop(grace=None)
        return answers, err.value.code(), after, lane.forward_done_frames, caller.forward_done, in_flight

    try:
        answers, code, after, sent, heard, in_flight = loop.run_until_complete(body())
    finally:
        loop.close()
    assert answers == [1, 20, 3] and after == 4 and code == grpc.StatusCode.INVALID_ARGUMENT
    assert handler.in_task == {"now": False, "later": False, "bad": False}  # each handler ran at the frame's read
    assert sent == heard == 3  # the calls answered at once still told the caller of their forward
    assert in_flight == 0  # every call, at once or later, left the drain count


class CancelsFirst(target_pb2_grpc.TargetServicer):
    """Verify: the first call over all instances ends CANCELLED, as when a replica's server stops with it."""

    calls = 0

    async def Verify(self, request, context):
        CancelsFirst.calls += 1
        if CancelsFirst.calls == 1:
            await context.abort(grpc.StatusCode.CANCELLED, "CANCELLED")
        return target_pb2.VerifyResponse(next_token=len(request.context_ids))


def test_a_call_a_stopping_replica_cancelled_is_retried_on_another():
    loop = asyncio.new_event_loop()

    async def body():
        apps, addresses = [], []
        for _ in range(2):
            app = GrpcApp("specdec.v1.Target", ServerConfig(host="127.0.0.1", port=0, drain_seconds=30.0))
            port = await app.start(lambda s: target_pb2_grpc.add_TargetServicer_to_server(CancelsFirst(), s))
            addresses.append(f"127.0.0.1:{port}")
            apps.append(app)
        pool = ReplicaPool(
            "target", ",".join(addresses), ServerConfig(), RetryConfig(round_lane=False, round_streams=False)
        )
        await pool.refresh()
        for replica in pool.replicas.values():  # (CancelsFirst has no Info: set it as a service would)
            replica.info, replica.error = common_pb2.ModelInfo(), ""
            pool.set.mark_healthy(replica.address)
        answer, address, retries = await pool.call("s", "Verify", verify(n=5), 5.0)
        await pool.close()
        for app in apps:
            await app.server.stop(grace=None)
        return answer.next_token, retries, CancelsFirst.calls

    try:
        token, retries, calls = loop.run_until_complete(body())
    finally:
        loop.close()
    assert (token, retries, calls) == (5, 1, 2)


def test_lane_host_takes_the_host_of_a_grpc_address():
    assert lane_host("10.0.0.5:50052") == "10.0.0.5"
    assert lane_host("[::1]:50052") == "::1"
    assert lane_host("target-0.target-headless:50052") == "target-0.target-headless"
