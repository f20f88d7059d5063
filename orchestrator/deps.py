"""What a generation needs from its orchestrator: configuration, the session store, the round runner, the prompt
template, and the state its generations share (measured costs, the requests running)."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.adaptive import CostModel
from orchestrator.idempotency import RunningRequests
from orchestrator.prompting import Prompter
from orchestrator.rounds import RoundRunner
from orchestrator.session_store import SessionStore
from specdec.config import OrchestratorConfig
from specdec.metrics import OrchestratorMetrics


@dataclass
class Deps:
    """What a generation needs from its orchestrator."""

    cfg: OrchestratorConfig
    store: SessionStore
    runner: RoundRunner
    prompter: Prompter
    eos_ids: frozenset[int]
    max_context: int
    owner: str
    model_name: str
    metrics: OrchestratorMetrics = field(default_factory=OrchestratorMetrics)
    costs: CostModel = field(default_factory=CostModel)  # measured draft/verify costs, shared by sessions
    running: RunningRequests = field(default_factory=RunningRequests)  # requests generating in this process
