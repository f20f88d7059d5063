"""One container definition: what the k8s `cpu-dev` Deployments run is what compose runs.

docker-compose.yml + docker-compose.cpu.yml (resolved by Docker Compose v2) and
k8s/overlays/cpu-dev (rendered by `kubectl kustomize`) must name, for every service,
the same image, command, environment, ports and probe. Allowed differences, and only these:
service addresses are cluster DNS names in k8s (`draft-headless.specdec.svc.cluster.local`)
and compose service names (`draft`); secrets are files in k8s (NAME_FILE) and variables in
compose (NAME); k8s containers also see the shared ConfigMap (envFrom), whose keys must
agree with compose or be the image's own defaults. tests/deploy/test_images.py then starts
the image with each Deployment's rendered environment and sees SERVING.
"""

from __future__ import annotations

import re

import pytest

from tests.deploy.pods import PodRunner
from tests.deploy_support import REPO, compose_config, render

SERVICES = ("draft", "target", "orchestrator", "gateway")
CLUSTER_HOST = re.compile(r"([a-z0-9-]+?)(?:-headless)?\.specdec(?:\.svc\.cluster\.local)?\b")
SECRET_KEYS = {"SPECDEC_SERVICE_TOKEN", "SPECDEC_AUTH_TOKENS", "REDIS_PASSWORD"}
ROLE_KEY = re.compile(r"SPECDEC_(DRAFT|TARGET)_(MODEL|DEVICE|DTYPE|ENGINE|CACHE_BUDGET_BYTES)$")


def normalise(value: str) -> str:
    """Cluster DNS names -> compose service names (draft-headless.specdec.svc.cluster.local -> draft)."""
    return CLUSTER_HOST.sub(lambda m: m.group(1), value)


def image_env() -> dict[str, str]:
    """ENV of the CPU image's runtime stage (its defaults, which k8s may restate)."""
    runtime = (REPO / "docker/Dockerfile.cpu").read_text(encoding="utf-8").split("AS runtime", 1)[1]
    return dict(re.findall(r"^\s*(?:ENV\s+)?([A-Z_]+)=(\S+?)\s*\\?$", runtime, re.M))


@pytest.fixture(scope="module")
def defs():
    objects = render("cpu-dev")
    runner = PodRunner.__new__(PodRunner)  # its env resolution only (no docker)
    runner.objects = objects
    deployments = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Deployment"}
    config = next(o for o in objects if o["kind"] == "ConfigMap")["data"]
    return deployments, runner, config, compose_config()["services"]


def k8s_container(deployments: dict, name: str) -> dict:
    return deployments[name]["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("name", SERVICES)
def test_same_image_and_command(defs, name):
    deployments, _, _, compose = defs
    c = k8s_container(deployments, name)
    assert c["image"] == compose[name]["image"]
    assert "command" not in c and c["args"] == compose[name]["command"]  # the image's ENTRYPOINT in both


@pytest.mark.parametrize("name", SERVICES)
def test_same_environment(defs, name):
    deployments, runner, config, compose = defs
    k8s = runner.env_of(k8s_container(deployments, name))
    theirs = compose[name]["environment"]
    for key, value in theirs.items():
        if key in SECRET_KEYS:
            assert f"{key}_FILE" in k8s, f"{name}: secret {key} is not a file in k8s"
        else:
            assert normalise(k8s.get(key, "<unset>")) == value, f"{name}: {key}"
    defaults = image_env()
    for key, value in k8s.items():
        if key in theirs or key.removesuffix("_FILE") in SECRET_KEYS:
            continue
        assert key in config or key == "SPECDEC_THREADS", f"{name}: {key} only in k8s"
        if key in defaults:
            assert value == defaults[key], f"{name}: {key} differs from the image's default"
        elif role := ROLE_KEY.match(key):
            service, field = role.group(1).lower(), f"SPECDEC_{role.group(2)}"
            assert compose[service]["environment"][field] == value, f"ConfigMap {key} vs compose {service}"
        else:
            users = [s for s in compose.values() if key in s["environment"]]
            assert users, f"{name}: ConfigMap key {key} is set in no compose service"
            assert all(normalise(value) == s["environment"][key] for s in users), key


@pytest.mark.parametrize("name", SERVICES)
def test_same_ports_and_probe(defs, name):
    deployments, runner, _, compose = defs
    c = k8s_container(deployments, name)
    env = compose[name]["environment"]
    k8s_ports = {p["containerPort"] for p in c["ports"]}
    compose_ports = {int(p) for p in compose[name].get("expose", [])} | {
        int(p["target"]) for p in compose[name].get("ports", [])
    }
    assert k8s_ports == compose_ports
    test = compose[name]["healthcheck"]["test"]
    assert test[:4] == ["CMD", "python", "-m", "specdec.healthcheck"]
    # The probe each side runs, as a command with its port (compose: from the environment).
    k8s_probe = runner.probe_command(c)
    port = env["SPECDEC_HTTP_PORT"] if "--http" in test else env["SPECDEC_PORT"]
    assert k8s_probe == [*test[1:], "--port", port]
    assert int(port) in k8s_ports
    if "--http" not in test:
        assert c["readinessProbe"]["grpc"]["port"] == int(port)


def test_normalise_maps_cluster_names_to_compose_names():
    assert normalise("dns:///draft-headless.specdec.svc.cluster.local:50051") == "dns:///draft:50051"
    assert normalise("redis://redis.specdec.svc.cluster.local:6379/0") == "redis://redis:6379/0"
    assert normalise("orchestrator.specdec.svc.cluster.local:50050") == "orchestrator:50050"
