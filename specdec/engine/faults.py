"""Fault injection for the reliability tests (SPECDEC_FAULT_FILE): testing only, off unless set.

While the file exists, every call of the model worker fails with RuntimeError before touching the model: a real
worker failure, which drives health to NOT_SERVING and back (tests/integration/test_reliability_scenarios.py).
It is installed at start only where the setting names a file, as a wrapper around the worker's calls, so a
service without it runs no check at all.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from specdec.engine.worker import ModelWorker

T = TypeVar("T")


def inject_faults(worker: ModelWorker, fault_file: str) -> None:
    """Make `worker` fail each call while `fault_file` exists (counted as the worker's failure, as a crash of
    the model would be)."""
    call = worker.call

    def call_or_fail(fn: Callable[[], T]) -> T:
        def failing() -> T:
            if os.path.exists(fault_file):
                raise RuntimeError(f"injected fault ({fault_file} exists)")
            return fn()

        return call(failing)

    worker.call = call_or_fail  # type: ignore[method-assign]  # the test-only wrapper, installed once at start
