"""Run the whole system locally as separate processes: Redis, draft(s), target(s), orchestrator.

Used by `specdec up`, `make demo` and the integration tests, so all three run
the services exactly the same way: `python -m specdec.cli serve ROLE ...`,
each its own process, talking gRPC over loopback.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from specdec import children, forkserver
from specdec.config import ServerConfig, TLSConfig
from specdec.forkserver import inherit_niceness
from specdec.healthcheck import check
from specdec.models.cpu_info import usable_cores
from specdec.params import MODEL_DRAFT_KINDS
from specdec.redis_server import EmbeddedRedis, free_port

log = logging.getLogger("specdec.launcher")

READY_TIMEOUT_S = 300.0
POLL_S = 0.2
STOP_TIMEOUT_S = 10.0  # a model service's exit after SIGTERM, before SIGKILL
DRAIN_MARGIN_S = 5.0  # an orchestrator's exit after SIGTERM: its drain (SPECDEC_DRAIN_SECONDS) and this
DEFAULT_DRAIN_S: float = ServerConfig.model_fields["drain_seconds"].default


def default_threads(draft_kind: str) -> int:
    """torch threads per model service for a local stack on this machine: every FREE core for the
    target when the draft is the n-gram lookup (no draft model to feed), else half of them each
    (the draft and the target take turns within a round but overlap across sessions).

    Free: usable cores less the 1-minute load average already on them (rounded), at least 1. An
    OpenMP team larger than the free cores waits at every barrier for a preempted thread, so on a busy
    machine fewer threads run faster (docs/performance.md, the settings that change speed)."""
    cores = free_cores()
    return max(1, cores if draft_kind == "ngram" else cores // 2)


def free_cores() -> int:
    """Usable cores less the load already on them (1-minute load average, rounded), at least 1."""
    cores = usable_cores()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    free = max(1, cores - int(load + 0.5))
    if free < cores:
        log.info("load average %.1f on %d usable cores: sizing threads for %d free core(s)", load, cores, free)
    return free


@dataclass
class StackConfig:
    """What to start. Empty draft_model with draft_kind 'ngram' needs no draft weights."""

    target_model: str = "embedded"
    draft_model: str = ""
    draft_kind: str = "ngram"
    tokenizer: str = ""  # default: the target's spec
    draft_replicas: int = 1
    target_replicas: int = 1
    host: str = "127.0.0.1"
    redis_url: str = ""  # empty: start an embedded Redis
    threads: int = 1  # torch threads per model service
    cache_budget_bytes: int = 0  # 0: the services' default
    max_batch: int = 0  # target sessions per forward pass; 0: the service's default
    dtype: str = ""  # model services' weights dtype; "": the services' default (auto)
    engine: str = ""  # model services' runner (auto | torch | llamacpp); "": auto
    max_concurrent: int = 0  # 0: the orchestrator's default
    orchestrator_port: int = 0  # 0: a free port
    log_dir: str = ""  # "": a temporary folder, removed at stop() unless a service failed
    extra_env: dict[str, str] = field(default_factory=dict)
    orchestrator_args: list[str] = field(default_factory=list)
    metrics: bool = False  # export /metrics of every process on a free port each


@dataclass
class Proc:
    role: str
    port: int
    popen: subprocess.Popen | forkserver.ForkedProcess
    log_path: Path
    metrics_port: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


class LocalStack:
    """Starts, watches and stops the local processes."""

    def __init__(self, cfg: StackConfig) -> None:
        self.cfg = cfg
        self.redis: EmbeddedRedis | None = None
        self.procs: list[Proc] = []
        self.targets: list[Proc] = []
        self.drafts: list[Proc] = []
        self.orchestrators: list[Proc] = []
        self.redis_url = cfg.redis_url
        self.log_dir = self._new_log_dir()
        self.failed: list[str] = []  # services that did not start or did not run to their stop

    def _new_log_dir(self) -> Path:
        """specdec-PID-TIME under --log-dir, or a new temporary folder (unique: stacks of one process in the
        same second must not share it, since stop() removes it)."""
        name = f"specdec-{os.getpid()}-{int(time.time())}"
        if self.cfg.log_dir:
            return Path(self.cfg.log_dir) / name
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=os.environ.get("TMPDIR", "/tmp")))

    def _spawn(
        self, role: str, args: list[str], port: int | None = None, env_overrides: dict[str, str] | None = None
    ) -> Proc:
        port = port or free_port()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{role}-{port}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.cfg.extra_env, **(env_overrides or {})}
        metrics_port = free_port() if self.cfg.metrics else 0
        cmd = [
            sys.executable,
            "-m",
            "specdec.cli",
            "serve",
            role,
            "--host",
            self.cfg.host,
            "--port",
            str(port),
            "--metrics-port",
            str(metrics_port),
            *args,
        ]
        if forkserver.start_method() == forkserver.FORKSERVER and forkserver.forkable(env):
            popen: subprocess.Popen | forkserver.ForkedProcess = forkserver.spawn(cmd, env, log_path)
        else:
            with log_path.open("ab") as log:
                popen = children.popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            inherit_niceness(popen.pid)
        proc = Proc(role, port, popen, log_path, metrics_port)
        self.procs.append(proc)
        return proc

    def _model_args(self, model: str) -> list[str]:
        args = ["--model", model, "--threads", str(self.cfg.threads)]
        if self.cfg.dtype:
            args += ["--dtype", self.cfg.dtype]
        if self.cfg.engine:
            args += ["--engine", self.cfg.engine]
        if self.cfg.cache_budget_bytes:
            args += ["--cache-budget-bytes", str(self.cfg.cache_budget_bytes)]
        return args

    def start_target(
        self, port: int | None = None, env: dict[str, str] | None = None, max_batch: int | None = None
    ) -> Proc:
        """One more target process (max_batch: sessions per forward pass, default StackConfig.max_batch)."""
        args = self._model_args(self.cfg.target_model)
        max_batch = self.cfg.max_batch if max_batch is None else max_batch
        if max_batch:
            args += ["--max-batch", str(max_batch)]
        return self._spawn("target", args, port, env)

    def start_draft(self, port: int | None = None, env: dict[str, str] | None = None) -> Proc:
        args = ["--draft-kind", self.cfg.draft_kind]
        if self.cfg.draft_kind in MODEL_DRAFT_KINDS:
            args += self._model_args(self.cfg.draft_model)
        return self._spawn("draft", args, port, env)

    def start_orchestrator(
        self,
        targets: list[Proc] | None = None,
        drafts: list[Proc] | None = None,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        port: int | None = None,
    ) -> Proc:
        """One more orchestrator on the same Redis (default: over all targets and drafts started).

        Several orchestrators may serve the same sessions: they share state only through Redis.
        """
        targets = self.targets if targets is None else targets
        drafts = self.drafts if drafts is None else drafts
        cmd = [
            "--target",
            ",".join(p.address for p in targets),
            "--redis-url",
            self.redis_url,
            "--tokenizer",
            self.cfg.tokenizer or self.cfg.target_model,
            *self.cfg.orchestrator_args,
            *(args or []),
        ]
        if drafts:
            cmd += ["--draft", ",".join(p.address for p in drafts)]
        if self.cfg.max_concurrent and "--max-concurrent" not in cmd:
            cmd += ["--max-concurrent", str(self.cfg.max_concurrent)]
        proc = self._spawn("orchestrator", cmd, port, env)
        self.orchestrators.append(proc)
        return proc

    def restart(self, proc: Proc, env: dict[str, str] | None = None) -> Proc:
        """Start `proc`'s role again on the same port (after it was killed); does not wait for it."""
        if proc.popen.poll() is None:
            raise RuntimeError(f"{proc.role} on port {proc.port} is still running")
        self.procs.remove(proc)
        argv = list(cast("list[str]", proc.popen.args))  # _spawn starts every process from a list
        new = self._spawn(proc.role, argv[argv.index("--port") + 2 :], proc.port, env)
        for group in (self.targets, self.drafts, self.orchestrators):
            if proc in group:
                group[group.index(proc)] = new
        return new

    def start(self) -> LocalStack:
        """Start everything and wait until every service reports SERVING."""
        self.redis_url = self.cfg.redis_url
        if not self.redis_url:
            self.redis = EmbeddedRedis().start()
            self.redis_url = self.redis.url
        self.targets = [self.start_target() for _ in range(self.cfg.target_replicas)]
        self.drafts = [self.start_draft() for _ in range(self.cfg.draft_replicas)]
        self.orchestrator = self.start_orchestrator(port=self.cfg.orchestrator_port or None)
        for proc in self.procs:
            self.wait_ready(proc)
        self.wait_connected(self.orchestrator, self.targets + self.drafts)
        return self

    def wait_connected(self, orchestrator: Proc, replicas: list[Proc], timeout: float = READY_TIMEOUT_S) -> None:
        """Wait until the orchestrator's Status lists every replica as healthy.

        A replica that was still loading when the orchestrator last asked it for Info is
        only picked up at the orchestrator's next pool refresh; until then its sessions
        would all go to the replicas it already knows.
        """
        import grpc

        from specdec.healthcheck import channel_for
        from specdec.v1 import orchestrator_pb2, orchestrator_pb2_grpc

        want = {p.address for p in replicas}
        token = next(
            (t for t in {**os.environ, **self.cfg.extra_env}.get("SPECDEC_AUTH_TOKENS", "").split(",") if t), ""
        )
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        deadline, seen = time.monotonic() + timeout, set()
        with channel_for(orchestrator.address, self.tls()) as channel:
            stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
            while time.monotonic() < deadline:
                try:
                    status = stub.Status(orchestrator_pb2.StatusRequest(), timeout=5.0, metadata=metadata)
                    seen = {r.address for r in status.replicas if r.healthy}
                except grpc.RpcError as exc:
                    seen = {f"({exc.code().name})"}
                if want <= seen:
                    return
                time.sleep(POLL_S)
        raise TimeoutError(f"the orchestrator sees {sorted(seen)} healthy, not all of {sorted(want)}")

    def wait_ready(self, proc: Proc, timeout: float = READY_TIMEOUT_S) -> None:
        """Poll the health service until SERVING; fail with the log tail if the process died."""
        deadline = time.monotonic() + timeout
        status = ""
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                self.failed.append(proc.role)
                raise RuntimeError(
                    f"{proc.role} on port {proc.port} exited ({proc.popen.returncode}):\n{self.tail(proc)}"
                )
            ok, status = check(proc.address, timeout=1.0, tls=self.tls())
            if ok:
                return
            time.sleep(POLL_S)
        self.failed.append(proc.role)
        raise TimeoutError(
            f"{proc.role} on port {proc.port} not SERVING after {timeout:.0f}s ({status}):\n{self.tail(proc)}"
        )

    def tls(self) -> TLSConfig:
        """The TLS settings the services were started with (extra_env over the environment)."""
        env = {**os.environ, **self.cfg.extra_env}
        return TLSConfig(
            cert=env.get("SPECDEC_TLS_CERT", ""), key=env.get("SPECDEC_TLS_KEY", ""), ca=env.get("SPECDEC_TLS_CA", "")
        )

    @staticmethod
    def tail(proc: Proc, lines: int = 30) -> str:
        try:
            return "\n".join(proc.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    @property
    def orchestrator_address(self) -> str:
        return self.orchestrator.address

    def stop(self) -> None:
        """Stop in dependency order, each step bounded: the orchestrators first (they drain: streams in flight
        finish), then the model services, then Redis; SIGKILL for what outlives its bound. Removes the temporary
        log folder unless a service failed (then says where the logs are)."""
        self.failed += [p.role for p in self.procs if p.popen.poll() not in (None, 0)]  # ended on their own
        first = [p for p in self.procs if p.role == "orchestrator"]
        _stop_all(first, self.drain_seconds() + DRAIN_MARGIN_S)
        _stop_all([p for p in self.procs if p not in first], STOP_TIMEOUT_S)
        if self.redis is not None:
            self.redis.close()
        self.failed += [p.role for p in self.procs if p.popen.returncode not in (0, -signal.SIGTERM)]
        self._remove_logs()

    def drain_seconds(self) -> float:
        """How long an orchestrator of this stack drains at SIGTERM (SPECDEC_DRAIN_SECONDS)."""
        value = {**os.environ, **self.cfg.extra_env}.get("SPECDEC_DRAIN_SECONDS", "")
        return float(value) if value else DEFAULT_DRAIN_S

    def _remove_logs(self) -> None:
        if self.failed:
            log.warning("%s failed: logs kept in %s", ", ".join(sorted(set(self.failed))), self.log_dir)
        elif not self.cfg.log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stop_all(procs: list[Proc], timeout: float) -> None:
    """SIGTERM each process, wait for all of them up to `timeout` in all, SIGKILL those still running."""
    for proc in procs:
        if proc.popen.poll() is None:
            proc.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s on port %d still running %.0f s after SIGTERM: killing it", proc.role, proc.port, timeout)
            proc.popen.kill()
            proc.popen.wait()
