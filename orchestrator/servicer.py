"""Orchestrator gRPC servicer: admission, pair check, then one Generation per call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncIterator

import grpc

from specdec.errors import FailedPrecondition, NotFound, ResourceExhausted
from specdec.protocol import PROTOCOL_VERSION
from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import orchestrator_pb2_grpc

from orchestrator.generation import Deps, Generation, store_errors
from orchestrator.pair import PairMonitor

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Orchestrator"].full_name


@dataclass
class Admission:
    """Our own cap on concurrent generations (excess -> RESOURCE_EXHAUSTED before any model call)."""

    cap: int
    active: int = 0
    admitted: int = 0
    released: int = 0
    rejected: int = 0

    def enter(self) -> None:
        if self.active >= self.cap:
            self.rejected += 1
            raise ResourceExhausted(f"server busy: {self.active} generations running (limit {self.cap}); retry later")
        self.active += 1
        self.admitted += 1

    def leave(self) -> None:
        self.active -= 1
        self.released += 1


class OrchestratorServicer(orchestrator_pb2_grpc.OrchestratorServicer):
    """Implements specdec.v1.Orchestrator."""

    def __init__(self, deps: Deps, pair: PairMonitor, admission: Admission) -> None:
        self.deps = deps
        self.pair = pair
        self.admission = admission

    def _start(self, request: pb.GenerateRequest) -> Generation:
        problem = self.pair.problem()
        if problem:
            raise FailedPrecondition(problem)
        generation = Generation(self.deps, request)  # validates: INVALID_ARGUMENT before admission
        self.admission.enter()
        return generation

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> pb.GenerateResponse:
        generation = self._start(request)
        try:
            async for _ in generation.chunks():
                pass
        finally:
            self.admission.leave()
        return generation.response()

    async def GenerateStream(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.GenerateChunk]:
        generation = self._start(request)
        try:
            async for chunk in generation.chunks():
                yield chunk
        finally:
            self.admission.leave()

    async def GetSession(self, request: pb.SessionRequest, context: Any) -> pb.SessionInfo:
        with store_errors():
            s = await self.deps.store.get(request.session_id)
        if s is None:
            raise NotFound(f"session {request.session_id!r} does not exist")
        return pb.SessionInfo(session_id=s.session_id, status=s.status, prompt_tokens=s.prompt_tokens,
                              total_tokens=len(s.ids), turns=s.turns, version=s.version,
                              created_at=s.created_at, updated_at=s.updated_at)

    async def DeleteSession(self, request: pb.SessionRequest, context: Any) -> pb.SessionInfo:
        info = await self.GetSession(request, context)
        with store_errors():
            await self.deps.store.delete(request.session_id)
        await self.pair.release_session(request.session_id)
        info.status = "deleted"
        return info

    async def Status(self, request: pb.StatusRequest, context: Any) -> pb.StatusResponse:
        return pb.StatusResponse(protocol_version=PROTOCOL_VERSION, target_model=self.deps.model_name,
                                 replicas=self.pair.replica_statuses())
