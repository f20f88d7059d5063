"""`specdec serve target`: run the target service until SIGTERM."""

from __future__ import annotations

from specdec.config import ModelServiceConfig
from specdec.engine.loading import load_target
from specdec.server.model_service import run_model_service
from target_service.servicer import SERVICE_NAME, TargetServicer, add_to_server


async def serve(cfg: ModelServiceConfig) -> None:
    """Serve specdec.v1.Target with the configured model."""
    cfg.role = "target"
    await run_model_service(cfg, TargetServicer(), SERVICE_NAME, add_to_server, load_target)
