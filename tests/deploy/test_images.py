"""The built images (run by `make deploy-test`, which sets SPECDEC_DEPLOY_TEST=1 after building).

* Nothing of the build's inputs (CA bundle, index URLs, wheelhouse) reaches a runtime image,
  neither in its history and config nor in its files; no compilers in it.
* The CPU image, started with the rendered `cpu-dev` environment of every Deployment (and the
  Redis image with the StatefulSet's) on one docker network whose aliases are the Services'
  cluster DNS names, reaches SERVING: a container proven here is the one a cluster would run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from tests.deploy.pods import NAMESPACE, PodRunner, docker
from tests.deploy_support import render

TAG = os.environ.get("SPECDEC_DEPLOY_TAG", "dev")
CPU_IMAGE, REDIS_IMAGE = f"specdec-cpu:{TAG}", f"specdec-redis:{TAG}"
START_DEADLINE_S = 300
BUILD_INPUTS = (
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_TRUSTED_HOST",
    "TORCH_INDEX_URL",
    "PIP_CERT",
    "PIP_FIND_LINKS",
    "build-extra",
    "ca.crt",
    "/opt/pypi",
    "/opt/wheels",
)


def _images_present() -> str:
    if os.environ.get("SPECDEC_DEPLOY_TEST") != "1":
        return "image tests run in `make deploy-test` (SPECDEC_DEPLOY_TEST=1), after the images are built"
    if (
        shutil.which("docker") is None
        or subprocess.run(["docker", "info"], capture_output=True, check=False).returncode != 0
    ):
        return "no docker engine reachable"
    for image in (CPU_IMAGE, REDIS_IMAGE):
        if docker("image", "inspect", image, check=False).returncode != 0:
            return f"{image} is not built (make images)"
    return ""


pytestmark = pytest.mark.skipif(bool(_images_present()), reason=_images_present() or "ready")


@pytest.mark.parametrize("image", [CPU_IMAGE, REDIS_IMAGE])
def test_build_inputs_never_reach_the_runtime_image(image):
    history = docker("history", "--no-trunc", "--format", "{{.CreatedBy}}", image).stdout
    config = docker("image", "inspect", image).stdout
    for needle in BUILD_INPUTS:
        assert needle not in history, f"{needle} in the history of {image}"
        assert needle not in config, f"{needle} in the config of {image}"
    script = (
        "test ! -e /build-extra && test ! -e /etc/pip.conf && test ! -e /usr/local/bin/build-pip"
        " && ! command -v gcc && ! command -v cc && ! command -v make"
        " && ! grep -rl 'PIP_INDEX_URL\\|BEGIN CERTIFICATE' /etc/pip* /root 2>/dev/null; echo clean"
    )
    out = docker("run", "--rm", "--entrypoint", "sh", image, "-c", script, check=False).stdout
    assert out.strip().endswith("clean"), out


def record(name: str, seconds: float) -> None:
    """Report a timing (printed; appended to $SPECDEC_DEPLOY_FACTS for deploy-test's table)."""
    print(f"{name}: {seconds:.1f} s")
    if os.environ.get("SPECDEC_DEPLOY_FACTS"):
        with open(os.environ["SPECDEC_DEPLOY_FACTS"], "a", encoding="utf-8") as handle:
            handle.write(json.dumps({name: round(seconds, 1)}) + "\n")


def _aliases(objects: list[dict], workload: dict) -> list[str]:
    """Cluster DNS names of the Services that select this workload's pods."""
    labels = workload["spec"]["template"]["metadata"]["labels"]
    names = [
        o["metadata"]["name"]
        for o in objects
        if o["kind"] == "Service" and o["spec"]["selector"].items() <= labels.items()
    ]
    return [alias for n in names for alias in (n, f"{n}.{NAMESPACE}", f"{n}.{NAMESPACE}.svc.cluster.local")]


@pytest.fixture(scope="module")
def cpu_dev_pods():
    objects = render("cpu-dev")
    runner = PodRunner(objects, image_map={"specdec-cpu:dev": CPU_IMAGE, "specdec-redis:dev": REDIS_IMAGE})
    workloads = {o["metadata"]["name"]: o for o in objects if o["kind"] in ("Deployment", "StatefulSet")}
    try:
        ids = {name: runner.run(w, _aliases(objects, w)) for name, w in workloads.items()}
        yield runner, workloads, ids
    finally:
        runner.close()


@pytest.mark.parametrize("name", ["redis", "draft", "target", "orchestrator", "gateway"])
def test_cpu_dev_workload_reaches_serving(cpu_dev_pods, name):
    runner, workloads, ids = cpu_dev_pods
    # All five start together on shared cores: the deadline bounds the wait, the time is reported.
    record(f"cpu-dev {name} ready", runner.wait_ready(ids[name], workloads[name], START_DEADLINE_S))
    assert runner.probe_passes(ids[name], workloads[name], "livenessProbe")  # the k8s liveness probe as rendered
    uid = docker("exec", ids[name], "id", "-u").stdout.strip()
    assert uid != "0"
    assert docker("exec", ids[name], "sh", "-c", "touch /probe", check=False).returncode != 0


def test_embedded_target_alone_serves_within_a_minute_read_only():
    """The image's defaults: embedded target, no writable model cache, SERVING within 60 s."""
    cid = docker(
        "run",
        "-d",
        "--read-only",
        "--tmpfs",
        "/tmp",
        "--user",
        "10001:10001",
        "--cap-drop",
        "ALL",
        "-e",
        "SPECDEC_OFFLINE=1",
        "-e",
        "SPECDEC_PORT=50052",
        "-e",
        "SPECDEC_THREADS=1",
        CPU_IMAGE,
        "target",
    ).stdout.strip()
    try:
        runner = PodRunner.__new__(PodRunner)  # only wait_ready's polling, no network
        workload = {"spec": {"template": {"spec": {"containers": [{"readinessProbe": {"grpc": {"port": 50052}}}]}}}}
        # Speed is reported, not asserted (deploy-test's table holds it against the 60 s goal).
        record("embedded target alone SERVING", PodRunner.wait_ready(runner, cid, workload, START_DEADLINE_S))
    finally:
        docker("rm", "-f", "-v", cid, check=False)
