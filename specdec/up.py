"""`specdec up`: the whole system locally (specdec.launcher.LocalStack, plus the HTTP gateway) until Ctrl-C.

It listens where `specdec generate` looks by default (127.0.0.1:50050) when that port is free. Its services run
in sessions of their own, so a terminal's Ctrl-C (SIGINT), SIGTERM or SIGHUP reaches `specdec up` alone, which
stops them in order: the gateway and the orchestrator first (streams in flight finish), then the model services,
then Redis. However `specdec up` itself ends, even by SIGKILL, its services get SIGTERM (specdec.children).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import TYPE_CHECKING

from specdec.config import DEFAULT_MODELS, DEFAULT_ORCHESTRATOR_PORT
from specdec.params import MODEL_DRAFT_KINDS

if TYPE_CHECKING:
    from http_gateway.process import GatewayProcess
    from specdec.launcher import LocalStack

SHIPPED_EMBEDDED_DRAFT = DEFAULT_MODELS["draft"]
DEFAULT_GENERATE_ADDRESS = f"127.0.0.1:{DEFAULT_ORCHESTRATOR_PORT}"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
SLEEP_S = 3600.0
EXIT_USAGE = 2


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="start Redis, draft, target and orchestrator locally; Ctrl-C stops all")
    p.add_argument("--target-model", default="embedded")
    p.add_argument(
        "--draft-model",
        default="",
        help=f"model spec of the draft (model/combined kinds; default with the embedded target: "
        f"{SHIPPED_EMBEDDED_DRAFT})",
    )
    p.add_argument("--draft-kind", choices=["model", "ngram", "combined"], default="ngram")
    p.add_argument("--draft-replicas", type=int, default=1)
    p.add_argument("--target-replicas", type=int, default=1)
    p.add_argument("--redis-url", default="")
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads per model service (0: every core for the target with the n-gram draft, "
        "half of them each with a model draft)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"orchestrator gRPC port (default: {DEFAULT_ORCHESTRATOR_PORT}, where `specdec generate` "
        f"looks by default, or a free one when that is taken; 0: a free one)",
    )
    p.add_argument("--http-port", type=int, default=0, help="port of the OpenAI-compatible HTTP API (0: a free one)")
    p.add_argument("--no-http", action="store_true", help="do not start the HTTP gateway")
    p.add_argument(
        "--log-dir",
        default="",
        help="keep the services' logs under this folder (default: a temporary folder, removed at exit unless a "
        "service failed)",
    )
    p.add_argument(
        "--dtype",
        default="",
        help="weights of the model services: auto (default), float32, bfloat16, int8, int4 (int4/int8: "
        "quantized on CPU; a trained draft that shares the target's tensors cannot take int4)",
    )
    p.add_argument(
        "--engine",
        default="",
        choices=["", "auto", "torch", "llamacpp"],
        help="model runner of the services: auto (default: llama.cpp for a GGUF on CPU), torch, llamacpp",
    )


def orchestrator_port(requested: int | None, default: int = DEFAULT_ORCHESTRATOR_PORT) -> int:
    """The port `specdec up` gives the orchestrator: --port as given; unset, `default` (where `specdec generate`
    looks) when it is free, else a free one (said on stderr); 0: a free one."""
    from specdec.redis_server import can_listen, free_port

    if requested:
        return requested
    if requested is None:
        if can_listen(default):
            return default
        print(
            f"specdec up: port {default} is taken (another stack?): the orchestrator listens on a free port; "
            f"pass the --address printed below to specdec generate",
            file=sys.stderr,
        )
    return free_port()


def cmd_up(args: argparse.Namespace) -> int:
    """Run the local stack until Ctrl-C."""
    from specdec.launcher import LocalStack, StackConfig, default_threads

    draft_model = args.draft_model
    if args.draft_kind in MODEL_DRAFT_KINDS and not draft_model:
        if args.target_model != "embedded":
            print(f"specdec up: --draft-kind {args.draft_kind} needs --draft-model SPEC", file=sys.stderr)
            return EXIT_USAGE
        draft_model = SHIPPED_EMBEDDED_DRAFT  # the trained draft shipped for the embedded target
    cfg = StackConfig(
        target_model=args.target_model,
        draft_model=draft_model,
        draft_kind=args.draft_kind,
        draft_replicas=args.draft_replicas,
        target_replicas=args.target_replicas,
        redis_url=args.redis_url,
        threads=args.threads or default_threads(args.draft_kind),
        orchestrator_port=orchestrator_port(args.port),
        dtype=args.dtype,
        engine=args.engine,
        log_dir=args.log_dir,
    )
    stack = LocalStack(cfg)
    gateway = None
    for sig in STOP_SIGNALS:  # until ready: interrupt the start, then stop what started
        signal.signal(sig, signal.default_int_handler)
    try:
        print("starting Redis, draft, target and orchestrator...", flush=True)
        stack.start()
        gateway = None if args.no_http else start_gateway(stack, args.http_port)
        print_ready(stack, gateway)
        _sleep_forever()
    except KeyboardInterrupt:
        pass
    except (RuntimeError, TimeoutError) as exc:
        stack.failed.append("startup")
        print(f"specdec up: {exc}", file=sys.stderr)
    finally:
        stop(stack, gateway)
    return 1 if stack.failed else 0


def start_gateway(stack: LocalStack, port: int) -> GatewayProcess:
    """The HTTP gateway in front of the stack's orchestrator, its log in the stack's log folder."""
    from http_gateway.process import GatewayProcess

    gateway = GatewayProcess(stack.orchestrator_address, port=port, log_dir=str(stack.log_dir))
    try:
        return gateway.start()
    except (RuntimeError, TimeoutError):
        gateway.stop()
        raise


def print_ready(stack: LocalStack, gateway: GatewayProcess | None) -> None:
    for proc in stack.procs:
        print(f"  {proc.role:<12} {proc.address}   log: {proc.log_path}")
    if gateway is not None:
        print(f"  {'http':<12} {gateway.url}   log: {gateway.log_path}")
    address = stack.orchestrator_address
    flag = "" if address == DEFAULT_GENERATE_ADDRESS else f"--address {address} "
    print(f'ready: specdec generate {flag}"Hello"   (Ctrl-C stops all)')
    if gateway is not None:
        print(f"OpenAI-compatible API: {gateway.url}/v1   (POST /v1/chat/completions, /v1/completions)")
    sys.stdout.flush()


def stop(stack: LocalStack, gateway: GatewayProcess | None) -> None:
    """Stop in order, each step bounded (the gateway, then LocalStack.stop's order); further Ctrl-C, SIGTERM and
    SIGHUP are ignored meanwhile, so that the streams in flight can finish."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    print(f"stopping: streams in flight finish first (up to {stack.drain_seconds():.0f} s)...", flush=True)
    if gateway is not None:
        gateway.stop()
        if gateway.popen is not None and gateway.popen.returncode not in (0, -signal.SIGTERM):
            stack.failed.append("http")
    stack.stop()
    if stack.failed:
        print(f"specdec up: logs kept in {stack.log_dir}", file=sys.stderr)


def _sleep_forever() -> None:
    """Until a signal interrupts (KeyboardInterrupt)."""
    while True:
        time.sleep(SLEEP_S)
