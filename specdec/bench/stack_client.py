"""The bench's client of a running stack: generations over GenerateStream (tokens, arrival times, final
stats, rounds), then the KV and Redis bytes each session held, read from the services' Stats RPC and
the session store before the session is dropped everywhere."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from specdec.bench.plan import Prompt
from specdec.report import in_target_ms

log = logging.getLogger("specdec.bench")

RPC_TIMEOUT_S = 600.0


class StackClient:
    """Talks to the orchestrator (GenerateStream) and to the model services (Stats, Release)."""

    def __init__(self, stack: Any) -> None:
        import grpc

        from specdec.v1 import draft_pb2_grpc, orchestrator_pb2_grpc, target_pb2_grpc

        self.stack = stack
        self._channels: list[grpc.Channel] = []

        def chan(address: str) -> Any:
            c = grpc.insecure_channel(address)
            self._channels.append(c)
            return c

        self.orch = orchestrator_pb2_grpc.OrchestratorStub(chan(stack.orchestrator_address))
        self.targets = [target_pb2_grpc.TargetStub(chan(p.address)) for p in stack.procs if p.role == "target"]
        self.drafts = [draft_pb2_grpc.DraftStub(chan(p.address)) for p in stack.procs if p.role == "draft"]
        self._loop = asyncio.new_event_loop()
        self.stats_error = ""
        self._store = None
        if stack.redis is not None:
            from orchestrator.session_store import SessionStore, open_redis

            self._redis = open_redis(stack.redis.url)
            self._store = SessionStore(self._redis)

    def generate(
        self,
        prompt: Prompt,
        k: int | None,
        max_new_tokens: int,
        adaptive: bool = False,
    ) -> tuple[list[int], float, list, Any, list]:
        from specdec.v1 import orchestrator_pb2 as pb

        req = pb.GenerateRequest(
            max_new_tokens=max_new_tokens, ignore_eos=True, trace=True, request_id=uuid.uuid4().hex
        )
        req.messages.messages.add(role="user", content=prompt.user)
        req.sampling.temperature = 0.0
        if k is not None:
            req.k = k
        if adaptive:
            req.adaptive_k = True
        tokens: list[int] = []
        arrivals: list[tuple[float, int]] = []
        rounds: list = []
        final = None
        start = time.perf_counter()
        for chunk in self.orch.GenerateStream(req, timeout=RPC_TIMEOUT_S):
            now = time.perf_counter() - start
            if chunk.token_ids:
                arrivals.append((now, len(chunk.token_ids)))
                tokens += list(chunk.token_ids)
            rounds += list(chunk.rounds)
            if chunk.HasField("finish_reason"):
                final = chunk
        wall = time.perf_counter() - start
        return tokens, wall, arrivals, final, rounds

    def memory_after(self, session_id: str) -> dict[str, Any]:
        """KV bytes held for the session on draft and target, its Redis bytes; then drop all three."""
        import grpc

        from specdec.v1 import common_pb2
        from specdec.v1 import orchestrator_pb2 as pb

        out: dict[str, Any] = {}
        for role, stubs in (("target", self.targets), ("draft", self.drafts)):
            if self.stats_error:
                break
            used, sessions = 0, 0
            try:
                for stub in stubs:
                    s = stub.Stats(common_pb2.InfoRequest(), timeout=10)
                    used += s.cache_used_bytes
                    sessions += s.cached_sessions
            except grpc.RpcError as exc:  # a service without the Stats RPC: KV bytes from the config
                self.stats_error = f"{exc.code().name}: {exc.details()}"
                log.warning(
                    "Stats RPC failed (%s); KV bytes per session are computed from the model config", self.stats_error
                )
                break
            out[f"{role}_kv_bytes"] = used
            out[f"{role}_cached_sessions"] = sessions
        if self._store is not None:
            out["redis_bytes"] = self._loop.run_until_complete(self._store.memory_bytes(session_id))
            sess = self._loop.run_until_complete(self._store.get(session_id))
            out["session_tokens"] = len(sess.ids) if sess is not None else None
        for stubs in (self.targets, self.drafts):
            for stub in stubs:
                stub.Release(common_pb2.ReleaseRequest(session_id=session_id), timeout=10)
        self.orch.DeleteSession(pb.SessionRequest(session_id=session_id), timeout=10)
        return out

    def close(self) -> None:
        for c in self._channels:
            c.close()
        if self._store is not None:
            self._loop.run_until_complete(self._redis.aclose())
        self._loop.close()


def round_dict(r: Any) -> dict[str, Any]:
    return {
        "k": r.k,
        "drafted": len(r.draft_ids),
        "accepted": r.num_accepted,
        "draft_ms": r.draft_ms,
        "target_ms": r.target_ms,
        "overhead_ms": r.overhead_ms,
        "wire_bytes": r.wire_bytes,
        "context_tokens": r.context_tokens,
        "target_service_ms": r.target_service_ms,
        "draft_service_ms": r.draft_service_ms,
        "in_target_ms": in_target_ms(r),
    }


def stats_dict(stats: Any) -> dict[str, Any]:
    from specdec.proto_json import message_to_dict

    return message_to_dict(stats, all_fields=True)
