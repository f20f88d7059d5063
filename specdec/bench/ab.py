"""`specdec bench-ab`: what one mechanism is worth end to end, measured as an A/B of whole stacks.

Each arm is a local stack (Redis, draft, target, orchestrator) started with its own environment, e.g.

    specdec bench-ab --arm base: --arm serial:SPECDEC_LOOP_FORWARDS=0

All arms stay up for the whole run and take turns on every generation: for each repeat and prompt, every
configuration runs on every arm (A B A B ...), so a drift of the machine falls on both sides alike. The
figure is the client's tok/s with prefill (greedy, EOS ignored, the bench's prompts); each arm's gain is
the median over (prompt, repeat) pairs of its tok/s over the first arm's on the same pair, with the
spread of those pairs (quartiles).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec.bench.machine import machine_info
from specdec.bench.plan import PROMPT_SETS, WARMUP_TOKENS, Prompt, env_assignments, load_prompts
from specdec.bench.runner import interleave_sets

DEFAULT_CONFIGS = "k0,default"  # k = 0, and the default configuration (the server's own choice of k)
QUARTILES = 4


@dataclass
class Arm:
    name: str
    env: dict[str, str]


@dataclass
class AbArgs:
    arms: list[Arm]
    configs: list[str] = field(default_factory=lambda: DEFAULT_CONFIGS.split(","))
    prompts: list[str] = field(default_factory=lambda: list(PROMPT_SETS))
    prompts_per_set: int = 0
    max_new_tokens: int = 64
    repeats: int = 2
    threads: int = 2
    draft_kind: str = "ngram"
    draft_model: str = ""
    pins: dict[str, set[int]] = field(default_factory=dict)  # role -> the CPUs its process runs on
    out: str = ""


def parse_arm(text: str) -> Arm:
    """'NAME:VAR=V,VAR=V' (an empty list: the environment as it is)."""
    name, _, assignments = text.partition(":")
    if not name:
        raise argparse.ArgumentTypeError(f"an arm is NAME:VAR=V,...; got {text!r}")
    return Arm(name, env_assignments(assignments))


def parse_pin(text: str) -> tuple[str, set[int]]:
    """'ROLE=CPU,CPU' (e.g. target=0, draft=1): the role's processes run on those CPUs only."""
    role, _, cpus = text.partition("=")
    if not role or not cpus:
        raise argparse.ArgumentTypeError(f"a pin is ROLE=CPU,...; got {text!r}")
    return role, {int(cpu) for cpu in cpus.split(",")}


def pin(stack: Any, pins: dict[str, set[int]]) -> None:
    """Every thread of each pinned role's processes onto its CPUs (as `taskset -a -p`): two services on separate
    cores, as on two machines."""
    for proc in stack.procs:
        cpus = pins.get(proc.role)
        if not cpus:
            continue
        for task in Path(f"/proc/{proc.popen.pid}/task").iterdir():
            os.sched_setaffinity(int(task.name), cpus)


def config_k(config: str) -> int | None:
    """'k0', 'k4' -> the request's k; 'default' -> None (the server decides)."""
    if config == "default":
        return None
    if config.startswith("k") and config[1:].isdigit():
        return int(config[1:])
    raise ValueError(f"a configuration is kN or default; got {config!r}")


def run(args: AbArgs) -> dict[str, Any]:
    from specdec.bench.stack_client import StackClient
    from specdec.launcher import LocalStack, StackConfig

    prompts = interleave_sets(load_prompts(args.prompts, args.prompts_per_set))
    stacks = [
        LocalStack(
            StackConfig(
                draft_kind=args.draft_kind, draft_model=args.draft_model, threads=args.threads, extra_env=arm.env
            )
        )
        for arm in args.arms
    ]
    rows: list[dict[str, Any]] = []
    try:
        for stack in stacks:
            stack.start()
            pin(stack, args.pins)
        clients = [StackClient(stack) for stack in stacks]
        for client in clients:  # warm-up: every configuration once on the first prompt
            for config in args.configs:
                client.generate(prompts[0], config_k(config), WARMUP_TOKENS)
        for rep in range(args.repeats):
            for p in prompts:
                for config in args.configs:
                    for arm, client in zip(args.arms, clients, strict=True):
                        rows.append(_one(client, arm, p, config, rep, args.max_new_tokens))
                print(f"rep {rep + 1} {p.set}/{p.id} done", file=sys.stderr)
        for client in clients:
            client.close()
    finally:
        for stack in stacks:
            stack.stop()
    return {
        "machine": machine_info(),
        "arms": [vars(a) for a in args.arms],
        "settings": vars(args) | {"arms": None, "pins": {role: sorted(cpus) for role, cpus in args.pins.items()}},
        "summary": summarize(rows, [a.name for a in args.arms]),
        "runs": rows,
    }


def _one(client: Any, arm: Arm, p: Prompt, config: str, rep: int, max_new: int) -> dict[str, Any]:
    tokens, wall, _, final, _ = client.generate(p, config_k(config), max_new)
    if final is None:
        raise RuntimeError(f"{arm.name} {p.id} {config}: the stream ended without a final chunk")
    return {
        "arm": arm.name,
        "set": p.set,
        "prompt": p.id,
        "config": config,
        "repeat": rep,
        "tokens": len(tokens),
        "wall_s": round(wall, 4),
        "tok_s": round(len(tokens) / wall, 3),
    }


def summarize(rows: list[dict[str, Any]], arms: list[str]) -> list[dict[str, Any]]:
    """Per (set, configuration): each arm's median tok/s and its paired ratio to the first arm."""
    out = []
    keys = sorted({(r["set"], r["config"]) for r in rows})
    for set_name, config in keys:
        mine = [r for r in rows if (r["set"], r["config"]) == (set_name, config)]
        by_pair = {(r["arm"], r["prompt"], r["repeat"]): r["tok_s"] for r in mine}
        base = arms[0]
        line: dict[str, Any] = {"set": set_name, "config": config}
        for arm in arms:
            line[arm] = round(statistics.median(r["tok_s"] for r in mine if r["arm"] == arm), 2)
            ratios = sorted(
                by_pair[(arm, prompt, rep)] / by_pair[(base, prompt, rep)]
                for (a, prompt, rep) in by_pair
                if a == base and (arm, prompt, rep) in by_pair
            )
            if arm != base and ratios:
                quartiles = statistics.quantiles(ratios, n=QUARTILES) if len(ratios) > 1 else ratios * 3
                line[f"{arm}/{base}"] = round(statistics.median(ratios), 4)
                line[f"{arm}/{base} q1-q3"] = [round(quartiles[0], 4), round(quartiles[-1], 4)]
        out.append(line)
    return out


def table(summary: list[dict[str, Any]], arms: list[str]) -> str:
    base = arms[0]
    head = ["set", "config", *arms, *(f"{a}/{base} (q1-q3)" for a in arms[1:])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summary:
        ratios = [
            f"{s[f'{a}/{base}']:.3f} ({s[f'{a}/{base} q1-q3'][0]:.3f}-{s[f'{a}/{base} q1-q3'][1]:.3f})"
            for a in arms[1:]
        ]
        lines.append("| " + " | ".join([s["set"], s["config"], *(f"{s[a]:.1f}" for a in arms), *ratios]) + " |")
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench-ab", help="A/B of whole stacks that differ in their environment (one mechanism)")
    p.add_argument(
        "--arm",
        action="append",
        type=parse_arm,
        required=True,
        help="NAME:VAR=V,VAR=V (the first arm is the baseline; give at least two)",
    )
    p.add_argument("--configs", default=DEFAULT_CONFIGS, help="comma-separated: kN (fixed k) and/or default")
    p.add_argument("--prompts", default=",".join(PROMPT_SETS))
    p.add_argument("--prompts-per-set", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--draft-kind", default="ngram", choices=("ngram", "model", "combined"))
    p.add_argument("--draft-model", default="", help="the draft service's model (with --draft-kind model)")
    p.add_argument(
        "--pin", action="append", type=parse_pin, default=[], help="ROLE=CPU,... (repeatable): run a role on those CPUs"
    )
    p.add_argument("--out", default="", help="write the JSON here")


def cmd_bench_ab(ns: argparse.Namespace) -> int:
    if len(ns.arm) < 2:
        print("specdec bench-ab: give at least two --arm", file=sys.stderr)
        return 2
    args = AbArgs(
        ns.arm,
        ns.configs.split(","),
        ns.prompts.split(","),
        ns.prompts_per_set,
        ns.max_new_tokens,
        ns.repeats,
        ns.threads,
        ns.draft_kind,
        ns.draft_model,
        dict(ns.pin),
        ns.out,
    )
    for config in args.configs:
        config_k(config)
    started = time.perf_counter()
    result = run(args)
    result["seconds"] = round(time.perf_counter() - started, 1)
    print(table(result["summary"], [a.name for a in args.arms]))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0
