"""The `specdec` command: serve a service, run the whole stack locally, generate.

  specdec serve draft|target|orchestrator|http [options]
  specdec up [--target-model SPEC] [--draft-kind ngram|model] [--draft-replicas N] [--target-replicas M] [--port N]
             [--http-port N]
  specdec generate "prompt" [--k N] [--max-new-tokens N] [--session ID] [--trace] [--json]
  specdec distill --target SPEC --out DIR [--layers 1|2] [--head-tokens N] [--steps N] [--seed N] [--resume]
  specdec bench [--prompts grounded,open] [--k 2,4,8,12] [--max-new-tokens N] [--repeats N] [--threads N] [--quick]
  specdec bench-load [--quick | --full] [--concurrency 1,4,16] [--requests N] [--k 4] [--adaptive-cap N]
  specdec --version

`specdec up` serves gRPC on 127.0.0.1:50050 when that port is free, which is where `specdec generate`
looks by default; when it is taken, `up` picks another port and prints the --address to pass.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from importlib import metadata
from typing import Any, NoReturn

from specdec import __version__, up
from specdec.config import (
    DEFAULT_DRAFT_PORT,
    DEFAULT_MODELS,
    DEFAULT_ORCHESTRATOR_PORT,
    DEFAULT_TARGET_PORT,
    CommandSettings,
    ConfigError,
)
from specdec.params import DEFAULTS

EXIT_USAGE, EXIT_LOAD_ERROR = 2, 2
EXIT_BROKEN_PIPE = 1  # as Python's own note on SIGPIPE suggests
EXIT_FAILURE = 1
DEFAULT_PORTS = {"draft": DEFAULT_DRAFT_PORT, "target": DEFAULT_TARGET_PORT, "orchestrator": DEFAULT_ORCHESTRATOR_PORT}


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run one service")
    p.add_argument("role", choices=["draft", "target", "orchestrator", "http"])
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--metrics-port", type=int)
    p.add_argument(
        "--model",
        help="model spec: embedded | modelscope:ORG/NAME | hf:ORG/NAME | DIR | gguf:FILE "
        f"(default: {DEFAULT_MODELS['target']} for a target, {DEFAULT_MODELS['draft']}, "
        "the trained draft shipped for it, for a draft)",
    )
    p.add_argument("--draft-kind", choices=["model", "ngram", "combined"])
    p.add_argument("--device")
    p.add_argument("--dtype")
    p.add_argument(
        "--engine",
        choices=["auto", "torch", "llamacpp"],
        help="model runner: auto (llama.cpp for a GGUF on CPU, torch otherwise), torch, llamacpp",
    )
    p.add_argument("--threads", type=int)
    p.add_argument("--cache-budget-bytes", type=int)
    p.add_argument("--max-batch", type=int, help="target: sessions verified in one forward pass (1 = off)")
    p.add_argument("--draft", dest="draft_addresses", help="draft replicas: host:port,... or dns:///name:port")
    p.add_argument("--target", dest="target_addresses", help="target replicas: host:port,... or dns:///name:port")
    p.add_argument("--redis-url")
    p.add_argument("--tokenizer", help="model spec of the target (tokenizer only)")
    p.add_argument("--max-concurrent", type=int)
    p.add_argument("--orchestrator", help="http: the orchestrator's gRPC address (default SPECDEC_ORCHESTRATOR)")
    p.add_argument("--http-port", type=int, help="http: the HTTP port (same as --port)")


def _apply(cfg: object, args: argparse.Namespace, names: list[str]) -> None:
    for name in names:
        value = getattr(args, name, None)
        if value is not None:
            setattr(cfg, name, value)


def cmd_serve(args: argparse.Namespace) -> int:
    """Build the role's config from env + flags and run it until SIGTERM."""
    if args.role == "http":
        return cmd_serve_http(args)
    from specdec.config import ModelServiceConfig, OrchestratorConfig
    from specdec.models.spec import ModelLoadError

    serve: Callable[[], Coroutine[Any, Any, None]]
    if args.role == "orchestrator":
        from orchestrator.main import serve as serve_orchestrator

        orchestrator = OrchestratorConfig()
        _apply(orchestrator, args, ["draft_addresses", "target_addresses", "redis_url", "tokenizer", "max_concurrent"])
        server, serve = orchestrator.server, lambda: serve_orchestrator(orchestrator)
    else:
        if args.role == "draft":
            from draft_service.main import serve as serve_model
        else:
            from target_service.main import serve as serve_model
        model = ModelServiceConfig(role=args.role)
        fields = ["model", "draft_kind", "device", "dtype", "engine", "threads", "cache_budget_bytes", "max_batch"]
        _apply(model, args, fields)
        server, serve = model.server, lambda: serve_model(model)
    _apply(server, args, ["host", "metrics_port"])
    port = args.port if args.port is not None else CommandSettings().port
    server.port = DEFAULT_PORTS[args.role] if port is None else port
    try:
        asyncio.run(serve())
    except ModelLoadError as exc:
        print(f"specdec {args.role}: {exc}", file=sys.stderr)
        return EXIT_LOAD_ERROR
    return 0


def console() -> NoReturn:
    """The `specdec` console script and `python -m specdec.cli`: run the command, then exit; a service (`specdec
    serve ...`) that drained and stopped exits at once (exit_stopped_service)."""
    code = main()
    if code == 0 and sys.argv[1:2] == ["serve"]:
        exit_stopped_service()
    sys.exit(code)


def exit_stopped_service() -> NoReturn:
    """End a service (or the HTTP gateway) that has drained and closed what it opened, now: without the
    interpreter's finalization, which only tears down torch's, llama.cpp's and gRPC's native state (1 s for one
    idle service on 2 loaded cores, more than 5 s for the services of a stack that all end at once, as they do
    when `specdec up` is killed), while the port stays taken and a supervisor waits."""
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def cmd_serve_http(args: argparse.Namespace) -> int:
    """The OpenAI-compatible HTTP gateway (http_gateway/) in front of an orchestrator."""
    from http_gateway.main import config_from_env, serve

    port = args.http_port if args.http_port is not None else args.port
    cfg = config_from_env(orchestrator=args.orchestrator or None, host=args.host or None, port=port)
    asyncio.run(serve(cfg))
    return 0


def _generate_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text through the orchestrator",
        description="Generate once through a running orchestrator (`specdec up` starts one) and "
        "print the text and its stats. Unset flags take the server's defaults.",
    )
    p.add_argument("prompt", help="the prompt text (raw, or one user chat message with --chat)")
    p.add_argument(
        "--address",
        default=f"127.0.0.1:{DEFAULT_ORCHESTRATOR_PORT}",
        help="orchestrator gRPC address host:port (default: %(default)s)",
    )
    p.add_argument("--chat", action="store_true", help="send the prompt as a user chat message (chat template)")
    p.add_argument("--k", type=int, help=f"draft tokens per round; 0 = target-only decoding (default: {DEFAULTS['k']})")
    p.add_argument(
        "--max-new-tokens", type=int, help=f"completion tokens at most (default: {DEFAULTS['max_new_tokens']})"
    )
    p.add_argument(
        "--draft-kind",
        choices=["model", "ngram", "combined"],
        help="which draft proposes: a draft model, prompt lookup, or lookup then model "
        "(default: the draft service's kind)",
    )
    p.add_argument(
        "--temperature", type=float, help=f"sampling temperature; 0 = greedy (default: {DEFAULTS['temperature']})"
    )
    p.add_argument("--top-k", type=int, help="sample from the k most likely tokens only (0 = off)")
    p.add_argument("--top-p", type=float, help="nucleus sampling: the smallest set with this probability (1 = off)")
    p.add_argument(
        "--seed",
        type=int,
        help="seed of the request's random draws (default: a fresh one); the same seed repeats a sampled generation",
    )
    p.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="stop before this text (repeat the flag for several)",
    )
    p.add_argument("--session", metavar="ID", help="continue this session (multi-turn, its tokens stay cached)")
    p.add_argument("--new-session", action="store_true", help="create --session if it does not exist")
    p.add_argument(
        "--trace",
        action="store_true",
        help="print the per-round table: draft tokens, matches, target tokens, accepted, next token",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the whole response as JSON: numbers as numbers, every stats field, finish_reason "
        "by its OpenAI name (stop, length) and finish_detail",
    )
    p.add_argument("--stream", action="store_true", help="print the text as it is generated (GenerateStream)")
    p.add_argument(
        "--timeout", type=float, default=600.0, help="deadline of the call in seconds (default: %(default)s)"
    )
    p.add_argument("--token", help="bearer token (or SPECDEC_TOKEN)")
    p.add_argument("--tls-ca", help="CA bundle to verify the orchestrator (enables TLS)")
    p.add_argument("--tls-cert", help="client certificate (mTLS)")
    p.add_argument("--tls-key", help="client key (mTLS)")


def unreachable_hint(exc: Any, address: str) -> str:
    """What to do when nothing listens at `address` (the call failed to connect); "" for any other failure."""
    import grpc

    if exc.code() != grpc.StatusCode.UNAVAILABLE or "connection refused" not in (exc.details() or "").lower():
        return ""
    return (
        f"no orchestrator answers at {address} (connection refused). Start the local stack with `specdec up` "
        f"(it listens on 127.0.0.1:{DEFAULT_ORCHESTRATOR_PORT} when that port is free), or pass the --address "
        f"it printed."
    )


def build_request(args: argparse.Namespace):
    """GenerateRequest from CLI flags: unset flags stay unset (server defaults apply)."""
    from specdec.v1 import orchestrator_pb2 as pb

    req = pb.GenerateRequest(stop=args.stop)
    if args.chat:
        req.messages.messages.add(role="user", content=args.prompt)
    else:
        req.prompt = args.prompt
    for flag, fld in (
        ("k", "k"),
        ("max_new_tokens", "max_new_tokens"),
        ("draft_kind", "draft_kind"),
        ("session", "session_id"),
    ):
        if getattr(args, flag) is not None:
            setattr(req, fld, getattr(args, flag))
    for flag in ("temperature", "top_k", "top_p", "seed"):
        if getattr(args, flag) is not None:
            setattr(req.sampling, flag, getattr(args, flag))
    if args.new_session:
        req.create_session = True
    if args.trace:
        req.trace = True
    return req


def cmd_generate(args: argparse.Namespace) -> int:
    """Call Generate (or GenerateStream) and print text, stats and the round table."""
    import grpc

    from specdec.proto_json import generation_dict
    from specdec.report import round_table, stats_lines
    from specdec.v1 import orchestrator_pb2_grpc

    req = build_request(args)
    from specdec.config import TLSConfig
    from specdec.healthcheck import channel_for

    token = args.token or CommandSettings().token
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    tls = TLSConfig(cert=args.tls_cert or "", key=args.tls_key or "", ca=args.tls_ca or "")
    with channel_for(args.address, tls) as channel:
        stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
        try:
            if args.stream and not args.json:
                return _print_stream(stub.GenerateStream(req, timeout=args.timeout, metadata=metadata), args)
            resp = stub.Generate(req, timeout=args.timeout, metadata=metadata)
        except grpc.RpcError as exc:
            print(
                f"specdec generate: {unreachable_hint(exc, args.address) or f'{exc.code().name}: {exc.details()}'}",
                file=sys.stderr,
            )
            return EXIT_FAILURE
    if args.json:
        print(json.dumps(generation_dict(resp), ensure_ascii=False, indent=2))
        return 0
    print(resp.text)
    print()
    print(stats_lines(resp.stats, resp.usage, resp.finish_reason))
    if args.trace:
        print()
        print(round_table(resp.trace))
    return 0


def _print_stream(chunks, args: argparse.Namespace) -> int:
    from specdec.report import round_table, stats_lines

    rounds = []
    for chunk in chunks:
        sys.stdout.write(chunk.text_delta)
        sys.stdout.flush()
        rounds += list(chunk.rounds)
        if chunk.HasField("finish_reason"):
            print("\n")
            print(stats_lines(chunk.stats, chunk.usage, chunk.finish_reason))
    if args.trace:
        print()
        print(round_table(rounds))
    return 0


def _cmd_bench_load(ns: argparse.Namespace) -> int:
    """`specdec bench-load`: the rate/concurrency matrix, or with --long-mix the long-prompt mix (which
    builds on the matrix's pieces, so the dependency runs one way: load_longmix -> load)."""
    from specdec.bench.load import cmd_bench_load
    from specdec.bench.load_args import args_from_cli
    from specdec.bench.load_longmix import cmd_long_mix

    if ns.long_mix:
        return cmd_long_mix(args_from_cli(ns), ns.long_mix_seconds)
    return cmd_bench_load(ns)


def package_version() -> str:
    """The installed distribution's version; specdec.__version__ in a source tree that is not installed."""
    try:
        return metadata.version("specdec")
    except metadata.PackageNotFoundError:
        return __version__


def build_parser() -> argparse.ArgumentParser:
    """The `specdec` command line: every subcommand's parser."""
    parser = argparse.ArgumentParser(
        prog="specdec",
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"specdec {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    up.add_parser(sub)
    _generate_parser(sub)
    from specdec.bench.ab import add_parser as _ab_parser
    from specdec.bench.bench_cli import add_parser as _bench_parser
    from specdec.bench.concurrency_cli import add_parser as _concurrency_parser
    from specdec.bench.load_args import add_parser as _load_parser
    from specdec.distill.cli import add_parser as _distill_parser

    for add in (_bench_parser, _concurrency_parser, _ab_parser, _load_parser, _distill_parser):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `specdec` console script."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    from specdec.bench.ab import cmd_bench_ab
    from specdec.bench.bench_cli import cmd_bench
    from specdec.bench.concurrency_cli import cmd_bench_concurrency
    from specdec.distill.cli import run as cmd_distill

    handlers = {
        "serve": cmd_serve,
        "up": up.cmd_up,
        "generate": cmd_generate,
        "bench": cmd_bench,
        "bench-concurrency": cmd_bench_concurrency,
        "bench-ab": cmd_bench_ab,
        "bench-load": _cmd_bench_load,
        "distill": cmd_distill,
    }
    try:
        code = handlers[args.command](args)
        sys.stdout.flush()  # a closed pipe shows here, not in the flush at interpreter exit
        return code
    except ConfigError as exc:  # a setting that cannot be used: one line naming it, no traceback
        command = " ".join(filter(None, ("specdec", args.command, getattr(args, "role", None))))
        print(f"{command}: invalid configuration: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # the reader went away (`specdec generate ... | head -1`): stop quietly
        _silence_stdout()
        return EXIT_BROKEN_PIPE


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that flushing it at exit cannot raise BrokenPipeError again
    (https://docs.python.org/3/library/signal.html#note-on-sigpipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    console()
