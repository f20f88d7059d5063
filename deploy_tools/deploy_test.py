"""`make deploy-test`: build the images, run the compose stack for real, check it, print a table.

Steps (each bounded; the stack is torn down, volumes included, also when a step fails):
  1. build specdec-redis and specdec-cpu from a local Debian base (scripts/build_images.sh);
  2. image tests (tests/deploy: no build inputs in the runtime image; the CPU image started
     with each k8s cpu-dev Deployment's rendered environment reaches SERVING);
  3. compose (docker-compose.yml + docker-compose.cpu.yml), 2 drafts + 2 targets, offline;
  4. greedy through gRPC == k = 0, the HTTP gateway gives the same text, both replicas of each
     pool served rounds, a target killed mid-stream leaves the stream's tokens identical and
     its replacement serves again, every container is non-root on a read-only root;
  5. tok/s of the same prompt through compose, then through `specdec up` (same replicas, threads).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from deploy_tools import checks
from deploy_tools.stack import REPO, ComposeStack, StackError, hardening, image_size_mb, run

HEALTHY_DEADLINE_S = 900.0
REPLACEMENT_GOAL_S = 60.0
REPLACEMENT_DEADLINE_S = 600.0
SPEED_GOAL = 0.9
MODEL_SERVICES = ("draft", "target")


def build(tag: str, skip: bool) -> dict[str, int]:
    """Build the images; {image: seconds} (empty when skipped)."""
    if skip:
        return {}
    timings = Path(tempfile.mkstemp(suffix=".json")[1])
    proc = subprocess.run(
        ["scripts/build_images.sh"],
        cwd=REPO,
        env={**os.environ, "TAG": tag, "TIMINGS": str(timings)},
        timeout=3600,
        check=False,
    )
    if proc.returncode != 0:
        raise StackError("image build failed (see above)")
    return json.loads(timings.read_text())


def image_tests(tag: str) -> dict[str, float]:
    """tests/deploy against the built images (they skip without SPECDEC_DEPLOY_TEST=1); their timings."""
    facts = Path(tempfile.mkstemp(suffix=".jsonl")[1])
    env = {
        **os.environ,
        "SPECDEC_DEPLOY_TEST": "1",
        "SPECDEC_DEPLOY_TAG": tag,
        "PYTHONPATH": str(REPO),
        "SPECDEC_DEPLOY_FACTS": str(facts),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-rs", "-p", "no:cacheprovider", "tests/deploy"],
        cwd=REPO,
        env=env,
        timeout=1800,
        check=False,
    )
    if proc.returncode != 0:
        raise StackError("tests/deploy failed (see above)")
    timings: dict[str, float] = {}
    for line in facts.read_text().splitlines():
        timings.update(json.loads(line))
    return timings


def kill_and_replace(stack: ComposeStack, client: checks.Orchestrator, reference: list[int]) -> dict:
    """Kill the target serving a stream; compose brings the scale back (like a ReplicaSet)."""
    marks: dict[str, Any] = {}

    def kill(address: str) -> None:
        container = stack.container_of_address(address)
        run(["docker", "kill", container["Id"]], 30)
        marks["t0"], marks["id"] = time.monotonic(), container["Id"]
        marks["thread"] = threading.Thread(target=stack.replace, daemon=True)
        marks["thread"].start()

    result = checks.kill_mid_stream(client, reference, kill)
    if not result["killed"]:
        raise StackError("the stream finished before a target could be killed")
    marks["thread"].join(timeout=REPLACEMENT_DEADLINE_S)
    stack.wait_healthy(REPLACEMENT_DEADLINE_S, "target", stack.targets)
    targets = stack.containers("target")
    # compose restarts the killed container (same id) or, if it was removed, creates one.
    new = next((c for c in targets if c["Id"] == marks["id"]), None) or max(
        targets, key=lambda c: c["State"]["StartedAt"]
    )
    ip = next(iter(new["NetworkSettings"]["Networks"].values()))["IPAddress"]
    healthy_s = time.monotonic() - marks["t0"]
    checks.wait_serving_on(client, f"{ip}:50052", REPLACEMENT_DEADLINE_S)
    result.update(replacement_healthy_s=healthy_s, replacement_serving_s=time.monotonic() - marks["t0"])
    return result


def compose_run(stack: ComposeStack, facts: dict) -> None:
    """Step 3 and 4 on a started stack (fills `facts`)."""
    facts["time_to_healthy_s"] = stack.up(HEALTHY_DEADLINE_S)
    client = checks.Orchestrator(f"127.0.0.1:{stack.grpc_port}", stack.client_token)
    greedy = checks.greedy_identity(client)
    facts["greedy_equals_k0"] = greedy["ok"]
    facts["mal"] = greedy["mal"]
    facts["http_equals_grpc"] = checks.http_completion(stack.http_port, stack.client_token) == greedy["text"]
    targets, drafts = checks.replica_spread(client, "deploy-spread")
    facts["target_replicas_used"], facts["draft_replicas_used"] = len(targets), len(drafts)
    facts["replica_calls"] = {
        f"{role} {address}": checks.service_stats(address, role, stack.service_token).calls
        for role, addresses in (("target", targets), ("draft", drafts))
        for address in sorted(addresses)
    }
    facts["hardening"] = {c["Name"].lstrip("/"): hardening(c) for c in stack.containers()}
    facts["compose_run"], facts["local_run"] = speed_vs_specdec_up(client, stack.threads)
    facts["compose_tok_s"], facts["local_tok_s"] = facts["compose_run"]["tok_s"], facts["local_run"]["tok_s"]
    facts["speed_ratio"] = facts["compose_tok_s"] / facts["local_tok_s"]
    facts["kill"] = kill_and_replace(stack, client, greedy["ids"])


def speed_vs_specdec_up(client: checks.Orchestrator, threads: int) -> tuple[dict, dict]:
    """The same prompt through compose and through `specdec up` (local processes, same replicas,
    threads and draft), interleaved while both run, so both see the same load on shared cores."""
    from specdec.config import DEFAULT_MODELS  # noqa: PLC0415
    from specdec.launcher import LocalStack, StackConfig  # noqa: PLC0415 (loads torch)

    cfg = StackConfig(
        target_model="embedded",
        draft_model=DEFAULT_MODELS["draft"],
        draft_kind="combined",
        draft_replicas=2,
        target_replicas=2,
        threads=threads,
    )
    with LocalStack(cfg) as local:
        return checks.side_by_side(client, checks.Orchestrator(local.orchestrator_address, ""))


def failures(facts: dict) -> list[str]:
    """The checks (not the speed goals: speed is reported, never asserted) that failed."""
    kill = facts.get("kill", {})
    problems = [
        name
        for name, ok in (
            ("greedy through the stack != k = 0", facts.get("greedy_equals_k0")),
            ("HTTP gateway text != gRPC text", facts.get("http_equals_grpc")),
            ("a target replica served no session", facts.get("target_replicas_used", 0) >= 2),
            ("a draft replica served no session", facts.get("draft_replicas_used", 0) >= 2),
            ("a replica answered no Propose/Verify", min(facts.get("replica_calls", {}).values(), default=0) > 0),
            ("tokens changed when a target was killed mid-stream", kill.get("identical")),
        )
        if not ok
    ]
    for name, h in facts.get("hardening", {}).items():
        if h["uid"] == 0 or not h["read_only"] or h["root_writable"]:
            problems.append(f"{name}: uid {h['uid']}, read-only root {h['read_only']}, / writable {h['root_writable']}")
    return problems


def costs(run_: dict | None) -> str:
    """Per-round medians of a speed run (median of 3 interleaved runs, 128 tokens, from the host)."""
    if not run_:
        return ""
    return (
        f"median round: draft {run_['draft_ms']:.0f} ms, target {run_['target_ms']:.0f} ms, "
        f"overhead {run_['overhead_ms']:.1f} ms; rounds {run_['rounds_s']:.1f} s of {run_['wall_s']:.1f} s; "
        f"MAL {run_['mal']:.2f}"
    )


def table(facts: dict) -> str:
    """The closing table of the run."""
    kill, rows = facts.get("kill", {}), []
    for image, size in facts.get("sizes_mb", {}).items():
        built = facts.get("build_s", {}).get(image)
        rows.append((f"image {image}", f"{size:.0f} MB", f"built in {built} s" if built is not None else "not rebuilt"))
    rows += [
        (
            "time to healthy (2 drafts, 2 targets)",
            f"{facts.get('time_to_healthy_s', float('nan')):.1f} s",
            "compose up -> all healthy",
        ),
        (
            "greedy == k = 0 / HTTP == gRPC",
            f"{facts.get('greedy_equals_k0')} / {facts.get('http_equals_grpc')}",
            f"mean accepted length {facts.get('mal', 0):.2f}",
        ),
        (
            "replicas used (target, draft)",
            f"{facts.get('target_replicas_used')}, {facts.get('draft_replicas_used')}",
            "trace",
        ),
        (
            "Propose/Verify calls per replica",
            "min {}".format(min(facts.get("replica_calls", {}).values(), default=0)),
            "ServiceStats.calls of each replica used, with the service token",
        ),
        ("target killed mid-stream", f"identical={kill.get('identical')}", f"at token {kill.get('killed_at_token')}"),
        (
            "replacement healthy / serving",
            f"{kill.get('replacement_healthy_s', float('nan')):.1f} s / "
            f"{kill.get('replacement_serving_s', float('nan')):.1f} s",
            f"goal <= {REPLACEMENT_GOAL_S:.0f} s",
        ),
        ("tok/s compose", f"{facts.get('compose_tok_s', float('nan')):.2f}", costs(facts.get("compose_run"))),
        ("tok/s specdec up", f"{facts.get('local_tok_s', float('nan')):.2f}", costs(facts.get("local_run"))),
        ("compose / specdec up", f"{facts.get('speed_ratio', float('nan')):.2f}x", f"goal >= {SPEED_GOAL}x"),
    ]
    for name, seconds in facts.get("image_tests", {}).items():
        rows.append((name, f"{seconds:.1f} s", "docker run of the image, readiness probe"))
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{a:<{width}}  {b:>18}  {c}" for a, b, c in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", default="dev", help="image tag to build and run (default dev)")
    parser.add_argument("--skip-build", action="store_true", help="use the images already built")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per model service")
    parser.add_argument("--out", default="", help="also write the facts as JSON here")
    args = parser.parse_args(argv)
    cpu, redis = f"specdec-cpu:{args.tag}", f"specdec-redis:{args.tag}"
    facts: dict = {"uptime_before": os.getloadavg()}
    stack = ComposeStack(cpu, redis, threads=args.threads)
    try:
        facts["build_s"] = build(args.tag, args.skip_build)
        facts["sizes_mb"] = {image: image_size_mb(image) for image in (cpu, redis)}
        facts["image_tests"] = image_tests(args.tag)
        try:
            compose_run(stack, facts)
        except Exception:
            print(stack.logs(), file=sys.stderr)
            raise
        finally:
            stack.down()
    except (StackError, TimeoutError, subprocess.TimeoutExpired) as exc:
        print(f"deploy-test: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        facts["uptime_after"] = os.getloadavg()
        if args.out:
            Path(args.out).write_text(json.dumps(facts, indent=1, default=str))
    print(table(facts))
    print(f"load average before {facts['uptime_before']}, after {facts['uptime_after']}")
    problems = failures(facts)
    for problem in problems:
        print(f"deploy-test: FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
