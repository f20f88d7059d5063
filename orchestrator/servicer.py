"""Orchestrator gRPC servicer: admission, pair check, then one Generation per call.

Order of checks for Generate/GenerateStream (each before any draft or target call):
  1. the pair: UNAVAILABLE when no target replica answers, FAILED_PRECONDITION when the
     draft/target tokenizers differ;
  2. the request's values: INVALID_ARGUMENT (specdec.params);
  3. admission: RESOURCE_EXHAUSTED beyond OrchestratorConfig.max_concurrent generations.
The client's deadline (context.time_remaining()) is handed to the Generation, which caps
every inter-service call with it.

Observable counters (no proto change): Status replies carry the admission counters as
trailing metadata (ADMISSION_METADATA_PREFIX + active / admitted / released / rejected).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from orchestrator.affinity import ConversationRoutes, conversation_key, routed_by
from orchestrator.deps import Deps
from orchestrator.generation import Generation, store_errors
from orchestrator.idempotency import check_id, keyed_session
from orchestrator.pair import PairMonitor
from specdec.errors import NotFound, ResourceExhausted
from specdec.metrics import OrchestratorMetrics
from specdec.protocol import PROTOCOL_VERSION
from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import orchestrator_pb2_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Orchestrator"].full_name
ADMISSION_METADATA_PREFIX = "specdec-admission-"


@dataclass
class Admission:
    """Our own cap on concurrent generations (excess -> RESOURCE_EXHAUSTED before any model call)."""

    cap: int
    active: int = 0
    admitted: int = 0
    released: int = 0
    rejected: int = 0
    metrics: OrchestratorMetrics | None = None

    def enter(self) -> None:
        if self.active >= self.cap:
            self.rejected += 1
            if self.metrics is not None:
                self.metrics.rejected.inc()
            raise ResourceExhausted(f"server busy: {self.active} generations running (limit {self.cap}); retry later")
        self.active += 1
        self.admitted += 1
        if self.metrics is not None:
            self.metrics.in_flight.set(self.active)

    def leave(self) -> None:
        self.active -= 1
        self.released += 1
        if self.metrics is not None:
            self.metrics.in_flight.set(self.active)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The counters as gRPC metadata pairs."""
        values = {
            "active": self.active,
            "admitted": self.admitted,
            "released": self.released,
            "rejected": self.rejected,
            "cap": self.cap,
        }
        return tuple((ADMISSION_METADATA_PREFIX + name, str(v)) for name, v in values.items())


def client_deadline(context: grpc.aio.ServicerContext) -> float | None:
    """The client's deadline as a time.monotonic() value (None when it set none)."""
    left = context.time_remaining()
    return None if left is None else time.monotonic() + left


class OrchestratorServicer(orchestrator_pb2_grpc.OrchestratorServicer):
    """Implements specdec.v1.Orchestrator."""

    def __init__(self, deps: Deps, pair: PairMonitor, admission: Admission) -> None:
        self.deps = deps
        self.pair = pair
        self.admission = admission
        self.routes = ConversationRoutes()  # generations in flight per conversation key

    async def _start(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> Generation:
        left = context.time_remaining()
        wait_s = self.deps.cfg.first_check_wait_s
        await self.pair.wait_checked(wait_s if left is None else min(wait_s, left))
        problem = self.pair.problem_error()
        if problem is not None:
            raise problem
        with store_errors():  # a request_id without session_id runs in the session its key names
            keyed = await keyed_session(self.deps.store, request, self.deps.cfg.limits.max_id_chars)
        generation = Generation(self.deps, request, client_deadline(context), keyed)  # INVALID_ARGUMENT first
        # the same idempotency key generating here already: refused (orchestrator/idempotency.py)
        self.deps.running.enter(generation.session_id, generation.request_id, generation.fingerprint)
        cfg = self.deps.cfg  # a stateless request goes to its conversation's replicas (orchestrator/affinity.py)
        key = "" if request.HasField("session_id") else conversation_key(request, cfg.affinity_prompt_chars)
        generation.route = self.routes.claim(key, cfg.affinity_max_live)
        try:
            self.admission.enter()
        except BaseException:
            self._leave(generation, admitted=False)
            raise
        self.deps.metrics.routes.labels(by=routed_by(generation.route)).inc()
        return generation

    def _leave(self, generation: Generation, admitted: bool = True) -> None:
        self.deps.running.leave(generation.session_id, generation.request_id)
        self.routes.release(generation.route)
        if admitted:
            self.admission.leave()

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> pb.GenerateResponse:
        generation = await self._start(request, context)
        try:
            async for _ in generation.chunks():
                pass
        finally:
            self._leave(generation)
        return generation.response()

    async def GenerateStream(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateChunk]:
        generation = await self._start(request, context)
        try:
            async for chunk in generation.chunks():
                yield chunk
        finally:
            self._leave(generation)

    async def GetSession(self, request: pb.SessionRequest, context: Any) -> pb.SessionInfo:
        check_id("session_id", request.session_id, self.deps.cfg.limits.max_id_chars)
        with store_errors():
            s = await self.deps.store.get(request.session_id)
        if s is None:
            raise NotFound(f"session {request.session_id!r} does not exist")
        return pb.SessionInfo(
            session_id=s.session_id,
            status=s.status,
            prompt_tokens=s.prompt_tokens,
            total_tokens=len(s.ids),
            turns=s.turns,
            version=s.version,
            created_at=s.created_at,
            updated_at=s.updated_at,
            request_id=s.request_id,
        )

    async def DeleteSession(self, request: pb.SessionRequest, context: Any) -> pb.SessionInfo:
        info = await self.GetSession(request, context)
        with store_errors():
            await self.deps.store.delete(request.session_id)
        await self.pair.release_session(request.session_id)
        info.status = "deleted"
        return info

    async def Status(self, request: pb.StatusRequest, context: Any) -> pb.StatusResponse:
        context.set_trailing_metadata(self.admission.metadata())
        return pb.StatusResponse(
            protocol_version=PROTOCOL_VERSION, target_model=self.deps.model_name, replicas=self.pair.replica_statuses()
        )
