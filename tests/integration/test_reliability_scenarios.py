"""Reliability scenarios, each against real processes, real gRPC and a real Redis.

One LocalStack for the module (specdec/launcher.py): a persistent EmbeddedRedis (AOF),
two target and two draft replicas of a tiny Llama pair (tests.support.make_tiny_pair,
loaded by local-dir spec), and three orchestrators on the same Redis, every one a process of
its own forked by the suite's fork server (tests/conftest.py; the stack's environment differs
only in SPECDEC_* variables), as are the restarts after a kill:
  A: all replicas;  B: all replicas (takes over A's sessions);
  S: target T1 and draft D1 only, max_concurrent = CAP (single-replica and overload cases).
Leases are short (LEASE_S) so takeovers are quick. Tests run in file order; a test that
kills a process restarts it before it returns.

Every generation is checked three ways: chunk offsets are contiguous (no token lost or
duplicated on the wire), the session in Redis holds exactly prompt + received tokens
(nothing appended twice), and the tokens equal plain greedy decoding of the target alone
(a divergence is tolerated only at a near-tie, top-2 logit gap < TIE_EPSILON, as in
test_greedy_identity). Run with -s to see the measured recovery times.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
import redis as redis_lib
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from http_gateway.process import GatewayProcess, get_health
from specdec.config import OrchestratorConfig
from specdec.healthcheck import check as health_check
from specdec.launcher import LocalStack, Proc, StackConfig
from specdec.models.compat import cache_argument, returned_cache
from specdec.redis_server import EmbeddedRedis
from specdec.routing import rendezvous_rank
from specdec.server.app import LIVENESS_SERVICE
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc, orchestrator_pb2_grpc, target_pb2, target_pb2_grpc
from specdec.v1 import orchestrator_pb2 as pb
from tests.prompts import IDENTITY_PROMPTS
from tests.support import make_tiny_pair

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LEASE_S = 2.0
CAP = 2
MAX_MESSAGE_BYTES = 256 * 1024
DRAIN_S = 15.0
K = 4
LONG = 200  # tokens of a generation that is killed in the middle (ignore_eos): seconds of work left after KILL_AFTER
KILL_AFTER = 16  # streamed tokens before the kill
RPC_TIMEOUT_S = 60.0
WAIT_S = 30.0
POLL_S = 0.05
TIE_EPSILON = 1e-4
PROMPT = "Once upon a time"
OK_CODES = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.ALREADY_EXISTS,
}
REPORT: dict[str, str] = {}
# one health pass (pause + PING deadline), plus scheduling slack on a loaded 2-core machine
HEALTH_BOUND_S = OrchestratorConfig().health_refresh_s + OrchestratorConfig().redis_ping_timeout_s + 3.0


# -- the stack ---------------------------------------------------------------------------------


@dataclass
class Env:
    stack: LocalStack
    redis: EmbeddedRedis
    model: object
    tokenizer: object
    fault_file: Path
    orch: dict[str, Proc] = field(default_factory=dict)
    refs: dict = field(default_factory=dict)

    def stub(self, name: str) -> orchestrator_pb2_grpc.OrchestratorStub:
        return orchestrator_pb2_grpc.OrchestratorStub(grpc.insecure_channel(self.orch[name].address))

    def reference(self, prompt: str, n: int) -> tuple[list[int], list[float]]:
        """Greedy decoding of the target alone (EOS ignored) and the top-2 gap at each step."""
        key = (prompt, n)
        if key not in self.refs:
            self.refs[key] = greedy_with_gaps(self.model, self.tokenizer.encode(prompt), n)
        return self.refs[key]


def greedy_with_gaps(model, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    out, gaps = [], []
    with torch.inference_mode():
        res = model(torch.tensor([ids]), use_cache=True)
        for _ in range(n):
            logits = res.logits[0, -1]
            top = torch.topk(logits, 2).values
            gaps.append(float(top[0] - top[1]))
            token = int(torch.argmax(logits))
            out.append(token)
            res = model(torch.tensor([[token]]), use_cache=True, **{cache_argument(model): returned_cache(res)})
    return out, gaps


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("reliability")
    target_dir, draft_dir = make_tiny_pair(root / "tiny", IDENTITY_PROMPTS)
    redis = EmbeddedRedis(data_dir=root / "redis").start()
    fault = root / "target.fault"
    cfg = StackConfig(
        target_model=str(target_dir),
        draft_model=str(draft_dir),
        draft_kind="model",
        target_replicas=0,
        draft_replicas=0,
        redis_url=redis.url,
        log_dir=str(root / "logs"),
        extra_env={
            "SPECDEC_LEASE_SECONDS": str(LEASE_S),
            "SPECDEC_DRAIN_SECONDS": str(DRAIN_S),
            "SPECDEC_MAX_MESSAGE_BYTES": str(MAX_MESSAGE_BYTES),
        },  # one torch thread per model service: StackConfig.threads, set by each service itself
    )
    stack = LocalStack(cfg)
    stack.redis_url = redis.url
    try:
        stack.targets = [stack.start_target(), stack.start_target(env={"SPECDEC_FAULT_FILE": str(fault)})]
        stack.drafts = [stack.start_draft(), stack.start_draft()]
        orch = {
            "A": stack.start_orchestrator(),
            "B": stack.start_orchestrator(),
            "S": stack.start_orchestrator(stack.targets[:1], stack.drafts[:1], ["--max-concurrent", str(CAP)]),
        }
        for proc in stack.procs:
            stack.wait_ready(proc)
        model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
        from specdec.models.loader import load_tokenizer

        yield Env(stack, redis, model, load_tokenizer(str(target_dir)), fault, orch)
    finally:
        stack.stop()
        redis.close()
        if REPORT:
            print("\n[reliability] " + "\n[reliability] ".join(f"{k}: {v}" for k, v in REPORT.items()))


# -- helpers -----------------------------------------------------------------------------------


def session_for(prefix: str, target: Proc, draft: Proc, stack: LocalStack) -> str:
    """A session id whose first-choice replicas are `target` and `draft`."""
    for i in range(10_000):
        sid = f"{prefix}-{i}-{uuid.uuid4().hex[:6]}"
        if (
            rendezvous_rank(sid, [p.address for p in stack.targets])[0] == target.address
            and rendezvous_rank(sid, [p.address for p in stack.drafts])[0] == draft.address
        ):
            return sid
    raise AssertionError("no session id found")


def long_request(session_id: str, request_id: str, n: int = LONG, **extra) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        prompt=PROMPT,
        session_id=session_id,
        create_session=True,
        request_id=request_id,
        k=K,
        max_new_tokens=n,
        ignore_eos=True,
        **extra,
    )


class Stream(threading.Thread):
    """Reads a GenerateStream in the background; checks that chunk offsets are contiguous."""

    def __init__(self, stub, request: pb.GenerateRequest, offset: int = 0, timeout: float = RPC_TIMEOUT_S) -> None:
        super().__init__(daemon=True)
        self.tokens: list[int] = []
        self.base = offset
        self.times: list[float] = []
        self.final: pb.GenerateChunk | None = None
        self.error: grpc.RpcError | None = None
        self.error_at = 0.0
        self.gaps: list[str] = []
        self.call = stub.GenerateStream(request, timeout=timeout)
        self.start()

    def run(self) -> None:
        try:
            for chunk in self.call:
                if chunk.token_ids and chunk.offset != self.base + len(self.tokens):
                    self.gaps.append(f"chunk at offset {chunk.offset}, expected {self.base + len(self.tokens)}")
                self.tokens += chunk.token_ids
                self.times.append(time.monotonic())
                if chunk.HasField("finish_reason"):
                    self.final = chunk
        except grpc.RpcError as exc:
            self.error, self.error_at = exc, time.monotonic()

    def wait_tokens(self, n: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while len(self.tokens) < n and self.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(self.tokens) >= n, f"stream stalled at {len(self.tokens)} tokens: {self.error}"

    def finish(self) -> Stream:
        self.join(RPC_TIMEOUT_S)
        assert not self.is_alive(), "the stream hung"
        return self


def check_tokens(env: Env, got: list[int], n: int = LONG) -> str:
    """'' when equal to the reference, 'tie@j' for a divergence at a near-tie; fails otherwise."""
    want, gaps = env.reference(PROMPT, n)
    if got == want:
        return ""
    j = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    assert j < len(want) and len(got) == len(want) and gaps[j] < TIE_EPSILON, (
        f"diverged at {j} (gap {gaps[j] if j < len(gaps) else None}): got {got[j : j + 5]} want {want[j : j + 5]}, "
        f"lengths {len(got)} vs {len(want)}"
    )
    return f"tie@{j}"


def stored_completion(env: Env, session_id: str) -> list[int]:
    """The session's completion ids, read from Redis (the orchestrators' default prefix)."""
    import asyncio

    from orchestrator.session_store import SessionStore, open_redis

    async def read():
        client = open_redis(env.redis.url)
        try:
            return await SessionStore(client).get(session_id)
        finally:
            await client.aclose()

    session = asyncio.run(read())
    return session.completion_ids


def worker_counters(proc: Proc) -> dict[str, int]:
    """A model service's worker counters (Info's trailing metadata)."""
    stub_class = target_pb2_grpc.TargetStub if proc.role == "target" else draft_pb2_grpc.DraftStub
    with grpc.insecure_channel(proc.address) as channel:
        _, call = stub_class(channel).Info.with_call(common_pb2.InfoRequest(), timeout=5)
        return {
            k.removeprefix("specdec-worker-"): int(v)
            for k, v in call.trailing_metadata()
            if k.startswith("specdec-worker-")
        }


def model_calls(env: Env, procs: list[Proc] | None = None) -> int:
    return sum(worker_counters(p)["calls"] for p in (procs or env.stack.targets + env.stack.drafts))


def session_passes(env: Env, procs: list[Proc]) -> int:
    """Forward passes as the sessions count them (Stats.target_passes): a batched pass of s sessions
    is one worker call but s session passes."""
    counters = [worker_counters(p) for p in procs]
    return sum(c["calls"] + c["batched-calls"] - c["batches"] for c in counters)


def admission(env: Env, name: str) -> dict[str, int]:
    _, call = env.stub(name).Status.with_call(pb.StatusRequest(), timeout=5)
    return {
        k.removeprefix("specdec-admission-"): int(v)
        for k, v in call.trailing_metadata()
        if k.startswith("specdec-admission-")
    }


def wait_for(predicate, what: str, timeout: float = WAIT_S) -> float:
    """Poll until predicate() is true; returns the seconds it took."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(POLL_S)
    raise AssertionError(f"timed out waiting for {what}")


def restart_observing(env: Env, proc: Proc) -> tuple[Proc, list[str]]:
    """Restart a killed process on its port; return it and the health statuses seen until SERVING."""
    new = env.stack.restart(
        proc, env={"SPECDEC_FAULT_FILE": str(env.fault_file)} if proc is env.stack.targets[1] else None
    )
    seen: list[str] = []

    def serving() -> bool:
        ok, status = health_check(new.address, timeout=1.0)
        if not seen or seen[-1] != status:
            seen.append(status)
        return ok

    wait_for(serving, f"{proc.role} back", timeout=120)
    return new, seen


def max_gap_ms(times: list[float]) -> float:
    return max((b - a for a, b in zip(times, times[1:])), default=0.0) * 1000


# -- 6. bad input --------------------------------------------------------------------------------


BAD_REQUESTS = {
    "empty prompt": (pb.GenerateRequest(prompt=""), grpc.StatusCode.INVALID_ARGUMENT),
    "beyond context": (pb.GenerateRequest(prompt=PROMPT, max_new_tokens=2047), grpc.StatusCode.INVALID_ARGUMENT),
    "max_new_tokens 0": (pb.GenerateRequest(prompt=PROMPT, max_new_tokens=0), grpc.StatusCode.INVALID_ARGUMENT),
    "k = -1": (pb.GenerateRequest(prompt=PROMPT, k=-1), grpc.StatusCode.INVALID_ARGUMENT),
    "k = 17": (pb.GenerateRequest(prompt=PROMPT, k=17), grpc.StatusCode.INVALID_ARGUMENT),
    "temperature -1": (
        pb.GenerateRequest(prompt=PROMPT, sampling={"temperature": -1}),
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    "temperature nan": (
        pb.GenerateRequest(prompt=PROMPT, sampling={"temperature": math.nan}),
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    "top_p 1.5": (pb.GenerateRequest(prompt=PROMPT, sampling={"top_p": 1.5}), grpc.StatusCode.INVALID_ARGUMENT),
    "top_k -3": (pb.GenerateRequest(prompt=PROMPT, sampling={"top_k": -3}), grpc.StatusCode.INVALID_ARGUMENT),
    "draft kind": (pb.GenerateRequest(prompt=PROMPT, draft_kind="bogus"), grpc.StatusCode.INVALID_ARGUMENT),
    "empty session id": (pb.GenerateRequest(prompt=PROMPT, session_id=""), grpc.StatusCode.INVALID_ARGUMENT),
    "unknown session": (pb.GenerateRequest(prompt=PROMPT, session_id="no-such-session"), grpc.StatusCode.NOT_FOUND),
    "over message size": (pb.GenerateRequest(prompt="x" * (MAX_MESSAGE_BYTES + 1)), grpc.StatusCode.RESOURCE_EXHAUSTED),
}


def test_bad_input_is_refused_before_any_model_work(env):
    before = model_calls(env)
    stub = env.stub("A")
    for name, (request, code) in BAD_REQUESTS.items():
        with pytest.raises(grpc.RpcError) as err:
            stub.Generate(request, timeout=10)
        assert err.value.code() == code, f"{name}: {err.value.code()} {err.value.details()}"
        assert err.value.details() and "Traceback" not in err.value.details(), name
    assert model_calls(env) == before, "a refused request reached a model service"
    REPORT["6 bad input"] = f"{len(BAD_REQUESTS)} cases, all refused with the right code, 0 model calls"


def test_non_utf8_text_is_invalid_argument(env):
    channel = grpc.insecure_channel(env.orch["A"].address)
    raw = channel.unary_unary("/specdec.v1.Orchestrator/Generate", request_serializer=None, response_deserializer=None)
    bad = b"\x0a\x03\xff\xfe\xfd"  # field 1 (prompt), 3 bytes that are not UTF-8
    with pytest.raises(grpc.RpcError) as err:
        raw(bad, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.value.code(), err.value.details())
    assert "UTF-8" in err.value.details()


@pytest.mark.parametrize("role", ["target", "draft"])
def test_out_of_vocabulary_ids_sent_to_a_model_service(env, role):
    proc = env.stack.targets[0] if role == "target" else env.stack.drafts[0]
    channel = grpc.insecure_channel(proc.address)
    for ids in ([1, 2, 10**9], [1, -5]):
        with pytest.raises(grpc.RpcError) as err:
            if role == "target":
                target_pb2_grpc.TargetStub(channel).Verify(
                    target_pb2.VerifyRequest(session_id="oov", context_ids=ids, draft_ids=[3]), timeout=10
                )
            else:
                draft_pb2_grpc.DraftStub(channel).Propose(
                    draft_pb2.ProposeRequest(session_id="oov", context_ids=ids, k=2), timeout=10
                )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert worker_counters(proc)["last-ok"] == 1, "a bad request must not mark the worker failed"


sampling_st = st.fixed_dictionaries(
    {},
    optional={
        "temperature": st.floats(allow_nan=True, allow_infinity=True, width=32),
        "top_k": st.integers(-5, 100),
        "top_p": st.floats(-1, 2, width=32),
        "seed": st.integers(0, 2**64 - 1),
        "repetition_penalty": st.floats(-1, 3, width=32),
        "frequency_penalty": st.floats(-3, 3, width=32),
        "presence_penalty": st.floats(-3, 3, width=32),
        "draft_top_n": st.integers(-3, 100),
    },
)
request_st = st.fixed_dictionaries(
    {},
    optional={
        "prompt": st.text(max_size=30),
        "session_id": st.text(max_size=6),
        "create_session": st.booleans(),
        "request_id": st.text(max_size=6),
        "resume_offset": st.integers(0, 2**32 - 1),
        "max_new_tokens": st.one_of(st.integers(-3, 12), st.sampled_from([2048, 5000, 2**31 - 1])),
        "k": st.integers(-3, 20),
        "draft_kind": st.sampled_from(["", "model", "ngram", "bogus"]),
        "sampling": sampling_st,
        "stop": st.lists(st.text(max_size=4), max_size=10),
        "trace": st.booleans(),
        "ignore_eos": st.booleans(),
        "min_tokens": st.integers(-3, 20),
        "logprobs": st.integers(-3, 25),
        "add_generation_prompt": st.booleans(),
        "max_rounds": st.integers(-3, 50),
    },
)


def test_fuzz_generate_request(env):
    stub = env.stub("A")
    seen: dict[str, int] = {}

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(request_st)
    def one(fields):
        try:
            request = pb.GenerateRequest(**fields)
        except (ValueError, TypeError):
            return  # not representable on the wire (e.g. lone surrogates)
        try:
            stub.Generate(request, timeout=RPC_TIMEOUT_S)
            code = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            code = exc.code()
            assert code in OK_CODES, f"{code}: {exc.details()} for {fields}"
            assert exc.details() and "Traceback" not in exc.details()
        seen[code.name] = seen.get(code.name, 0) + 1

    one()
    REPORT["6 fuzz"] = f"status codes seen: {seen}"


# -- 5. overload -----------------------------------------------------------------------------------


def test_overload_excess_is_refused_at_admission(env):
    stub, n = env.stub("S"), 3 * CAP
    t1, _d1 = env.stack.targets[0], env.stack.drafts[0]
    before, adm0 = session_passes(env, [t1]), admission(env, "S")
    results: list = [None] * n
    barrier = threading.Barrier(n)

    def one(i: int) -> None:
        barrier.wait()
        try:
            results[i] = stub.Generate(
                pb.GenerateRequest(prompt=PROMPT, k=K, max_new_tokens=150, ignore_eos=True), timeout=RPC_TIMEOUT_S
            )
        except grpc.RpcError as exc:
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(RPC_TIMEOUT_S)
    ok = [r for r in results if isinstance(r, pb.GenerateResponse)]
    refused = [r for r in results if isinstance(r, grpc.RpcError)]
    assert all(r.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "limit 2" in r.details() for r in refused)
    assert len(ok) == CAP and len(refused) == n - CAP
    for r in ok:
        check_tokens(env, list(r.token_ids), 150)
    # the admitted sessions' passes, batched together or not, and nothing else: a refused request ran no round
    assert session_passes(env, [t1]) - before == sum(r.stats.target_passes for r in ok), "a refused request ran a round"
    adm = admission(env, "S")
    assert adm["active"] == 0 and adm["admitted"] == adm["released"]
    assert adm["rejected"] - adm0["rejected"] == n - CAP
    REPORT["5 overload"] = f"{n} requests, cap {CAP}: {len(ok)} finished, {len(refused)} RESOURCE_EXHAUSTED; {adm}"


# -- 4. cancel ---------------------------------------------------------------------------------------


def test_client_cancel_stops_model_calls_and_releases(env):
    sid = session_for("cancel", env.stack.targets[0], env.stack.drafts[0], env.stack)
    before = model_calls(env)
    stream = Stream(env.stub("A"), long_request(sid, "r1", n=1500))
    stream.wait_tokens(KILL_AFTER)
    stream.call.cancel()
    cancelled_at = time.monotonic()
    stream.finish()
    assert stream.error is not None and stream.error.code() == grpc.StatusCode.CANCELLED
    released = wait_for(lambda: admission(env, "A")["active"] == 0, "admission released")
    wait_for(
        lambda: env.stub("A").GetSession(pb.SessionRequest(session_id=sid), timeout=5).status == "idle", "session idle"
    )
    settled = model_calls(env)
    time.sleep(1.0)
    assert model_calls(env) == settled, "model calls continued after the cancel"
    rounds = stored_rounds(env, sid)
    # one Verify per stored round, plus at most the round that was in flight (its draft call too)
    assert rounds <= settled - before <= 2 * rounds + 2
    statuses = env.stub("A").Status(pb.StatusRequest(), timeout=5).replicas
    assert all(r.in_flight == 0 for r in statuses)
    REPORT["4 cancel"] = (
        f"admission back to 0 after {released * 1000:.0f} ms, {rounds} rounds stored, "
        f"{settled - before} model calls, none after the cancel; "
        f"{len(stream.tokens)} tokens received before cancel, cancel->settled "
        f"{(time.monotonic() - cancelled_at):.1f}s (incl. 1 s quiet check)"
    )


def stored_rounds(env: Env, session_id: str) -> int:
    import asyncio

    from orchestrator.session_store import SessionStore, open_redis

    async def read():
        client = open_redis(env.redis.url)
        try:
            return (await SessionStore(client).get(session_id)).rounds
        finally:
            await client.aclose()

    return asyncio.run(read())


# -- 8. health: failing worker -------------------------------------------------------------------------


def test_health_not_serving_while_last_forward_failed(env):
    t2 = env.stack.targets[1]
    stub = target_pb2_grpc.TargetStub(grpc.insecure_channel(t2.address))
    verify = target_pb2.VerifyRequest(session_id="health", context_ids=[1, 2, 3], draft_ids=[4])
    env.fault_file.write_text("fail")
    try:
        with pytest.raises(grpc.RpcError) as err:
            stub.Verify(verify, timeout=10)
        assert err.value.code() == grpc.StatusCode.INTERNAL and "injected fault" in err.value.details()
        took = wait_for(lambda: health_check(t2.address)[1] == "NOT_SERVING", "NOT_SERVING after a failed forward")
    finally:
        env.fault_file.unlink()
    stub.Verify(verify, timeout=10)
    back = wait_for(lambda: health_check(t2.address)[0], "SERVING after a good forward")
    REPORT["8 health (failed forward)"] = (
        f"NOT_SERVING {took * 1000:.0f} ms after the failure, SERVING {back * 1000:.0f} ms after the next success"
    )


# -- 1. target replica killed ------------------------------------------------------------------------


def test_target_killed_mid_stream(env):
    t1, _t2, d1 = env.stack.targets[0], env.stack.targets[1], env.stack.drafts[0]
    sid_a, sid_s = session_for("tkill-a", t1, d1, env.stack), session_for("tkill-s", t1, d1, env.stack)
    two = Stream(env.stub("A"), long_request(sid_a, "r1", trace=True))  # 2 target replicas
    one = Stream(env.stub("S"), long_request(sid_s, "r1"), timeout=WAIT_S)  # 1 target replica
    two.wait_tokens(KILL_AFTER)
    one.wait_tokens(KILL_AFTER)
    os.kill(t1.popen.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    one.finish(), two.finish()
    # single replica: UNAVAILABLE, well before the deadline
    assert one.error is not None and one.error.code() == grpc.StatusCode.UNAVAILABLE, one.error
    unavailable_after = one.error_at - killed_at
    # two replicas: the stream completed on the other one
    assert two.error is None and two.final is not None and not two.gaps, (two.error, two.gaps)
    tie_two = check_tokens(env, two.tokens)
    assert stored_completion(env, sid_a) == two.tokens
    assert two.final.stats.retries >= 1
    # the single-replica client retries elsewhere with the same request id and its offset
    retry_start = time.monotonic()
    resumed = Stream(
        env.stub("A"), long_request(sid_s, "r1", resume_offset=len(one.tokens)), offset=len(one.tokens)
    ).finish()
    assert resumed.error is None and not resumed.gaps and not one.gaps
    tie_one = check_tokens(env, one.tokens + resumed.tokens)
    assert stored_completion(env, sid_s) == one.tokens + resumed.tokens
    resume_ms = (resumed.times[0] - retry_start) * 1000
    new, seen = restart_observing(env, t1)
    assert seen[0] != "SERVING" and seen[-1] == "SERVING", seen  # NOT_SERVING (or unreachable) while loading
    wait_for(
        lambda: all(r.healthy for r in env.stub("S").Status(pb.StatusRequest(), timeout=5).replicas),
        "orchestrator S sees T1 again",
    )
    REPORT["1 target killed"] = (
        f"2 replicas: completed, {len(two.tokens)} tokens, 0 lost/dup, max chunk gap around the kill "
        f"{max_gap_ms(two.times):.0f} ms {tie_two}; 1 replica: UNAVAILABLE {unavailable_after * 1000:.0f} ms after "
        f"the kill ({one.error.details()[:80]}...), resumed elsewhere with offset {len(one.tokens)}: first chunk "
        f"after {resume_ms:.0f} ms, 0 lost/dup {tie_one}; restart health seen: {seen}"
    )


# -- 2. draft killed ------------------------------------------------------------------------------


def test_draft_killed(env):
    t1, d1 = env.stack.targets[0], env.stack.drafts[0]
    sid = session_for("dkill", t1, d1, env.stack)
    before = Stream(env.stub("A"), long_request(sid, "r1", trace=True))
    solo = Stream(env.stub("S"), long_request(session_for("dkill-s", t1, d1, env.stack), "r1"))
    before.wait_tokens(KILL_AFTER)
    solo.wait_tokens(KILL_AFTER)
    os.kill(d1.popen.pid, signal.SIGKILL)
    before.finish(), solo.finish()
    assert before.error is None and not before.gaps and solo.error is None and not solo.gaps
    check_tokens(env, before.tokens), check_tokens(env, solo.tokens)
    assert solo.final.stats.degraded_rounds > 0  # S has no other draft: k = 0 rounds
    assert before.final.stats.degraded_rounds == 0 or before.final.stats.retries > 0
    new, _ = restart_observing(env, d1)
    back_at = time.monotonic()

    def not_degraded() -> bool:
        r = env.stub("S").Generate(
            pb.GenerateRequest(prompt=PROMPT, k=K, max_new_tokens=8, ignore_eos=True), timeout=RPC_TIMEOUT_S
        )
        return r.stats.degraded_rounds == 0 and r.stats.draft_tokens > 0

    recovered = wait_for(not_degraded, "the draft pool to use the restarted draft")
    REPORT["2 draft killed"] = (
        f"2 drafts: completed, retries {before.final.stats.retries}, degraded {before.final.stats.degraded_rounds}; "
        f"1 draft: completed with {solo.final.stats.degraded_rounds}/{solo.final.stats.rounds} degraded rounds; "
        f"0 lost/dup; draft used again {recovered * 1000:.0f} ms after it was SERVING "
        f"({(time.monotonic() - back_at) * 1000:.0f} ms)"
    )


# -- 3. orchestrator killed; zombie -----------------------------------------------------------------


def test_orchestrator_killed_client_resumes_elsewhere(env):
    sid = session_for("okill", env.stack.targets[0], env.stack.drafts[0], env.stack)
    first = Stream(env.stub("A"), long_request(sid, "r1"))
    first.wait_tokens(KILL_AFTER)
    os.kill(env.orch["A"].popen.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    first.finish()
    assert first.error is not None and first.error.code() == grpc.StatusCode.UNAVAILABLE
    held = len(first.tokens)
    second = Stream(env.stub("B"), long_request(sid, "r1", resume_offset=held), offset=held).finish()
    assert second.error is None and not first.gaps and not second.gaps, (second.error, second.gaps)
    tie = check_tokens(env, first.tokens + second.tokens)
    assert stored_completion(env, sid) == first.tokens + second.tokens
    recover_ms = (second.times[0] - killed_at) * 1000
    env.orch["A"] = env.stack.restart(env.orch["A"])
    env.stack.wait_ready(env.orch["A"])
    REPORT["3 orchestrator killed"] = (
        f"{held} tokens before the kill, {len(second.tokens)} after, 0 lost/dup {tie}; "
        f"first resumed chunk {recover_ms:.0f} ms after the kill (lease {LEASE_S} s)"
    )


def test_zombie_orchestrator_cannot_append(env):
    sid = session_for("zombie", env.stack.targets[0], env.stack.drafts[0], env.stack)
    zombie_proc = env.orch["B"]
    zombie = Stream(env.stub("B"), long_request(sid, "r1"), timeout=120)
    zombie.wait_tokens(KILL_AFTER)
    os.kill(zombie_proc.popen.pid, signal.SIGSTOP)
    try:
        time.sleep(0.2)
        held = len(zombie.tokens)
        stopped_at = time.monotonic()
        taker = Stream(env.stub("A"), long_request(sid, "r1", resume_offset=held), offset=held).finish()
        assert taker.error is None and not taker.gaps, taker.error
        takeover_ms = (taker.times[0] - stopped_at) * 1000
    finally:
        os.kill(zombie_proc.popen.pid, signal.SIGCONT)
    zombie.finish()
    assert zombie.error is not None and zombie.error.code() == grpc.StatusCode.ABORTED, zombie.error
    assert "lease" in zombie.error.details()
    total = zombie.tokens[:held] + taker.tokens
    tie = check_tokens(env, total)
    assert stored_completion(env, sid) == total, "the zombie appended"
    REPORT["3 zombie"] = (
        f"zombie got ABORTED ({zombie.error.details()[:70]}...), nothing appended; takeover "
        f"{takeover_ms:.0f} ms after the freeze, 0 lost/dup {tie}"
    )


# -- 7. Redis unavailable ------------------------------------------------------------------------------


def test_redis_unavailable_then_back_with_persistence(env):
    stub = env.stub("A")
    sid = f"redis-{uuid.uuid4().hex[:8]}"
    first = stub.Generate(
        pb.GenerateRequest(prompt=PROMPT, session_id=sid, create_session=True, max_new_tokens=8, ignore_eos=True),
        timeout=RPC_TIMEOUT_S,
    )
    env.redis.stop()
    try:
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            stub.Generate(pb.GenerateRequest(prompt=PROMPT, max_new_tokens=8), timeout=RPC_TIMEOUT_S)
        error_ms = (time.monotonic() - start) * 1000
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "Redis" in err.value.details() and "Traceback" not in err.value.details()
        with pytest.raises(grpc.RpcError) as err2:
            stub.GetSession(pb.SessionRequest(session_id=sid), timeout=RPC_TIMEOUT_S)
        assert err2.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        env.redis.start()
    restarted = time.monotonic()

    def works() -> bool:
        try:
            stub.Generate(pb.GenerateRequest(prompt=PROMPT, max_new_tokens=4), timeout=RPC_TIMEOUT_S)
            return True
        except grpc.RpcError:
            return False

    wait_for(works, "generation after Redis is back")
    recover_ms = (time.monotonic() - restarted) * 1000
    info = stub.GetSession(pb.SessionRequest(session_id=sid), timeout=10)
    assert info.total_tokens == first.usage.total_tokens and info.status == "idle"
    stub.Generate(pb.GenerateRequest(prompt=" more", session_id=sid, max_new_tokens=4), timeout=RPC_TIMEOUT_S)
    REPORT["7 redis"] = (
        f"UNAVAILABLE after {error_ms:.0f} ms ({err.value.details()[:90]}); generating again "
        f"{recover_ms:.0f} ms after Redis restarted; session survived the restart (AOF)"
    )


# -- 7b. health follows Redis ------------------------------------------------------------------------------


def wait_health(address: str, serving: bool, timeout: float = WAIT_S) -> float:
    """Seconds until the service's health is SERVING / NOT_SERVING (reachable, not a connect error)."""
    want = "SERVING" if serving else "NOT_SERVING"
    return wait_for(lambda: health_check(address, timeout=1.0)[1] == want, f"{address} {want}", timeout)


def test_health_and_gateway_health_follow_redis(env, tmp_path):
    """Redis stopped: the orchestrator's gRPC health is NOT_SERVING within one health pass, the HTTP
    gateway's /health answers 503, a request fails UNAVAILABLE naming Redis at once; Redis back:
    SERVING (and 200) within one pass."""
    orch = env.orch["A"]
    gateway = GatewayProcess(orchestrator=orch.address, log_dir=str(tmp_path)).start()
    try:
        assert get_health(gateway.url)[0] == 200
        env.redis.stop()
        try:
            down_s = wait_health(orch.address, serving=False)
            assert down_s <= HEALTH_BOUND_S, down_s
            status, body = get_health(gateway.url)
            assert (status, body["orchestrator_health"]) == (503, "NOT_SERVING"), body
            # liveness is not readiness: a Redis outage takes the orchestrator out of rotation, no restart
            assert health_check(orch.address, service=LIVENESS_SERVICE, timeout=1.0) == (True, "SERVING")
            start = time.monotonic()
            with pytest.raises(grpc.RpcError) as err:
                env.stub("A").Generate(pb.GenerateRequest(prompt=PROMPT, max_new_tokens=4), timeout=RPC_TIMEOUT_S)
            refused_ms = (time.monotonic() - start) * 1000
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert err.value.details().startswith("session store (Redis) unavailable"), err.value.details()
        finally:
            env.redis.start()
        up_s = wait_health(orch.address, serving=True)
        assert up_s <= HEALTH_BOUND_S, up_s
        assert wait_for(lambda: get_health(gateway.url)[0] == 200, "gateway /health 200") < HEALTH_BOUND_S
    finally:
        gateway.stop()
    for proc in env.orch.values():
        wait_health(proc.address, serving=True)
    REPORT["7b health/redis"] = (
        f"NOT_SERVING {down_s * 1000:.0f} ms after Redis stopped, request refused in "
        f"{refused_ms:.0f} ms, SERVING {up_s * 1000:.0f} ms after it was back"
    )


def test_wrong_redis_password_is_not_serving_until_it_is_accepted(env):
    """An orchestrator given the wrong Redis password never reports SERVING (requests: UNAVAILABLE naming
    the credentials); once Redis accepts that password (rotation done), it serves within one pass."""
    with EmbeddedRedis(password="right-password") as locked:
        wrong = locked.url.replace("right-password", "wrong-password")
        proc = env.stack.start_orchestrator(env.stack.targets[:1], env.stack.drafts[:1], ["--redis-url", wrong])
        try:
            wait_health(proc.address, serving=False, timeout=120)
            stub = orchestrator_pb2_grpc.OrchestratorStub(grpc.insecure_channel(proc.address))
            with pytest.raises(grpc.RpcError) as err:
                stub.Generate(pb.GenerateRequest(prompt=PROMPT, max_new_tokens=4), timeout=RPC_TIMEOUT_S)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "refused this orchestrator's credentials" in err.value.details(), err.value.details()
            assert not health_check(proc.address, timeout=1.0)[0]
            with redis_lib.Redis(port=locked.port, password="right-password") as admin:
                admin.config_set("requirepass", "wrong-password")
            up_s = wait_health(proc.address, serving=True)
            assert up_s <= HEALTH_BOUND_S, up_s
            reply = stub.Generate(
                pb.GenerateRequest(prompt=PROMPT, max_new_tokens=4, ignore_eos=True), timeout=RPC_TIMEOUT_S
            )
            assert reply.usage.completion_tokens == 4
        finally:
            proc.popen.terminate()
            proc.popen.wait(timeout=DRAIN_S + 5)
            env.stack.procs.remove(proc)
            env.stack.orchestrators.remove(proc)
    REPORT["7c wrong password"] = (
        f"NOT_SERVING with UNAVAILABLE ({err.value.details()[:80]}); SERVING {up_s * 1000:.0f} ms after Redis accepted the password"
    )


# -- 8. drain --------------------------------------------------------------------------------------------


def test_drain_finishes_in_flight_and_refuses_new(env):
    sid = session_for("drain", env.stack.targets[0], env.stack.drafts[0], env.stack)
    proc = env.orch["B"]
    stream = Stream(env.stub("B"), long_request(sid, "r1"))
    stream.wait_tokens(KILL_AFTER)
    proc.popen.send_signal(signal.SIGTERM)
    wait_for(lambda: not health_check(proc.address, timeout=1.0)[0], "NOT_SERVING while draining", timeout=5)
    with pytest.raises(grpc.RpcError) as err:
        env.stub("B").Generate(pb.GenerateRequest(prompt=PROMPT, max_new_tokens=4), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    env.stub("A").Generate(pb.GenerateRequest(prompt=PROMPT, max_new_tokens=4), timeout=RPC_TIMEOUT_S)  # elsewhere
    stream.finish()
    assert stream.error is None and not stream.gaps, stream.error
    tie = check_tokens(env, stream.tokens)
    assert proc.popen.wait(timeout=DRAIN_S + 5) == 0
    REPORT["8 drain"] = f"in-flight stream finished ({len(stream.tokens)} tokens {tie}), new call UNAVAILABLE, exit 0"


def test_draining_target_loses_no_token(env):
    """A target replica drained (SIGTERM) mid-generation: it answers the call in flight and refuses new ones,
    the generation goes on on the other target with no token lost or doubled, and the drained target exits
    without waiting out its grace period."""
    t1, d1 = env.stack.targets[0], env.stack.drafts[0]
    sid = session_for("tdrain", t1, d1, env.stack)
    stream = Stream(env.stub("A"), long_request(sid, "r1"))
    stream.wait_tokens(KILL_AFTER)
    drained_at = time.monotonic()
    t1.popen.send_signal(signal.SIGTERM)
    assert t1.popen.wait(timeout=DRAIN_S + 5) == 0
    exited_after = time.monotonic() - drained_at
    stream.finish()
    assert stream.error is None and stream.final is not None and not stream.gaps, (stream.error, stream.gaps)
    tie = check_tokens(env, stream.tokens)
    assert stored_completion(env, sid) == stream.tokens
    assert exited_after < DRAIN_S, f"the drained target waited {exited_after:.1f} s: something held the drain"
    new, _ = restart_observing(env, t1)
    wait_for(
        lambda: all(r.healthy for r in env.stub("A").Status(pb.StatusRequest(), timeout=5).replicas),
        "orchestrator A sees T1 again",
    )
    REPORT["8 drain (target)"] = (
        f"target exited 0 {exited_after:.1f} s after SIGTERM (grace {DRAIN_S:.0f} s), "
        f"generation finished elsewhere: {len(stream.tokens)} tokens, 0 lost/dup {tie}"
    )
