"""Capacity arithmetic behind docs/capacity.md, printed as the tables the note quotes.

    python -m deploy_tools.capacity_sim                    # print the tables
    python -m deploy_tools.capacity_sim --check docs/capacity.md   # exit 1 if the note differs
    python -m deploy_tools.capacity_sim --write docs/capacity.md   # refresh the note's tables

The message sizes follow protos/specdec/v1 (ProposeRequest/Response,
VerifyRequest/Response) with protobuf's encoding: varint token ids (packed
repeated int32), float32 probabilities, 1-byte tags (field numbers < 16).
Token ids are counted at their worst case for the Qwen1.5 vocabulary
(151,936 ids -> 3-byte varints), so byte counts are upper bounds.
Expected tokens per round use the i.i.d. acceptance model of Leviathan et al.
(2023): E = (1 - a^(k+1)) / (1 - a) for per-token acceptance a.
Every input is a named field of a dataclass below; nothing is measured here.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

BEGIN_MARK = "<!-- capacity-sim:begin {name} -->"
END_MARK = "<!-- capacity-sim:end {name} -->"
VARINT_BITS = 7
FLOAT32_BYTES = 4
TAG_BYTES = 1  # field numbers 1..15 with any wire type
MS_PER_S = 1000.0


@dataclass(frozen=True)
class WireModel:
    """Inputs of the per-round wire-size model (one Propose + one Verify RPC)."""

    k: int = 5  # draft tokens per round
    top_n: int = 16  # (id, prob) pairs of the sparse q' per position
    vocab_size: int = 151_936  # Qwen1.5: ids need <= 3 varint bytes
    session_id_chars: int = 36  # UUID text
    request_id_chars: int = 36
    sampling_bytes: int = 12  # temperature + top_p (float32) + draft_top_n
    stats_bytes: int = 25  # ComputeStats: 3 small varints + 2 doubles
    draft_kind_chars: int = 5  # "model"
    context_tokens_bytes_per_id: int = 0  # 0 = worst case from vocab_size
    grpc_prefix_bytes: int = 5  # gRPC length-prefixed message
    http2_frame_header_bytes: int = 9  # one DATA frame per message (< 16 KiB)
    hpack_request_headers_bytes: int = 60  # steady state, dynamic table warm (estimate)
    hpack_response_headers_bytes: int = 10  # estimate
    hpack_trailers_bytes: int = 15  # grpc-status: 0 (estimate)


@dataclass(frozen=True)
class SpeedModel:
    """Inputs of the draft:target worker model (times per forward, not measured)."""

    draft_tokens_per_s: float = 50.0  # one draft worker, sequential decode
    verify_ms: float = 30.0  # one target forward over k+1 positions
    target_batch: int = 1  # sessions verified per target forward


@dataclass(frozen=True)
class RedisModel:
    """The session store of orchestrator/session_store.py: one Lua script per write.

    Per round the orchestrator runs the `append` script (EVALSHA: one command,
    one round trip). Inside it: TIME, EXISTS, 3 HGET (owner, lease_until,
    version), HGET + HSET of the whole `ids` blob, 4 HINCRBY counters, the
    version HINCRBY, HSET updated_at, EXPIRE and the HGETALL reply = 15 calls.
    Per request: get, begin, finish and one lease renewal.
    """

    scripts_per_round: int = 1
    calls_per_round_script: int = 15
    scripts_per_request: int = 4
    generated_tokens_per_request: int = 256
    id_bytes_stored: int = 4  # ids kept as little-endian int32
    hash_fields_reply_bytes: int = 600  # HGETALL of the other 16 fields, RESP (estimate)
    shard_scripts_per_s: float = 10_000.0  # conservative budget for one Redis primary


def varint_size(value: int) -> int:
    """Bytes of a protobuf varint (non-negative values)."""
    if value < 0:
        raise ValueError("negative varints take 10 bytes; not modelled")
    return max(1, math.ceil(value.bit_length() / VARINT_BITS))


def length_delimited(payload: int) -> int:
    """Tag + length + payload (strings, packed arrays, embedded messages); 0 when empty."""
    return 0 if payload == 0 else TAG_BYTES + varint_size(payload) + payload


def id_bytes(model: WireModel) -> int:
    """Worst-case bytes of one token id."""
    return model.context_tokens_bytes_per_id or varint_size(model.vocab_size - 1)


def packed_ids(model: WireModel, count: int) -> int:
    """A packed repeated int32 field of `count` token ids."""
    return length_delimited(count * id_bytes(model))


def sparse_distribution(model: WireModel) -> int:
    """One SparseDistribution (token_ids packed, probs packed float32), unframed."""
    return packed_ids(model, model.top_n) + length_delimited(model.top_n * FLOAT32_BYTES)


def message_sizes(model: WireModel, context_ids: int) -> dict[str, int]:
    """Protobuf bytes of the four messages of one round with `context_ids` ids sent."""
    small_int = TAG_BYTES + 1  # k, num_accepted, next_kind
    token_field = TAG_BYTES + id_bytes(model)  # next_token
    q_prime = model.k * length_delimited(sparse_distribution(model))
    header = (
        length_delimited(model.session_id_chars)
        + length_delimited(model.request_id_chars)
        + packed_ids(model, context_ids)
        + length_delimited(model.sampling_bytes)
    )
    stats = length_delimited(model.stats_bytes)
    return {
        "propose_request": header + small_int,
        "propose_response": packed_ids(model, model.k) + q_prime + stats + length_delimited(model.draft_kind_chars),
        "verify_request": header + packed_ids(model, model.k) + q_prime,
        "verify_response": small_int
        + token_field
        + small_int
        + packed_ids(model, model.k + 1)
        + length_delimited(model.k)
        + stats,
    }


def framing_per_call(model: WireModel) -> int:
    """HTTP/2 + gRPC bytes around one unary call (headers, 2 data frames, trailers)."""
    frames = 4 * model.http2_frame_header_bytes + 2 * model.grpc_prefix_bytes
    return frames + model.hpack_request_headers_bytes + model.hpack_response_headers_bytes + model.hpack_trailers_bytes


def expected_tokens_per_round(acceptance: float, k: int) -> float:
    """E[tokens emitted per round] with i.i.d. per-token acceptance (includes the bonus)."""
    if acceptance >= 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def wire_rows(model: WireModel, contexts: list[tuple[str, int]], acceptance: float) -> list[list[str]]:
    """Rows of the wire table: one per context size."""
    rows = []
    tokens = expected_tokens_per_round(acceptance, model.k)
    for label, context_ids in contexts:
        sizes = message_sizes(model, context_ids)
        framing = 2 * framing_per_call(model)
        total = sum(sizes.values()) + framing
        rows.append([label, *(str(v) for v in sizes.values()), str(framing), str(total), f"{total / tokens:.0f}"])
    return rows


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


WIRE_CONTEXTS = [("delta: 6 new ids", 6), ("full context 512", 512), ("full context 2048", 2048)]
WIRE_ACCEPTANCE = 0.7
ACCEPTANCES = [0.5, 0.6, 0.7, 0.8, 0.9]
K_VALUES = [2, 3, 5, 8]
DRAFT_SPEEDS = [("Qwen1.5-0.5B, CPU", 50.0), ("Qwen1.5-0.5B, GPU", 250.0), ("n-gram", 20_000.0)]
TARGETS = [("GPU", 30.0), ("CPU", 150.0)]
RATIO_ACCEPTANCE = 0.7
SCALE_REPLICAS = [1, 10, 100, 300]
SCALE_BATCH = 8
SCALE_CONTEXT_IDS = 2048
REDIS_SESSION_LENGTHS = [512, 2048, 8192]


def wire_table(model: WireModel) -> str:
    """Table 1: bytes on the wire per round and per generated token."""
    header = [
        "context sent",
        "Propose req",
        "Propose resp",
        "Verify req",
        "Verify resp",
        "HTTP/2+gRPC",
        "bytes/round",
        f"bytes/token (a={WIRE_ACCEPTANCE})",
    ]
    return markdown_table(header, wire_rows(model, WIRE_CONTEXTS, WIRE_ACCEPTANCE))


def q_prime_table(model: WireModel) -> str:
    """Table 1b: the sparse q' alone."""
    one = sparse_distribution(model)
    framed = length_delimited(one)
    rows = [[str(model.top_n), str(one), str(framed), str(model.k * framed), str(2 * model.k * framed)]]
    return markdown_table(
        [
            "N pairs",
            "SparseDistribution",
            "+ field framing",
            f"x k={model.k} positions",
            "sent twice (resp + verify req)",
        ],
        rows,
    )


def scripts_per_token(redis: RedisModel, tokens_per_round: float) -> float:
    """Redis script calls (= client commands = round trips) per generated token."""
    return redis.scripts_per_round / tokens_per_round + redis.scripts_per_request / redis.generated_tokens_per_request


def redis_rows(redis: RedisModel, k: int) -> list[list[str]]:
    """Redis load per generated token for each acceptance."""
    rows = []
    for acceptance in ACCEPTANCES:
        tokens = expected_tokens_per_round(acceptance, k)
        scripts = scripts_per_token(redis, tokens)
        calls = redis.calls_per_round_script * redis.scripts_per_round / tokens
        rows.append([f"{acceptance:.1f}", f"{tokens:.2f}", f"{scripts:.2f}", f"{calls:.1f}"])
    return rows


def redis_table(redis: RedisModel, k: int) -> str:
    """Table 2: Redis load per generated token at k."""
    header = [
        "acceptance a",
        f"tokens/round (k={k})",
        "scripts (= commands = round trips)/token",
        "calls inside scripts/token",
    ]
    return markdown_table(header, redis_rows(redis, k))


def redis_bytes_table(redis: RedisModel, k: int) -> str:
    """Table 2b: bytes the append script copies and returns per round, by session length."""
    tokens = expected_tokens_per_round(WIRE_ACCEPTANCE, k)
    rows = []
    for length in REDIS_SESSION_LENGTHS:
        blob = length * redis.id_bytes_stored
        reply = blob + redis.hash_fields_reply_bytes
        rows.append([f"{length:,}", f"{blob:,}", f"{reply:,}", f"{reply / tokens:,.0f}"])
    header = [
        "session tokens",
        "ids blob rewritten/round",
        "HGETALL reply/round",
        f"reply bytes/token (a={WIRE_ACCEPTANCE})",
    ]
    return markdown_table(header, rows)


def drafts_per_target(speed: SpeedModel, k: int) -> float:
    """Draft workers that keep one target worker busy: k draft steps vs one verify."""
    draft_round_ms = k * MS_PER_S / speed.draft_tokens_per_s
    return speed.target_batch * draft_round_ms / speed.verify_ms


def ratio_rows() -> list[list[str]]:
    """Draft:target ratio and per-session speed for each draft speed, target and k."""
    rows = []
    for draft_label, draft_tps in DRAFT_SPEEDS:
        for target_label, verify_ms in TARGETS:
            speed = SpeedModel(draft_tokens_per_s=draft_tps, verify_ms=verify_ms)
            for k in K_VALUES:
                tokens = expected_tokens_per_round(RATIO_ACCEPTANCE, k)
                round_ms = k * MS_PER_S / draft_tps + verify_ms
                speedup = tokens * verify_ms / round_ms
                ratio = drafts_per_target(speed, k)
                rows.append(
                    [
                        draft_label,
                        f"{target_label} {verify_ms:.0f} ms",
                        str(k),
                        f"{ratio:.2f}",
                        str(math.ceil(ratio)),
                        f"{tokens * MS_PER_S / round_ms:.1f}",
                        f"{speedup:.2f}",
                    ]
                )
    return rows


def ratio_table() -> str:
    """Table 3: how many draft workers one target worker needs."""
    header = [
        "draft (tok/s)",
        "target verify",
        "k",
        "drafts per target",
        "whole workers",
        f"session tok/s (a={RATIO_ACCEPTANCE})",
        "vs target alone",
    ]
    rows = ratio_rows()
    labelled = [[f"{r[0]} ({dict(DRAFT_SPEEDS)[r[0]]:.0f})", *r[1:]] for r in rows]
    return markdown_table(header, labelled)


def scale_rows(model: WireModel, redis: RedisModel) -> list[list[str]]:
    """Cluster-wide load for growing target pools (GPU target, batched verify)."""
    k, acceptance = model.k, RATIO_ACCEPTANCE
    speed = SpeedModel(
        draft_tokens_per_s=dict(DRAFT_SPEEDS)["Qwen1.5-0.5B, GPU"],
        verify_ms=dict(TARGETS)["GPU"],
        target_batch=SCALE_BATCH,
    )
    tokens = expected_tokens_per_round(acceptance, k)
    rounds_per_target = speed.target_batch * MS_PER_S / speed.verify_ms
    full = sum(message_sizes(model, SCALE_CONTEXT_IDS).values()) + 2 * framing_per_call(model)
    delta = sum(message_sizes(model, k + 1).values()) + 2 * framing_per_call(model)
    rows = []
    for replicas in SCALE_REPLICAS:
        rounds = replicas * rounds_per_target
        commands = rounds * tokens * scripts_per_token(redis, tokens)
        rows.append(
            [
                str(replicas),
                f"{rounds * tokens:,.0f}",
                f"{math.ceil(replicas * drafts_per_target(speed, k)):,}",
                f"{commands:,.0f}",
                str(math.ceil(commands / redis.shard_scripts_per_s)),
                f"{rounds * full * 8 / 1e6:,.0f}",
                f"{rounds * delta * 8 / 1e6:,.0f}",
            ]
        )
    return rows


def scale_table(model: WireModel, redis: RedisModel) -> str:
    """Table 4: what 1 to 300 target replicas ask of Redis, drafts and the network."""
    header = [
        "target replicas",
        "tokens/s",
        "draft workers",
        "Redis scripts/s",
        f"Redis primaries @{redis.shard_scripts_per_s:,.0f}/s",
        f"Mbit/s, full context {SCALE_CONTEXT_IDS}",
        "Mbit/s, delta",
    ]
    return markdown_table(header, scale_rows(model, redis))


def tables(model: WireModel | None = None, redis: RedisModel | None = None) -> dict[str, str]:
    """Every table of the note, by marker name."""
    model, redis = model or WireModel(), redis or RedisModel()
    return {
        "wire": wire_table(model),
        "qprime": q_prime_table(model),
        "redis": redis_table(redis, model.k),
        "redisbytes": redis_bytes_table(redis, model.k),
        "ratio": ratio_table(),
        "scale": scale_table(model, redis),
    }


def block(name: str, text: str) -> str:
    """A table wrapped in its markers, as it appears in the note."""
    return f"{BEGIN_MARK.format(name=name)}\n{text}\n{END_MARK.format(name=name)}"


def extract_blocks(note: str) -> dict[str, str]:
    """The marked tables found in the note."""
    found = {}
    for name in tables():
        begin, end = BEGIN_MARK.format(name=name), END_MARK.format(name=name)
        if begin in note and end in note:
            found[name] = note.split(begin, 1)[1].split(end, 1)[0].strip("\n")
    return found


def rewrite_note(note: str) -> str:
    """The note with every marked table replaced by the current output."""
    for name, text in tables().items():
        begin, end = BEGIN_MARK.format(name=name), END_MARK.format(name=name)
        if begin not in note or end not in note:
            raise ValueError(f"note lacks the markers of table {name!r}")
        head, rest = note.split(begin, 1)
        _old, tail = rest.split(end, 1)
        note = head + block(name, text) + tail
    return note


def main(argv: list[str] | None = None) -> int:
    """Print the tables, or check / rewrite a note that quotes them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", type=Path, help="exit 1 if this note's tables differ")
    group.add_argument("--write", type=Path, help="rewrite this note's tables in place")
    args = parser.parse_args(argv)
    if args.check:
        stale = [n for n, t in tables().items() if extract_blocks(args.check.read_text(encoding="utf-8")).get(n) != t]
        print("stale tables: " + ", ".join(stale) if stale else "note matches")
        return 1 if stale else 0
    if args.write:
        args.write.write_text(rewrite_note(args.write.read_text(encoding="utf-8")), encoding="utf-8")
        return 0
    for name, text in tables().items():
        print(block(name, text) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
