"""Deployment files: kustomize overlays, docker compose, Dockerfiles, capacity note.

Everything is checked offline: the overlays are rendered by
deploy_tools/kustomize_render.py (and compared with `kubectl kustomize` where
that binary exists), every object is validated against the Kubernetes 1.30
OpenAPI schemas shipped with kubernetes-validate (strict: unknown fields fail),
and docker-compose.yml against the Compose specification schema vendored in
deploy_tools/compose-spec.json (from check-jsonschema's vendored schemas,
Apache-2.0, compose-spec/compose-spec).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from specdec.routing import DnsTarget, parse_addresses

REPO = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.30"
OVERLAYS = {"base": REPO / "k8s/base", "cpu-dev": REPO / "k8s/overlays/cpu-dev",
            "gpu": REPO / "k8s/overlays/gpu"}
SPECDEC_UID = 10001
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


kustomize = load_module("kustomize_render", "deploy_tools/kustomize_render.py")
capacity = load_module("capacity_sim", "deploy_tools/capacity_sim.py")
RENDERED = {name: kustomize.render(path) for name, path in OVERLAYS.items()}


def objects(overlay: str, kind: str) -> dict[str, dict]:
    """Rendered objects of one kind, by name."""
    return {o["metadata"]["name"]: o for o in RENDERED[overlay] if o["kind"] == kind}


def container(overlay: str, name: str) -> dict:
    """The main container of a Deployment (named like it)."""
    pod = objects(overlay, "Deployment")[name]["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == name)


def pod_templates(overlay: str) -> list[tuple[str, dict]]:
    """(name, pod template) of every workload."""
    return [(o["metadata"]["name"], o["spec"]["template"]) for o in RENDERED[overlay]
            if o["kind"] in ("Deployment", "StatefulSet")]


def config(overlay: str) -> dict[str, str]:
    """Data of the shared ConfigMap."""
    return objects(overlay, "ConfigMap")["specdec-config"]["data"]


# ---------------------------------------------------------------- rendering


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_passes_strict_schema(overlay):
    assert RENDERED[overlay]
    for obj in RENDERED[overlay]:
        assert obj["metadata"].get("namespace", "specdec") == "specdec"
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_strict_validation_really_rejects_unknown_fields():
    broken = copy.deepcopy(objects("base", "Deployment")["draft"])
    broken["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_renderer_agrees_with_kubectl_kustomize(overlay):
    out = subprocess.run(["kubectl", "kustomize", str(OVERLAYS[overlay])], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    key = lambda o: (o["kind"], o["metadata"]["name"])  # noqa: E731
    theirs = {key(o): o for o in yaml.safe_load_all(out) if o}
    assert {key(o): o for o in RENDERED[overlay]} == theirs


def test_renderer_json6902_delete_and_errors(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "kustomization.yaml").write_text("resources: [d.yaml]\n")
    (base / "d.yaml").write_text(yaml.safe_dump(objects("base", "Deployment")["draft"]))
    over = tmp_path / "over"
    over.mkdir()
    (over / "kustomization.yaml").write_text(yaml.safe_dump({"resources": ["../base"], "patches": [
        {"target": {"kind": "Deployment", "name": "draft"},
         "patch": "- {op: replace, path: /spec/replicas, value: 7}\n"
                  "- {op: add, path: /metadata/labels/extra, value: x}\n"},
        {"patch": "kind: Deployment\nmetadata: {name: draft}\nspec: {template: {spec: "
                  "{volumes: [{name: tmp, $patch: delete}]}}}\n"}]}))
    (draft,) = kustomize.render(over)
    assert draft["spec"]["replicas"] == 7 and draft["metadata"]["labels"]["extra"] == "x"
    assert [v["name"] for v in draft["spec"]["template"]["spec"]["volumes"]] == ["models"]
    (over / "kustomization.yaml").write_text("resources: [../base]\ncommonLabels: {a: b}\n")
    with pytest.raises(kustomize.KustomizeError):
        kustomize.render(over)
    (over / "kustomization.yaml").write_text(
        "resources: [../base]\npatches:\n- patch: 'kind: Service\n\n  metadata: {name: nope}'\n")
    with pytest.raises(kustomize.KustomizeError):
        kustomize.render(over)


# ---------------------------------------------------------------- workloads


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_separate_deployments_and_autoscalers(overlay):
    assert set(WORKLOADS) <= set(objects(overlay, "Deployment"))
    hpas = objects(overlay, "HorizontalPodAutoscaler")
    assert {h["spec"]["scaleTargetRef"]["name"] for h in hpas.values()} >= {"draft", "target"}
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
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["grpc"] == {"port": grpc_port, "service": ""}, (name, probe)
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
        if name in WORKLOADS:
            assert security["runAsUser"] == SPECDEC_UID
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
        assert address == DnsTarget(f"{name}-headless.specdec.svc.cluster.local",
                                    GRPC_PORTS[name])
    assert {p["port"] for p in services["orchestrator"]["spec"]["ports"]} == {50050, 8000}


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
    assert "--appendonly" in redis["spec"]["template"]["spec"]["containers"][0]["args"]
    assert objects(overlay, "Service")["redis"]["spec"]["ports"][0]["port"] == 6379
    secret = objects(overlay, "Secret")["specdec-secrets"]["stringData"]
    assert all("PLACEHOLDER" in value for value in secret.values())
    env = {e["name"]: e for e in container(overlay, "orchestrator")["env"]}
    assert "$(REDIS_PASSWORD)" in env["REDIS_URL"]["value"]
    assert env["SPECDEC_AUTH_TOKENS"]["valueFrom"]["secretKeyRef"]["name"] == "specdec-secrets"


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
    for name in WORKLOADS:
        assert objects("cpu-dev", "Deployment")[name]["spec"]["replicas"] == 1
    base = config("base")
    assert base["SPECDEC_DRAFT_MODEL"] == "modelscope:qwen/Qwen1.5-0.5B-Chat"
    assert base["SPECDEC_TARGET_MODEL"] == base["SPECDEC_TOKENIZER"] \
        == "modelscope:qwen/Qwen1.5-1.8B-Chat"


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
    return [rule for policy in objects(overlay, "NetworkPolicy").values()
            if selects(policy, labels) for rule in policy["spec"].get("ingress", [])]


def is_orchestrator_peer(peer: dict) -> bool:
    """A `from` peer that is exactly the orchestrator pods of this namespace."""
    return set(peer) == {"podSelector"} and \
        peer["podSelector"]["matchLabels"].get(COMPONENT) == "orchestrator"


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
    assert {p["port"] for r in public for p in r["ports"]} == {50050, 8000}
    for component in WORKLOADS:
        assert any({p["port"] for p in r["ports"]} == {METRICS_PORT}
                   for r in ingress_rules(overlay, component))


# ---------------------------------------------------------------- docker compose


class ComposeLoader(yaml.SafeLoader):
    """PyYAML loader that understands Compose's `!reset` tag."""


RESET = object()
ComposeLoader.add_constructor("!reset", lambda loader, node: RESET)
INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


def load_compose(name: str) -> dict:
    """A compose file as data."""
    with (REPO / name).open(encoding="utf-8") as handle:
        return yaml.load(handle, Loader=ComposeLoader)  # noqa: S506 - SafeLoader subclass


def interpolate(value, env: dict[str, str]):
    """Compose variable interpolation (${VAR}, ${VAR:-default}, $$) with `env`."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, str):
        text = INTERPOLATION.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), value)
        return text.replace("$$", "$")
    return value


def merge_compose(base, override):
    """Compose's merge of an override file (maps merge, `!reset` removes)."""
    if override is RESET:
        return RESET
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = merge_compose(base.get(key), value) if key in base else value
        return {k: v for k, v in merged.items() if v is not RESET}
    return override


def compose_validator() -> jsonschema.Draft202012Validator:
    """Validator for the vendored Compose specification schema."""
    schema = json.loads((REPO / "deploy_tools/compose-spec.json").read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema)


def test_compose_files_match_the_compose_spec():
    validator = compose_validator()
    base = load_compose("docker-compose.yml")
    validator.validate(base)
    merged = merge_compose(base, load_compose("docker-compose.cpu.yml"))
    validator.validate(merged)
    validator.validate(interpolate(merged, {}))
    broken = copy.deepcopy(base)
    broken["services"]["draft"]["helthcheck"] = {}
    assert list(validator.iter_errors(broken))


def test_compose_services_scale_and_wait_for_health():
    services = interpolate(load_compose("docker-compose.yml"), {})["services"]
    assert set(services) == {"redis", "draft", "target", "orchestrator"}
    for name, service in services.items():
        assert "container_name" not in service and service["healthcheck"]["test"]
    for name in ("draft", "target"):
        assert "ports" not in services[name]
    assert services["orchestrator"]["ports"] == ["50050:50050", "8000:8000"]
    deps = services["orchestrator"]["depends_on"]
    assert {n: d["condition"] for n, d in deps.items()} == dict.fromkeys(
        ("redis", "draft", "target"), "service_healthy")
    env = services["orchestrator"]["environment"]
    assert env["SPECDEC_DRAFT_ADDRESSES"] == "dns:///draft:50051"
    assert env["SPECDEC_TARGET_ADDRESSES"] == "dns:///target:50052"
    assert env["REDIS_URL"].startswith("redis://:") and "@redis:6379/0" in env["REDIS_URL"]
    assert services["draft"]["environment"]["SPECDEC_MODEL"] == \
        "modelscope:qwen/Qwen1.5-0.5B-Chat"
    assert services["target"]["environment"]["SPECDEC_MODEL"] == env["SPECDEC_TOKENIZER"] \
        == "modelscope:qwen/Qwen1.5-1.8B-Chat"
    for name in WORKLOADS:
        assert "models:/models" in services[name]["volumes"]
        assert services[name]["user"] == f"{SPECDEC_UID}:{SPECDEC_UID}"
    redis_command = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in redis_command and "--requirepass" in redis_command
    assert "redis-data:/data" in services["redis"]["volumes"]


def test_compose_gpu_reservation_and_cpu_override():
    base = load_compose("docker-compose.yml")
    devices = base["services"]["target"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    for name in ("redis", "draft", "orchestrator"):
        reservations = base["services"][name].get("deploy", {}).get("resources", {})
        assert "devices" not in reservations.get("reservations", {})
    merged = merge_compose(base, load_compose("docker-compose.cpu.yml"))
    target = merged["services"]["target"]
    assert "deploy" not in target
    assert target["environment"]["SPECDEC_DEVICE"] == "cpu"
    assert target["build"]["dockerfile"] == "docker/Dockerfile.cpu"
    assert target["environment"]["SPECDEC_PORT"] == "50052"  # kept from the base


# ---------------------------------------------------------------- images


def dockerfile(name: str) -> str:
    """Text of a Dockerfile under docker/."""
    return (REPO / "docker" / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name,base_image", [("Dockerfile.cpu", "python:3.11-slim"),
                                             ("Dockerfile.cuda", "nvidia/cuda:")])
def test_dockerfiles(name, base_image):
    text = dockerfile(name)
    assert base_image in text
    assert len(re.findall(r"^FROM ", text, re.M)) >= 2 and "COPY --from=builder" in text
    assert re.search(rf"^USER {SPECDEC_UID}", text, re.M)
    assert f'--uid "${{SPECDEC_UID}}"' in text and f"SPECDEC_UID={SPECDEC_UID}" in text
    assert re.search(r"^HEALTHCHECK .*\n\s+CMD python -m specdec\.healthcheck --port", text, re.M)
    assert 'ENTRYPOINT ["specdec", "serve"]' in text
    assert 'VOLUME ["/models"]' in text
    assert "download.pytorch.org/whl/" in text


def test_dockerignore_keeps_what_the_build_needs():
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", "tests", "k8s"} <= ignored
    for needed in ("specdec", "pyproject.toml", "README.md", "requirements.txt",
                   "constraints.txt"):
        assert needed not in ignored


# ---------------------------------------------------------------- capacity note


def test_capacity_note_quotes_the_simulation():
    result = subprocess.run([sys.executable, str(REPO / "deploy_tools/capacity_sim.py"),
                             "--check", str(REPO / "docs/capacity.md")],
                            capture_output=True, text=True, timeout=60)
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
    stats = common.ComputeStats(cached_tokens=2048, computed_tokens=6, rolled_back=1,
                                forward_ms=12.5, queue_ms=0.5)
    q_prime = [common.SparseDistribution(token_ids=[top_id] * model.top_n,
                                         probs=[0.5] * model.top_n)] * model.k
    session = "0" * model.session_id_chars
    for context in (model.k + 1, 512, 2048):
        header = dict(session_id=session, request_id=session, context_ids=[top_id] * context,
                      sampling=sampling)
        real = {
            "propose_request": draft.ProposeRequest(k=model.k, **header),
            "propose_response": draft.ProposeResponse(
                draft_ids=[top_id] * model.k, draft_probs=q_prime, stats=stats,
                draft_kind="model"),
            "verify_request": target.VerifyRequest(
                draft_ids=[top_id] * model.k, draft_probs=q_prime, **header),
            "verify_response": target.VerifyResponse(
                num_accepted=3, next_token=top_id, next_kind=1, target_ids=[top_id] * 6,
                matches=[True] * model.k, stats=stats),
        }
        sizes = {name: message.ByteSize() for name, message in real.items()}
        assert sizes == capacity.message_sizes(model, context)
