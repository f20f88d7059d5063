"""One process stack shared by the HTTP, client and reflection tests.

Redis + tiny target + tiny draft + orchestrator (specdec.launcher.LocalStack, each a
`python -m specdec.cli serve ...` process) and the HTTP gateway in front of it
(http_gateway.process.GatewayProcess). Started once per test process, on first use,
and stopped at exit, so test_http_api, test_client and test_reflection share it.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from http_gateway.process import GatewayProcess
from specdec.launcher import LocalStack, StackConfig
from tests.prompts import IDENTITY_PROMPTS
from tests.support import make_tiny_pair, target_greedy

AUTH_TOKEN = "test-token"


@dataclass
class HttpStack:
    stack: LocalStack
    gateway: GatewayProcess
    target_dir: Path
    draft_dir: Path
    started_s: float
    _model: Any = None

    @property
    def orchestrator(self) -> str:
        return self.stack.orchestrator_address

    @property
    def base_url(self) -> str:
        return f"{self.gateway.url}/v1"

    def reference_model(self) -> Any:
        """The tiny target in this process (fp32, CPU): greedy decoding alone is the reference."""
        if self._model is None:
            self._model = AutoModelForCausalLM.from_pretrained(str(self.target_dir), dtype=torch.float32).eval()
        return self._model

    def target_alone(self, prompt_ids: list[int], max_new: int, eos: list[int]) -> list[int]:
        return target_greedy(self.reference_model(), prompt_ids, max_new, eos)

    def stop(self) -> None:
        self.gateway.stop()
        self.stack.stop()
        for d in (self.target_dir, self.draft_dir):  # the logs stay, for a post-mortem
            shutil.rmtree(d, ignore_errors=True)


_lock = threading.Lock()
_shared: HttpStack | None = None


def shared_stack() -> HttpStack:
    """The module-shared stack (started on first call, stopped when the test process exits)."""
    global _shared
    with _lock:
        if _shared is None:
            started = time.perf_counter()
            directory = Path(tempfile.mkdtemp(prefix="specdec-http-"))
            target_dir, draft_dir = make_tiny_pair(directory, IDENTITY_PROMPTS)
            stack = LocalStack(
                StackConfig(
                    target_model=str(target_dir),
                    draft_model=str(draft_dir),
                    draft_kind="model",
                    threads=1,
                    log_dir=str(directory),
                )
            )
            gateway = GatewayProcess("", log_dir=str(directory))
            try:
                stack.start()
                gateway.orchestrator = stack.orchestrator_address
                gateway.start()
            except BaseException:
                gateway.stop()
                stack.stop()
                raise
            _shared = HttpStack(stack, gateway, target_dir, draft_dir, time.perf_counter() - started)
            atexit.register(_shared.stop)
            print(
                f"\n[http stack] started in {_shared.started_s:.1f} s: orchestrator {stack.orchestrator_address}, "
                f"http {gateway.url}"
            )
        return _shared
