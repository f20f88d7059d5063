"""SessionStore against a real redis-server (EmbeddedRedis): no fakes, no mocks."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from array import array
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from orchestrator.lease import store_errors
from orchestrator.session_store import SessionStore, open_redis
from orchestrator.session_types import (
    ID_BYTES,
    LeaseLost,
    RequestReused,
    SessionBusy,
    SessionExists,
    SessionNotFound,
    StoreUnavailable,
    VersionConflict,
    Written,
    encode_ids,
)
from orchestrator.store_health import StoreProbe
from specdec.errors import Aborted
from specdec.redis_server import EmbeddedRedis
from tests.redis_proxy import LossyProxy

pytestmark = pytest.mark.integration

TTL_S = 3600
LEASE_S = 30.0
SHORT_LEASE_S = 0.2
LEASE_EXPIRY_WAIT_S = 0.4
WRITES_PER_WRITER = 25
CHUNK = 3
UNAVAILABLE_BOUND_S = 5.0
PARAMS = {"max_tokens": 64, "temperature": 0.0, "stop": ["\n"]}

StoreFn = Callable[[SessionStore, aioredis.Redis], Awaitable[Any]]


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedRedis]:
    """One non-persistent redis-server shared by the module's tests."""
    with EmbeddedRedis() as srv:
        yield srv


def _sid() -> str:
    return f"s-{uuid.uuid4().hex[:12]}"


def run_with_store(url: str, fn: StoreFn, **store_kwargs: Any) -> Any:
    """Run ``fn(store, client)`` in a fresh event loop with a fresh client."""

    async def main() -> Any:
        client = open_redis(url)
        try:
            return await fn(SessionStore(client, **store_kwargs), client)
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_create_get_and_binary_layout(server: EmbeddedRedis) -> None:
    sid, ids = _sid(), [1, 2, 49151, 0, 7]

    async def body(store: SessionStore, client: aioredis.Redis) -> None:
        created = await store.create(sid, ids, 5, PARAMS)
        assert (created.ids, created.prompt_tokens, created.turns) == (ids, 5, 1)
        assert (created.version, created.status, created.params) == (1, "idle", PARAMS)
        assert created.created_at == created.updated_at > 0
        got = await store.get(sid)
        assert got == created
        raw = await client.get(store.ids_key(sid))
        assert raw == array("i", ids).tobytes() == encode_ids(ids)
        assert await client.hget(store.key(sid), "ids") is None  # ids live only in their key
        assert store.key(sid).endswith("{" + sid + "}")  # hash tag: both keys in one slot
        assert store.ids_key(sid) == store.key(sid) + ":ids"
        assert len(raw) == ID_BYTES * len(ids)
        with pytest.raises(SessionExists):
            await store.create(sid, [9], 1, {})
        assert await store.get(_sid()) is None

    run_with_store(server.url, body)


def test_append_bumps_version_and_counters(server: EmbeddedRedis) -> None:
    sid = _sid()

    async def body(store: SessionStore, client: aioredis.Redis) -> None:
        await store.create(sid, [1, 2], 2, PARAMS)
        w = await store.append(sid, 1, [3, 4], {"rounds": 1, "drafted": 4, "accepted": 2}, "o1")
        assert (w.version, w.length, w.lease_until) == (2, 4, 0)
        s = await store.get(sid)
        assert (s.ids, s.version, s.rounds, s.drafted, s.accepted) == ([1, 2, 3, 4], 2, 1, 4, 2)
        w = await store.append(sid, 2, [], {"delivered": 2}, "o1")
        assert (w.version, w.length) == (3, 4)
        s = await store.get(sid)
        assert (s.ids, s.version, s.delivered) == ([1, 2, 3, 4], 3, 2)
        with pytest.raises(VersionConflict) as info:
            await store.append(sid, 2, [5], {}, "o1")
        assert (info.value.expected, info.value.current) == (2, 3)
        with pytest.raises(ValueError):
            await store.append(sid, 3, [5], {"bogus": 1}, "o1")
        with pytest.raises(SessionNotFound):
            await store.append(_sid(), 1, [5], {}, "o1")
        assert (await store.get(sid)).ids == [1, 2, 3, 4]

    run_with_store(server.url, body)


def test_two_concurrent_writers_same_version_exactly_one_wins(server: EmbeddedRedis) -> None:
    sid = _sid()

    async def body(store: SessionStore, client: aioredis.Redis) -> None:
        other = SessionStore(open_redis(server.url))
        await store.create(sid, [], 0, {})
        try:
            for version in range(1, WRITES_PER_WRITER + 1):
                results = await asyncio.gather(
                    store.append(sid, version, [1] * CHUNK, {"rounds": 1}, "o"),
                    other.append(sid, version, [2] * CHUNK, {"rounds": 1}, "o"),
                    return_exceptions=True,
                )
                wins = [r for r in results if not isinstance(r, Exception)]
                assert len(wins) == 1 and wins[0].version == version + 1
                assert sum(isinstance(r, VersionConflict) for r in results) == 1
        finally:
            await other._redis.aclose()
        final = await store.get(sid)
        assert len(final.ids) == CHUNK * WRITES_PER_WRITER == CHUNK * final.rounds

    run_with_store(server.url, body)


async def _writer(store: SessionStore, sid: str, token: int, writes: int) -> int:
    """Append ``writes`` chunks of ``token``, retrying on version conflicts; return conflicts."""
    conflicts, done = 0, 0
    while done < writes:
        current = await store.get(sid)
        try:
            await store.append(sid, current.version, [token] * CHUNK, {"rounds": 1}, "o")
            done += 1
        except VersionConflict:
            conflicts += 1
        await asyncio.sleep(0)
    return conflicts


def test_concurrent_writers_never_interleave_tokens(server: EmbeddedRedis) -> None:
    sid = _sid()

    async def body(store: SessionStore, client: aioredis.Redis) -> None:
        stores = [store, SessionStore(open_redis(server.url))]
        await store.create(sid, [], 0, {})
        try:
            conflicts = await asyncio.gather(
                *(_writer(s, sid, token, WRITES_PER_WRITER) for token, s in enumerate(stores, 1))
            )
        finally:
            await stores[1]._redis.aclose()
        final = await store.get(sid)
        assert final.version == 1 + 2 * WRITES_PER_WRITER
        assert len(final.ids) == 2 * CHUNK * WRITES_PER_WRITER
        blocks = [final.ids[i : i + CHUNK] for i in range(0, len(final.ids), CHUNK)]
        assert all(len(set(b)) == 1 for b in blocks), "tokens of two writers interleaved"
        assert sum(conflicts) > 0, "writers never raced; test is not exercising concurrency"

    run_with_store(server.url, body)


def test_zombie_owner_cannot_append_after_takeover(server: EmbeddedRedis) -> None:
    sid = _sid()

    async def body(store: SessionStore, client: aioredis.Redis) -> None:
        s, resumed = await store.begin_request(
            sid, "req-1", "zombie", SHORT_LEASE_S, [10, 11], PARAMS, create_missing=True
        )
        assert not resumed and s.owner == "zombie" and s.status == "generating"
        s = await store.append(sid, s.version, [12], {}, "zombie")
        assert s.length == 3 and s.lease_until > time.time()
        with pytest.raises(LeaseLost):
            await store.append(sid, s.version, [99], {}, "other")
        with pytest.raises(SessionBusy):
            await store.begin_request(sid, "req-1", "other", LEASE_S, [10, 11], PARAMS)
        await asyncio.sleep(LEASE_EXPIRY_WAIT_S)  # the zombie stalls; its lease expires
        taken, resumed = await store.begin_request(sid, "req-1", "other", LEASE_S, [10, 11], {})
        assert resumed and taken.owner == "other" and taken.ids == [10, 11, 12]
        for version in (s.version, taken.version):
            with pytest.raises(LeaseLost):
                await store.append(sid, version, [66], {}, "zombie")
        with pytest.raises(LeaseLost):
            await store.finish_request(sid, "zombie", "stop", taken.version)
        with pytest.raises(LeaseLost):
            await store.renew_lease(sid, "zombie", LEASE_S)
        w = await store.append(sid, taken.version, [13], {}, "other")
        s = await store.get(sid)
        assert s.ids == [10, 11, 12, 13] and s.completion_ids == [12, 13]
        assert (w.version, w.length, w.lease_until) == (s.version, 4, s.lease_until)

    run_with_store(server.url, body)


def test_begin_request_retry_resumes_and_appends_turn_once(server: EmbeddedRedis) -> None:
    sid = _sid()

    async def body(store: SessionStore, client: aioredis.Redis) -> None:
        await store.create(sid, [], 0, {})
        first, resumed = await store.begin_request(sid, "r1", "o1", LEASE_S, [1, 2, 3], PARAMS)
        assert not resumed and (first.turns, first.request_base_len, first.prompt_tokens) == (1, 0, 3)
        again, resumed = await store.begin_request(sid, "r1", "o1", LEASE_S, [1, 2, 3], PARAMS)
        assert resumed and again.ids == [1, 2, 3] and again.turns == 1
        s = await store.append(sid, again.version, [4, 5], {"delivered": 2}, "o1")
        with pytest.raises(SessionBusy):
            await store.begin_request(sid, "r2", "o1", LEASE_S, [6], PARAMS)
        assert first.last_text_chars == -1  # not known until the request finishes
        done = await store.finish_request(sid, "o1", "stop", s.version, text_chars=0)
        assert (done.status, done.owner, done.last_finish_reason, done.last_text_chars) == ("idle", "", "stop", 0)
        retry, resumed = await store.begin_request(sid, "r1", "o2", LEASE_S, [1, 2, 3], PARAMS)
        assert resumed and retry.status == "idle" and retry.completion_ids == [4, 5] and retry.last_text_chars == 0
        second, resumed = await store.begin_request(sid, "r2", "o2", LEASE_S, [6, 7], {"n": 1})
        assert not resumed and second.ids == [1, 2, 3, 4, 5, 6, 7] and second.last_text_chars == -1
        assert (second.turns, second.request_base_len, second.prompt_tokens) == (2, 5, 2)
        assert (second.delivered, second.params, second.completion_ids) == (0, {"n": 1}, [])
        with pytest.raises(SessionNotFound):
            await store.begin_request(_sid(), "r1", "o1", LEASE_S, [1], {})

    run_with_store(server.url, body)


def test_renew_lease_extends_without_version_bump(server: EmbeddedRedis) -> None:
    sid = _sid()

    async def body(store: SessionStore, client: aioredis.Redis) -> None:
        s, _ = await store.begin_request(sid, "r", "o1", SHORT_LEASE_S, [1], {}, create_missing=True)
        until = await store.renew_lease(sid, "o1", LEASE_S)
        assert until > time.time() + LEASE_S / 2
        renewed = await store.get(sid)
        assert renewed.version == s.version and renewed.lease_until == until
        await asyncio.sleep(LEASE_EXPIRY_WAIT_S)
        assert (await store.append(sid, s.version, [2], {}, "o1")).length == 2
        assert (await store.get(sid)).ids == [1, 2]
        with pytest.raises(LeaseLost):
            await store.renew_lease(sid, "o2", LEASE_S)
        with pytest.raises(SessionNotFound):
            await store.renew_lease(_sid(), "o1", LEASE_S)

    run_with_store(server.url, body)


def test_ttl_set_and_refreshed_on_write(server: EmbeddedRedis) -> None:
    sid, short = _sid(), 10

    async def body(store: SessionStore, client: aioredis.Redis) -> None:
        s = await store.create(sid, [1], 1, {})
        for key in store.keys(sid):
            assert TTL_S - 5 <= await client.ttl(key) <= TTL_S
            await client.expire(key, short)
        await store.append(sid, s.version, [2], {}, "o")
        for key in store.keys(sid):
            assert await client.ttl(key) > short

    run_with_store(server.url, body, ttl_seconds=TTL_S)


def test_truncate_delete_memory_and_prefix(server: EmbeddedRedis) -> None:
    sid, prefix = _sid(), "acl-test:"

    async def body(store: SessionStore, client: aioredis.Redis) -> None:
        s = await store.create(sid, list(range(100)), 10, {})
        assert store.key(sid).startswith(prefix)
        found = sorted([k async for k in client.scan_iter(match=f"{prefix}*")])
        assert found == sorted(k.encode() for k in store.keys(sid))
        hash_only = await client.memory_usage(store.key(sid), samples=0)
        assert await store.memory_bytes(sid) >= hash_only + ID_BYTES * 100
        w = await store.truncate(sid, s.version, 40, "o")
        assert (w.version, w.length) == (2, 40) and (await store.get(sid)).ids == list(range(40))
        with pytest.raises(ValueError):
            await store.truncate(sid, w.version, 41, "o")
        with pytest.raises(VersionConflict):
            await store.truncate(sid, 1, 10, "o")
        assert (await store.truncate(sid, w.version, 40, "o")).length == 40  # same length: ok
        w = await store.truncate(sid, w.version + 1, 0, "o")
        assert (w.version, w.length) == (4, 0) and (await store.get(sid)).ids == []
        assert await client.exists(*store.keys(sid)) == 2  # an empty ids key still exists
        assert await store.delete(sid) is True
        assert await client.exists(*store.keys(sid)) == 0
        assert await store.delete(sid) is False
        assert await store.get(sid) is None and await store.memory_bytes(sid) is None

    run_with_store(server.url, body, prefix=prefix)


def test_decode_responses_client_is_rejected(server: EmbeddedRedis) -> None:
    client = aioredis.Redis.from_url(server.url, decode_responses=True)
    with pytest.raises(ValueError, match="decode_responses"):
        SessionStore(client)


def test_redis_down_raises_store_unavailable_then_recovers() -> None:
    with EmbeddedRedis() as srv:

        async def body(store: SessionStore, client: aioredis.Redis) -> None:
            await store.create("before", [1], 1, {})
            srv.stop()
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="Redis unavailable") as info:
                await store.get("before")
            assert time.monotonic() - started < UNAVAILABLE_BOUND_S
            assert info.value.__cause__ is None and info.value.__suppress_context__
            with pytest.raises(StoreUnavailable):
                await store.append("before", 1, [2], {}, "o")
            srv.start()
            assert await store.get("before") is None  # no persistence: data is gone
            assert (await store.create("after", [3], 1, {})).ids == [3]

        run_with_store(srv.url, body)


def test_session_survives_restart_with_appendonly(tmp_path: Path) -> None:
    sid = _sid()
    with EmbeddedRedis(data_dir=tmp_path / "data") as srv:

        async def write(store: SessionStore, client: aioredis.Redis) -> Any:
            s = await store.create(sid, [1, 2, 3], 3, PARAMS)
            await store.append(sid, s.version, [4], {"rounds": 1}, "o")
            return await store.get(sid)

        async def read(store: SessionStore, client: aioredis.Redis) -> Any:
            return await store.get(sid)

        before = run_with_store(srv.url, write)
        port = srv.port
        srv.restart()
        assert srv.port == port
        after = run_with_store(srv.url, read)
        assert after == before and after.ids == [1, 2, 3, 4]


def test_embedded_redis_with_password(tmp_path: Path) -> None:
    with EmbeddedRedis(password="s3cr:t/@x") as srv:
        assert "@127.0.0.1:" in srv.url
        sid = _sid()

        async def body(store: SessionStore, client: aioredis.Redis) -> Any:
            return await store.create(sid, [5], 1, {})

        assert run_with_store(srv.url, body).ids == [5]


def test_append_reply_does_not_grow_with_session_length(server: EmbeddedRedis) -> None:
    """The per-round write answers O(1) bytes: Written only, no ids, same size at any length."""
    sid, round_ids = _sid(), list(range(100, 108))

    async def net_out(client: aioredis.Redis) -> int:
        return int((await client.info("stats"))["total_net_output_bytes"])

    async def append_cost(store: SessionStore, client: aioredis.Redis, version: int) -> tuple[int, Any]:
        """Bytes Redis sent for one append (INFO replies before/after are of near-equal size)."""
        before = await net_out(client)
        written = await store.append(sid, version, round_ids, {"rounds": 1}, "o")
        between = await net_out(client)
        after = await net_out(client)
        return (between - before) - (after - between), written  # minus one INFO reply

    async def raw_reply(store: SessionStore, version: int) -> list[Any]:
        return await store._script(
            "append", sid, version, "o", encode_ids(round_ids), store.ttl_seconds, uuid.uuid4().hex, "rounds", 1
        )

    async def body(store: SessionStore, client: aioredis.Redis) -> None:
        s = await store.create(sid, [1, 2], 2, {})
        warm = await store.append(sid, s.version, round_ids, {}, "o")  # loads the script (NOSCRIPT)
        small_cost, w = await append_cost(store, client, warm.version)
        assert isinstance(w, Written) and not hasattr(w, "ids")
        small_raw = await raw_reply(store, w.version)
        version = w.version + 1
        big = 20_000
        await client.append(store.ids_key(sid), encode_ids([7] * big))  # a long session
        big_cost, w = await append_cost(store, client, version)
        big_raw = await raw_reply(store, w.version)
        assert w.length == 2 + 4 * len(round_ids) + big
        assert len(big_raw) == len(small_raw) == 4 and big_raw[0] == small_raw[0] == b"OK"
        assert all(isinstance(x, int) for x in big_raw[1:])  # version, length, lease: no blob
        assert abs(big_cost - small_cost) < 64, (small_cost, big_cost)
        assert big_cost < 256 < ID_BYTES * big
        assert (await store.get(sid)).ids[-len(round_ids) :] == round_ids

    run_with_store(server.url, body)


def test_ids_key_and_hash_expire_together(server: EmbeddedRedis) -> None:
    sid, ttl = _sid(), 1

    async def body(store: SessionStore, client: aioredis.Redis) -> None:
        s, _ = await store.begin_request(sid, "r", "o", LEASE_S, [1, 2], {}, create_missing=True)
        hash_key, ids_key = store.keys(sid)
        await client.persist(hash_key)
        await client.persist(ids_key)
        w = await store.append(sid, s.version, [3], {}, "o")  # refreshes both
        assert 0 < await client.pttl(hash_key) <= ttl * 1000
        assert 0 < await client.pttl(ids_key) <= ttl * 1000
        await client.expire(hash_key, 60)
        await client.expire(ids_key, 60)
        await store.renew_lease(sid, "o", LEASE_S)  # renew refreshes both too
        assert 0 < await client.pttl(hash_key) <= ttl * 1000
        assert 0 < await client.pttl(ids_key) <= ttl * 1000
        assert w.length == 3
        await asyncio.sleep(ttl + 0.5)
        assert await client.exists(hash_key, ids_key) == 0
        assert await store.get(sid) is None

    run_with_store(server.url, body, ttl_seconds=ttl)


def test_lone_key_is_not_a_session(server: EmbeddedRedis) -> None:
    """If one key vanished (e.g. evicted), the session counts as absent, never as empty."""
    sid = _sid()

    async def body(store: SessionStore, client: aioredis.Redis) -> None:
        s = await store.create(sid, [1, 2, 3], 3, {})
        await client.delete(store.ids_key(sid))
        assert await store.get(sid) is None
        with pytest.raises(SessionNotFound):
            await store.append(sid, s.version, [4], {}, "o")
        with pytest.raises(SessionNotFound):
            await store.truncate(sid, s.version, 1, "o")
        with pytest.raises(SessionNotFound):
            await store.begin_request(sid, "r", "o", LEASE_S, [4], {})
        again = await store.create(sid, [9], 1, {})  # replaces the remnant
        assert (again.ids, again.version, again.rounds) == ([9], 1, 0)
        assert await store.memory_bytes(sid) > 0
        await client.delete(store.key(sid))
        assert await store.get(sid) is None and await store.memory_bytes(sid) is None
        fresh, resumed = await store.begin_request(sid, "r", "o", LEASE_S, [5], {}, create_missing=True)
        assert not resumed and fresh.ids == [5] and fresh.turns == 1

    run_with_store(server.url, body)


def test_begin_request_refuses_a_reused_request_id_atomically(server: EmbeddedRedis) -> None:
    """The fingerprint is stored with the request; the same request_id with another fingerprint is
    RequestReused and changes nothing, running or finished; "" (old callers, old sessions) is not checked."""
    sid = _sid()

    async def body(store: SessionStore, client: aioredis.Redis) -> None:
        first, _ = await store.begin_request(
            sid, "r1", "o1", LEASE_S, [1, 2], PARAMS, create_missing=True, fingerprint="f1"
        )
        assert first.fingerprint == "f1"
        for owner in ("o1", "o2"):  # running: refused before the lease or busy checks
            with pytest.raises(RequestReused):
                await store.begin_request(sid, "r1", owner, LEASE_S, [9], PARAMS, fingerprint="f2")
        same, resumed = await store.begin_request(sid, "r1", "o1", LEASE_S, [1, 2], PARAMS, fingerprint="f1")
        assert resumed
        done = await store.finish_request(sid, "o1", "length", same.version)
        with pytest.raises(RequestReused):
            await store.begin_request(sid, "r1", "o2", LEASE_S, [9], PARAMS, fingerprint="f2")
        after = await store.get(sid)
        assert (after.version, after.ids, after.turns, after.owner) == (done.version, [1, 2], 1, "")
        retry, resumed = await store.begin_request(sid, "r1", "o2", LEASE_S, [1, 2], PARAMS, fingerprint="f1")
        assert resumed and retry.status == "idle"
        unchecked, resumed = await store.begin_request(sid, "r1", "o2", LEASE_S, [1, 2], PARAMS)
        assert resumed
        second, resumed = await store.begin_request(sid, "r2", "o2", LEASE_S, [3], PARAMS, fingerprint="f2")
        assert not resumed and second.fingerprint == "f2" and second.turns == 2

    run_with_store(server.url, body)


def test_a_request_key_names_the_session_it_was_first_claimed_for(server: EmbeddedRedis) -> None:
    """claim_request_key: the first claim wins (also among racing claims), the key lives for the TTL."""
    rid = f"r-{uuid.uuid4().hex[:8]}"

    async def body(store: SessionStore, client: aioredis.Redis) -> None:
        claims = await asyncio.gather(*(store.claim_request_key(rid, f"s{i}") for i in range(8)))
        assert len(set(claims)) == 1 and claims[0] in {f"s{i}" for i in range(8)}
        assert await store.claim_request_key(rid, "later") == claims[0]
        assert 0 < await client.ttl(store.request_key(rid)) <= TTL_S
        assert await store.claim_request_key(rid + "-other", "fresh") == "fresh"

    run_with_store(server.url, body, ttl_seconds=TTL_S)


# -- idempotent writes: a resent write that Redis already applied ---------------------------------


def test_replayed_writes_succeed_once_and_a_conflicting_writer_is_aborted(server: EmbeddedRedis) -> None:
    """The same write run twice (as a retry would run it) succeeds both times and is applied once; another
    writer at the same expected version still conflicts (ABORTED at the gRPC edge)."""
    sid = _sid()

    async def body(store: SessionStore, client: aioredis.Redis) -> None:
        created = await store.create(sid, [1, 2], 2, PARAMS, write_id="c1")
        assert (await store.create(sid, [1, 2], 2, PARAMS, write_id="c1")) == created  # replayed create
        begun, _ = await store.begin_request(sid, "r1", "o1", LEASE_S, [3], PARAMS)
        counters = {"rounds": 1, "drafted": 4, "accepted": 2, "delivered": 3}
        first = await store.append(sid, begun.version, [4, 5, 6], counters, "o1", write_id="w1")
        replay = await store.append(sid, begun.version, [4, 5, 6], counters, "o1", write_id="w1")
        assert replay == first and first.version == begun.version + 1
        s = await store.get(sid)
        assert (s.ids, s.rounds, s.drafted, s.accepted, s.delivered) == ([1, 2, 3, 4, 5, 6], 1, 4, 2, 3)
        with pytest.raises(VersionConflict, match=f"expected version {begun.version}, found {first.version}"):
            await store.append(sid, begun.version, [9], {"rounds": 1}, "o1", write_id="w2")  # another writer
        with pytest.raises(Aborted, match="expected version"), store_errors():
            await store.append(sid, begun.version, [9], {"rounds": 1}, "o1")
        cut = await store.truncate(sid, first.version, 5, "o1", write_id="t1")
        assert await store.truncate(sid, first.version, 5, "o1", write_id="t1") == cut
        done = await store.finish_request(sid, "o1", "stop", cut.version, write_id="f1")
        assert await store.finish_request(sid, "o1", "stop", cut.version, write_id="f1") == done
        assert (done.ids, done.rounds, done.status) == ([1, 2, 3, 4, 5], 1, "idle")
        with pytest.raises(VersionConflict):  # the write id matches, but the session moved on since
            await store.append(sid, begun.version, [4, 5, 6], counters, "o1", write_id="w1")
        assert (await store.get(sid)).ids == [1, 2, 3, 4, 5]

    run_with_store(server.url, body)


def test_append_whose_reply_was_lost_is_not_applied_twice(server: EmbeddedRedis) -> None:
    """Redis applies the append, the reply is lost (connection dropped by a proxy), redis-py's Retry
    resends the script on a new connection: the generation's write succeeds, tokens appear once."""
    sid = _sid()
    marker = [7_000_001, 7_000_002]

    async def main() -> None:
        proxy = await LossyProxy(server.port).start()
        client = open_redis(proxy.url)
        store = SessionStore(client)
        try:
            s, _ = await store.begin_request(sid, "r1", "o1", LEASE_S, [1, 2], PARAMS, create_missing=True)
            w = await store.append(sid, s.version, [3], {"rounds": 1}, "o1")  # the script is loaded now
            proxy.lose_reply_to(encode_ids(marker))
            lost = await store.append(sid, w.version, marker, {"rounds": 1, "delivered": 2}, "o1")
            assert proxy.lost == 1, "the proxy did not drop the reply: the test exercised nothing"
            assert (lost.version, lost.length) == (w.version + 1, 5)
            got = await store.get(sid)
            assert (got.ids, got.rounds, got.delivered, got.version) == ([1, 2, 3, *marker], 2, 2, lost.version)
        finally:
            await client.aclose()
            await proxy.close()

    asyncio.run(main())


# -- the health probe (orchestrator/store_health.py) -----------------------------------------------

PING_TIMEOUT_S = 0.5


def test_store_probe_reports_down_hung_and_refused_redis(tmp_path: Path) -> None:
    """'' while Redis answers; a clear problem, within the ping's deadline, while it is stopped, hung
    (SIGSTOP: accepts nothing, answers nothing) or refuses the password; '' again once it is back, and
    at once after a restart between two checks (the pooled connection Redis closed is not a failure)."""
    with EmbeddedRedis(password="right-password") as srv:
        wrong = srv.url.replace("right-password", "wrong-password")

        async def main() -> list[tuple[str, float]]:
            probe, refused = StoreProbe(srv.url, PING_TIMEOUT_S), StoreProbe(wrong, PING_TIMEOUT_S)
            seen = []

            async def timed(p: StoreProbe) -> None:
                start = time.monotonic()
                seen.append((await p.check(), time.monotonic() - start))

            try:
                await timed(probe)
                await timed(refused)
                os.kill(srv._proc.pid, signal.SIGSTOP)
                try:
                    await timed(probe)
                finally:
                    os.kill(srv._proc.pid, signal.SIGCONT)
                srv.stop()
                await timed(probe)
                srv.start()
                await timed(probe)
                srv.restart()
                await timed(probe)
            finally:
                await probe.close()
                await refused.close()
            return seen

        (ok, _), (auth, _), (hung, hung_s), (down, down_s), (back, _), (restarted, _) = asyncio.run(main())
    assert ok == back == restarted == ""
    assert auth.startswith("session store (Redis) refused this orchestrator's credentials:"), auth
    assert "Timeout" in hung and hung_s < 2 * PING_TIMEOUT_S + 0.5, (hung, hung_s)
    assert down.startswith("session store (Redis) unavailable: ConnectionError") and down_s < 2 * PING_TIMEOUT_S
