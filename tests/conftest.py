"""Fixtures shared by the suite: a real Redis server, thread limits."""

from __future__ import annotations

import os

import pytest
import torch

from specdec import forkserver
from specdec.redis_server import EmbeddedRedis
from tests.deploy_support import start_tools_in_background, uses_tools

TEST_THREADS = 1
pytest_plugins = ["tests.stall_monitor"]
# Stacks started by the tests (and by the CLIs they run) fork their services from one process that imported
# torch and transformers once (specdec/forkserver.py): ~7 s of CPU less per service. test_processes and the
# README's `specdec up` keep the exec start a deployment uses.
os.environ.setdefault(forkserver.START_METHOD_ENV, forkserver.FORKSERVER)


@pytest.fixture(autouse=True, scope="session")
def _limit_threads() -> None:
    """Two cores are shared by the test process and the services it starts."""
    torch.set_num_threads(TEST_THREADS)


@pytest.fixture(scope="session")
def redis_server():
    """A real redis-server process on a free loopback port (no persistence)."""
    with EmbeddedRedis() as server:
        yield server


def pytest_collection_finish(session: pytest.Session) -> None:
    """The deploy tools' venv (a minute of pip) is made in the background from the start of a run that
    will need it, instead of in the setup of its first test (`tests.deploy_support.tool`)."""
    if any(uses_tools(getattr(item, "module", None)) for item in session.items):
        start_tools_in_background()
