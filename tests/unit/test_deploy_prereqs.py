"""`make deploy-test` checks what it needs before it builds anything, and says how to install what is missing
(deploy_tools/prereqs.py), here against a fake PATH."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from deploy_tools import prereqs

ROOT = Path(__file__).resolve().parents[2]
# A docker client whose engine answers (`docker info`), has no base image and has the compose plugin.
DOCKER_OK = """#!/bin/sh
case "$1" in info) exit 0 ;; image) exit 1 ;; compose) exit 0 ;; esac
exit 0
"""
DOCKER_NO_ENGINE = """#!/bin/sh
echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock" >&2
exit 1
"""


def fake_path(tmp_path: Path, **tools: str) -> str:
    """A PATH holding only these executables (name -> script)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, script in tools.items():
        tool = bin_dir / name
        tool.write_text(script)
        tool.chmod(0o755)
    return str(bin_dir)


def check(path: str, tmp_path: Path) -> str:
    return prereqs.message(prereqs.missing(path=path, tools_compose=tmp_path / "no-compose"))


def test_without_debootstrap_the_message_names_its_install_command(tmp_path):
    text = check(fake_path(tmp_path, docker=DOCKER_OK), tmp_path)
    assert "debootstrap" in text and "apt-get install debootstrap" in text
    assert "docker.io" not in text


def test_without_docker_the_message_names_both_packages(tmp_path):
    text = check(fake_path(tmp_path), tmp_path)
    assert "apt-get install docker.io debootstrap" in text


def test_an_engine_that_does_not_answer_is_named(tmp_path):
    text = check(fake_path(tmp_path, docker=DOCKER_NO_ENGINE, debootstrap="#!/bin/sh\n"), tmp_path)
    assert "docker engine" in text and "Cannot connect" in text


def test_without_compose_v2_the_message_says_make_deploy_tools(tmp_path):
    docker = DOCKER_OK.replace("compose) exit 0", "compose) exit 1")
    text = check(fake_path(tmp_path, docker=docker, debootstrap="#!/bin/sh\n"), tmp_path)
    assert "make deploy-tools" in text


def test_all_present_is_silent(tmp_path):
    assert (
        prereqs.missing(
            path=fake_path(tmp_path, docker=DOCKER_OK, debootstrap="#!/bin/sh\n"), tools_compose=tmp_path / "no-compose"
        )
        == []
    )


def test_the_command_line_exits_nonzero_with_the_message(tmp_path):
    env = {"PATH": fake_path(tmp_path, docker=DOCKER_OK), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "deploy_tools.prereqs", "--tools-pending"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == prereqs.EXIT_MISSING, out
    assert "apt-get install debootstrap" in out.stderr


def test_make_deploy_test_checks_before_it_builds():
    makefile = (ROOT / "Makefile").read_text()
    rule = next(line for line in makefile.splitlines() if line.startswith("deploy-test:"))
    assert rule.split(":", 1)[1].split()[0] == "deploy-prereqs"  # make runs prerequisites left to right
