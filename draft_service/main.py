"""`specdec serve draft`: run the draft service until SIGTERM."""

from __future__ import annotations

from draft_service.servicer import SERVICE_NAME, DraftServicer, add_to_server
from specdec.config import ModelServiceConfig
from specdec.engine.loading import load_draft
from specdec.server.model_service import run_model_service


async def serve(cfg: ModelServiceConfig) -> None:
    """Serve specdec.v1.Draft with the configured draft kind and model."""
    cfg.role = "draft"
    await run_model_service(cfg, DraftServicer(), SERVICE_NAME, add_to_server, load_draft)
