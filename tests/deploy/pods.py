"""Run rendered Kubernetes pod templates as docker containers, as a kubelet would.

`PodRunner` turns the first container of a rendered Deployment / StatefulSet into
`docker run`: the image, args, env (values, configMapKeyRef, envFrom configMapRef,
secretKeyRef, resourceFieldRef limits.cpu), secret volumes (files), emptyDir volumes
(tmpfs), runAsUser/runAsGroup, readOnlyRootFilesystem, dropped capabilities, and the
cluster DNS names of the Services (network aliases on one docker network). The probe
is the container's readiness probe (grpc -> specdec.healthcheck, httpGet, exec).
"""

from __future__ import annotations

import math
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

NAMESPACE = "specdec"
DOCKER_TIMEOUT_S = 60
POLL_S = 1.0


def docker(*args: str, check: bool = True, timeout: float = DOCKER_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run the docker CLI with a deadline."""
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=timeout)


def cpu_quantity(value: str) -> int:
    """Kubernetes CPU quantity -> whole cores, rounded up (resourceFieldRef divisor 1)."""
    return math.ceil(int(value[:-1]) / 1000) if value.endswith("m") else math.ceil(float(value))


@dataclass
class PodRunner:
    """Pods of one rendered overlay on one docker network."""

    objects: list[dict]
    image_map: dict[str, str] = field(default_factory=dict)
    network: str = field(default_factory=lambda: f"specdec-pods-{uuid.uuid4().hex[:8]}")
    started: list[str] = field(default_factory=list)
    secret_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="specdec-secrets-")))

    def __post_init__(self) -> None:
        docker("network", "create", self.network)

    def _kind(self, kind: str) -> dict[str, dict]:
        return {o["metadata"]["name"]: o for o in self.objects if o["kind"] == kind}

    def config_map(self, name: str) -> dict[str, str]:
        return self._kind("ConfigMap")[name]["data"]

    def secret(self, name: str) -> dict[str, str]:
        return self._kind("Secret")[name]["stringData"]

    def env_of(self, c: dict) -> dict[str, str]:
        """The container's environment as the kubelet builds it ($(VAR) expanded)."""
        env: dict[str, str] = {}
        for source in c.get("envFrom", []):
            env.update(self.config_map(source["configMapRef"]["name"]))
        for e in c.get("env", []):
            ref = e.get("valueFrom", {})
            if "value" in e:
                value = e["value"]
                for key, known in env.items():
                    value = value.replace(f"$({key})", known)
            elif "configMapKeyRef" in ref:
                value = self.config_map(ref["configMapKeyRef"]["name"])[ref["configMapKeyRef"]["key"]]
            elif "secretKeyRef" in ref:
                value = self.secret(ref["secretKeyRef"]["name"])[ref["secretKeyRef"]["key"]]
            else:
                value = str(cpu_quantity(c["resources"]["limits"]["cpu"]))
            env[e["name"]] = value
        return env

    def _volume_args(self, pod: dict, c: dict) -> list[str]:
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        args: list[str] = []
        for mount in c.get("volumeMounts", []):
            volume = volumes.get(mount["name"])
            if volume is None or "emptyDir" in volume or "persistentVolumeClaim" in volume:
                args += ["--tmpfs", f"{mount['mountPath']}:uid={pod['securityContext']['runAsUser']},mode=0750"]
            elif "secret" in volume:
                args += ["-v", f"{self._secret_files(volume['secret'])}:{mount['mountPath']}:ro"]
        return args

    def _secret_files(self, spec: dict) -> Path:
        data = self.secret(spec["secretName"])
        folder = self.secret_dir / uuid.uuid4().hex[:8]
        folder.mkdir(mode=0o755)
        items = spec.get("items") or [{"key": k, "path": k} for k in data]
        for item in items:
            path = folder / item["path"]
            path.write_text(data[item["key"]], encoding="utf-8")
            path.chmod(0o444)  # docker has no fsGroup: world-readable stands in for group 10001
        return folder

    def run(self, workload: dict, aliases: list[str]) -> str:
        """Start the workload's first container; its docker container id."""
        pod = workload["spec"]["template"]["spec"]
        c = pod["containers"][0]
        sc, psc = c["securityContext"], pod["securityContext"]
        args = [
            "run",
            "-d",
            "--network",
            self.network,
            "--user",
            f"{psc['runAsUser']}:{psc['runAsGroup']}",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
        ]
        if sc.get("readOnlyRootFilesystem"):
            args.append("--read-only")
        for alias in aliases:
            args += ["--network-alias", alias]
        for key, value in self.env_of(c).items():
            args += ["-e", f"{key}={value}"]
        args += self._volume_args(pod, c)
        if c.get("command"):
            args += ["--entrypoint", c["command"][0]]
        image = self.image_map.get(c["image"], c["image"])
        argv = [*c.get("command", [])[1:], *c.get("args", [])]
        cid = docker(*args, image, *argv).stdout.strip()
        self.started.append(cid)
        return cid

    def probe_command(self, c: dict, kind: str = "readinessProbe") -> list[str]:
        """A probe of the container (`kind`: readinessProbe / livenessProbe) as a command run inside it."""
        probe = c[kind]
        if "grpc" in probe:
            service = probe["grpc"].get("service", "")
            return ["python", "-m", "specdec.healthcheck", "--port", str(probe["grpc"]["port"])] + (
                ["--service", service] if service else []
            )
        if "httpGet" in probe:
            return [
                "python",
                "-m",
                "specdec.healthcheck",
                "--http",
                "--port",
                str(port_number(c, probe["httpGet"]["port"])),
            ]
        return probe["exec"]["command"]

    def probe_passes(self, cid: str, workload: dict, kind: str) -> bool:
        """Whether the container's `kind` probe passes now: a TCP probe connects from here to the
        container's address (as the kubelet does from the node), the others run inside it."""
        c = workload["spec"]["template"]["spec"]["containers"][0]
        if "tcpSocket" in c[kind]:
            ip = docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", cid).stdout.strip()
            try:
                socket.create_connection((ip, port_number(c, c[kind]["tcpSocket"]["port"])), timeout=5).close()
            except OSError:
                return False
            return True
        return docker("exec", cid, *self.probe_command(c, kind), check=False).returncode == 0

    def wait_ready(self, cid: str, workload: dict, deadline_s: float) -> float:
        """Seconds until the readiness probe passes inside the container (bounded)."""
        command = self.probe_command(workload["spec"]["template"]["spec"]["containers"][0])
        started = time.monotonic()
        while time.monotonic() - started < deadline_s:
            if docker("exec", cid, *command, check=False).returncode == 0:
                return time.monotonic() - started
            if docker("inspect", "-f", "{{.State.Running}}", cid).stdout.strip() != "true":
                raise AssertionError(f"container exited:\n{docker('logs', '--tail', '40', cid).stderr}")
            time.sleep(POLL_S)
        raise AssertionError(
            f"not ready in {deadline_s:.0f} s:\n{docker('logs', '--tail', '40', cid, check=False).stderr}"
        )

    def close(self) -> None:
        """Remove every started container and the network (never raises)."""
        for cid in self.started:
            docker("rm", "-f", "-v", cid, check=False)
        docker("network", "rm", self.network, check=False)


def port_number(container: dict, port: int | str) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, str):
        return next(p["containerPort"] for p in container["ports"] if p["name"] == port)
    return port
