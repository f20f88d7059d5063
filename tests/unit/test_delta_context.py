"""Delta rounds without servers: the prefix hash, the replica's ContextStore and the orchestrator's ContextSend."""

from __future__ import annotations

import grpc
import pytest
from grpc import aio

from orchestrator.delta import ContextWire, is_context_miss
from specdec.core.prefix_hash import EMPTY_HASH, PrefixHashes, prefix_hash, step
from specdec.engine.contexts import ContextStore
from specdec.errors import CONTEXT_MISS_METADATA, ContextMiss, InvalidArgument
from specdec.v1 import common_pb2, draft_pb2, target_pb2

WIDTH = 1000


def resolve(store: ContextStore, *args) -> list[int]:
    """The resolved context, after checking the prefix hashes handed out with it."""
    context, hashes = store.resolve(*args)
    assert len(hashes) == len(context) and hashes.at(len(context)) == prefix_hash(context)
    return context


def test_prefix_hash_is_pinned_and_incremental():
    # Pinned: both sides of the wire (and any other implementation) must compute exactly these.
    assert prefix_hash([]) == EMPTY_HASH
    assert prefix_hash([1, 2, 3]) == 0xB50803DD40C6ACFD
    ids = list(range(50, 90))
    hashes = PrefixHashes(ids[:10])
    hashes.extend(ids[10:])
    assert len(hashes) == len(ids)
    for n in range(len(ids) + 1):
        assert hashes.at(n) == prefix_hash(ids[:n])
    assert prefix_hash(ids[5:], hashes.at(5)) == hashes.at(len(ids))
    hashes.truncate(7)
    hashes.extend([1, 2])
    assert len(hashes) == 9 and hashes.at(9) == prefix_hash(ids[:7] + [1, 2])


def test_prefix_hash_separates_near_sequences():
    base = [5, 6, 7, 8]
    variants = [base, [6, 5, 7, 8], [5, 6, 7], [5, 6, 7, 8, 0], [0, 5, 6, 7, 8], [5, 6, 7, 9]]
    assert len({prefix_hash(v) for v in variants}) == len(variants)
    # Thue-Morse strings collide for every polynomial hash modulo 2^64 with an odd base; a chained hash does not.
    tm = [0]
    for _ in range(11):
        tm = tm + [1 - t for t in tm]
    assert prefix_hash(tm) != prefix_hash([1 - t for t in tm])
    assert step(EMPTY_HASH, 0) != step(EMPTY_HASH, 1)


def test_store_full_then_delta_then_rollback():
    store = ContextStore(max_tokens=100, width=WIDTH)
    assert resolve(store, "s", [1, 2, 3, 4], 0, None) == [1, 2, 3, 4]
    assert resolve(store, "s", [5, 6], 4, prefix_hash([1, 2, 3, 4])) == [1, 2, 3, 4, 5, 6]
    # A delta from an earlier position (the replica holds more: e.g. an abandoned round's tokens).
    assert resolve(store, "s", [9], 5, prefix_hash([1, 2, 3, 4, 5])) == [1, 2, 3, 4, 5, 9]
    assert resolve(store, "s", [], 6, prefix_hash([1, 2, 3, 4, 5, 9])) == [1, 2, 3, 4, 5, 9]
    assert store.counters.hits == 3 and store.counters.misses == 0
    assert store.held_tokens() == 6


def test_shared_prefix_and_kv_common_prefix():
    from specdec.core.prefix_hash import shared_prefix
    from specdec.engine.kvcache import SessionKV

    a = list(range(100, 160))
    for cut in (0, 1, 17, 59, 60):
        b = a[:cut] + [7] * 5
        limit = min(len(a), len(b))
        assert shared_prefix(PrefixHashes(a), PrefixHashes(b), limit) == cut
    from transformers import DynamicCache

    kv = SessionKV(cache=DynamicCache(), tokens=list(a), hashes=PrefixHashes(a))
    assert kv.common_prefix(a[:30] + [1, 2], PrefixHashes(a[:30] + [1, 2])) == 30
    kv.truncate(20)
    assert len(kv.hashes) == 20 and kv.common_prefix(a, PrefixHashes(a)) == 20
    kv.extend_tokens(a[:25], PrefixHashes(a))
    assert kv.tokens == a[:25] and kv.hashes.at(25) == prefix_hash(a[:25])
    kv.extend_tokens(a[:27], None)
    assert kv.hashes is None and kv.common_prefix(a[:26] + [0], PrefixHashes(a[:26] + [0])) == 26


def test_store_hands_out_lists_it_never_mutates():
    store = ContextStore(max_tokens=100, width=WIDTH)
    first = resolve(store, "s", [1, 2, 3], 0, None)
    second = resolve(store, "s", [4], 3, prefix_hash([1, 2, 3]))
    resolve(store, "s", [7], 1, prefix_hash([1]))
    assert first == [1, 2, 3] and second == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "position_base,hashed,reason",
    [(3, [1, 2, 3], "unknown-session"), (9, [1] * 9, "shorter"), (2, [1, 3], "hash-mismatch")],
)
def test_store_misses_with_a_reason(position_base, hashed, reason):
    store = ContextStore(max_tokens=100, width=WIDTH)
    if reason != "unknown-session":
        resolve(store, "s", [1, 2, 3, 4], 0, None)
    with pytest.raises(ContextMiss) as err:
        resolve(store, "s", [5], position_base, prefix_hash(hashed))
    assert err.value.reason == reason and err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert err.value.trailing_metadata() == ((CONTEXT_MISS_METADATA, reason),)
    assert store.counters.misses == 1


def test_store_checks_new_ids_only_and_keeps_its_context_on_bad_ids():
    store = ContextStore(max_tokens=100, width=WIDTH)
    resolve(store, "s", [1, 2], 0, None)
    for bad in ([WIDTH], [-1]):
        with pytest.raises(InvalidArgument, match="position 2"):
            resolve(store, "s", bad, 2, prefix_hash([1, 2]))
    with pytest.raises(InvalidArgument):
        resolve(store, "t", [1, WIDTH + 5], 0, None)
    assert resolve(store, "s", [3], 2, prefix_hash([1, 2])) == [1, 2, 3]
    assert resolve(ContextStore(10, width=0), "n", [10**6], 0, None) == [10**6], "width 0: any id >= 0"


def test_store_evicts_least_recently_used_within_its_budget():
    store = ContextStore(max_tokens=10, width=WIDTH)
    resolve(store, "a", [1] * 4, 0, None)
    resolve(store, "b", [2] * 4, 0, None)
    resolve(store, "a", [1], 4, prefix_hash([1] * 4))  # a is now the most recent
    resolve(store, "c", [3] * 4, 0, None)  # 5 + 4 + 4 > 10: b goes
    assert store.counters.evictions == 1 and store.held_tokens() == 9
    with pytest.raises(ContextMiss):
        resolve(store, "b", [2], 4, prefix_hash([2] * 4))
    resolve(store, "big", [4] * 11, 0, None)  # over the whole budget: served, not held
    with pytest.raises(ContextMiss):
        resolve(store, "big", [4], 11, prefix_hash([4] * 11))
    assert store.release("a") and not store.release("a")


def test_store_forgets_a_window_that_does_not_start_at_zero():
    store = ContextStore(max_tokens=100, width=WIDTH)
    resolve(store, "s", [1, 2], 0, None)
    assert resolve(store, "s", [7, 8], 40, None) == [7, 8]
    assert store.session_count() == 0


def info(delta: bool = True) -> common_pb2.ModelInfo:
    return common_pb2.ModelInfo(context_delta=delta)


def test_send_full_first_then_only_new_tokens():
    wire = ContextWire()
    ctx = list(range(1, 101))
    send = wire.send("target", ctx)
    req = target_pb2.VerifyRequest(session_id="s", draft_ids=[1, 2, 3, 4])
    send.fill(req, "A", info())
    assert list(req.context_ids) == ctx and not req.HasField("prefix_hash") and req.position_base == 0
    send.confirm("A")
    ctx2 = ctx + [7, 8, 9]
    send2 = wire.send("target", ctx2)
    req2 = target_pb2.VerifyRequest(session_id="s", draft_ids=[1, 2, 3, 4])
    send2.fill(req2, "A", info())
    assert list(req2.context_ids) == [7, 8, 9] and req2.position_base == 100
    assert req2.prefix_hash == prefix_hash(ctx)
    assert req2.ByteSize() < 40
    for address, inf in (("B", info()), ("A", info(False)), ("A", None)):  # another replica, an old one
        other = target_pb2.VerifyRequest()
        send2.fill(other, address, inf)
        assert list(other.context_ids) == ctx2 and not other.HasField("prefix_hash")
    draft = draft_pb2.ProposeRequest()
    wire.send("draft", ctx2).fill(draft, "A", info())
    assert len(draft.context_ids) == len(ctx2), "the draft pool's replica holds nothing yet"


def test_send_after_a_failure_or_a_miss_is_whole():
    wire = ContextWire()
    send = wire.send("draft", [1, 2, 3])
    send.confirm("A")
    send = wire.send("draft", [1, 2, 3, 4])
    req = draft_pb2.ProposeRequest()
    send.fill(req, "A", info())
    assert list(req.context_ids) == [4]
    send.missed("A")
    send.fill(req, "A", info())
    assert list(req.context_ids) == [1, 2, 3, 4] and not req.HasField("prefix_hash") and send.resends == 1
    send.confirm("A")
    send.forget("A")
    wire.send("draft", [1, 2, 3, 4, 5]).fill(req, "A", info())
    assert len(req.context_ids) == 5


def test_wire_rehashes_a_rewritten_context():
    wire = ContextWire()
    wire.send("target", [1, 2, 3]).confirm("A")
    send = wire.send("target", [1, 2, 9, 4])
    req = target_pb2.VerifyRequest()
    send.fill(req, "A", info())
    assert list(req.context_ids) == [1, 2, 9, 4], "a context that is not an extension is sent whole"
    assert wire.hashes.at(4) == prefix_hash([1, 2, 9, 4])


def test_is_context_miss():
    def error(code, metadata):
        return aio.AioRpcError(code, aio.Metadata(), aio.Metadata(*metadata), details="x")

    assert is_context_miss(error(grpc.StatusCode.FAILED_PRECONDITION, [(CONTEXT_MISS_METADATA, "shorter")]))
    assert not is_context_miss(error(grpc.StatusCode.FAILED_PRECONDITION, []))
    assert not is_context_miss(error(grpc.StatusCode.UNAVAILABLE, [(CONTEXT_MISS_METADATA, "shorter")]))


def test_a_next_round_held_ahead_is_found_held_and_any_other_request_is_served_as_before():
    """hold_next (the target's next-round preparation): the store extends a context of exactly n tokens by the
    tokens a round emitted; the request continuing position n with them finds them held (the same list, hashes made
    ahead, no id checks, a hit); a request that differs truncates and extends as before."""
    store = ContextStore(max_tokens=100, width=WIDTH)
    first = resolve(store, "s", [1, 2, 3, 4], 0, None)
    assert not store.hold_next("s", 3, [7]) and not store.hold_next("other", 4, [7])  # not exactly n held
    assert store.hold_next("s", 4, [5, 6]) and first == [1, 2, 3, 4]  # never mutated
    assert store.held_tokens() == 6
    held = store._held["s"]
    context, hashes = store.resolve("s", [5, 6], 4, prefix_hash(first))
    assert context is held.tokens and context == [1, 2, 3, 4, 5, 6] and held.ready is None
    assert len(hashes) == 6 and hashes.at(6) == prefix_hash(context)
    hashes.extend([8, 9])  # the caller's own copy: the store's are untouched
    assert store._held["s"].hashes.at(6) == prefix_hash(context) and len(store._held["s"].hashes) == 6
    assert store.counters.hits == 1 and store.counters.misses == 0
    again, _ = store.resolve("s", [5, 6], 4, prefix_hash(first))  # sent again: still held
    assert again == context and store.counters.hits == 2
    # A different continuation (another round's tokens) after a next round held ahead: truncated and extended.
    assert store.hold_next("s", 6, [10])
    assert resolve(store, "s", [11, 12], 6, prefix_hash(context)) == [1, 2, 3, 4, 5, 6, 11, 12]
    with pytest.raises(InvalidArgument):  # ids not held are checked as before
        store.resolve("s", [WIDTH], 8, prefix_hash([1, 2, 3, 4, 5, 6, 11, 12]))
