"""Rendezvous routing, spill-over and the replica set (no gRPC, no network)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from specdec.routing import (
    DnsTarget,
    NoReplicaAvailableError,
    ReplicaSet,
    RoutingConfig,
    dns_resolver,
    make_resolver,
    parse_addresses,
    pick_replica,
    rendezvous_rank,
)

SESSIONS = [f"session-{i}" for i in range(10_000)]
FOUR = [f"10.0.0.{i}:50051" for i in range(1, 5)]
FIFTH = "10.0.0.5:50051"
MIN_MOVED_FRACTION, MAX_MOVED_FRACTION = 0.15, 0.25
UNLIMITED = 1_000_000


def first_choices(replicas: list[str]) -> dict[str, str]:
    """Session -> first choice."""
    return {s: rendezvous_rank(s, replicas)[0] for s in SESSIONS}


def test_rank_is_stable_and_order_independent():
    ranked = rendezvous_rank("abc", FOUR)
    assert sorted(ranked) == sorted(FOUR)
    assert rendezvous_rank("abc", list(reversed(FOUR))) == ranked
    assert rendezvous_rank("abc", FOUR + FOUR) == ranked
    assert rendezvous_rank("abc", []) == []


def test_adding_a_fifth_replica_moves_a_fifth_all_to_it():
    before, after = first_choices(FOUR), first_choices(FOUR + [FIFTH])
    moved = [s for s in SESSIONS if before[s] != after[s]]
    fraction = len(moved) / len(SESSIONS)
    assert MIN_MOVED_FRACTION <= fraction <= MAX_MOVED_FRACTION
    assert all(after[s] == FIFTH for s in moved)


def test_spread_is_roughly_even():
    counts: dict[str, int] = {}
    for replica in first_choices(FOUR).values():
        counts[replica] = counts.get(replica, 0) + 1
    expected = len(SESSIONS) / len(FOUR)
    assert all(abs(c - expected) / expected < 0.1 for c in counts.values())


def test_removing_a_replica_moves_only_its_sessions():
    five = FOUR + [FIFTH]
    before = first_choices(five)
    gone = FOUR[1]
    after = first_choices([r for r in five if r != gone])
    moved = {s for s in SESSIONS if before[s] != after[s]}
    assert moved == {s for s in SESSIONS if before[s] == gone}
    # ...and each lands on its former second choice.
    assert all(after[s] == rendezvous_rank(s, five)[1] for s in moved)


def test_saturated_first_choice_spills_to_next():
    ranked = rendezvous_rank("s1", FOUR)
    limit = 2
    assert pick_replica("s1", FOUR, {}, limit, set()) == ranked[0]
    assert pick_replica("s1", FOUR, {ranked[0]: limit}, limit, set()) == ranked[1]
    full = {r: limit for r in ranked[:3]}
    assert pick_replica("s1", FOUR, full, limit, set()) == ranked[3]
    assert pick_replica("s1", FOUR, {r: limit for r in FOUR}, limit, set()) is None


def test_unhealthy_is_skipped():
    ranked = rendezvous_rank("s2", FOUR)
    assert pick_replica("s2", FOUR, {}, UNLIMITED, {ranked[0]}) == ranked[1]
    assert pick_replica("s2", FOUR, {}, UNLIMITED, set(FOUR)) is None
    assert pick_replica("s2", [], {}, UNLIMITED, set()) is None
    with pytest.raises(ValueError):
        pick_replica("s2", FOUR, {}, 0, set())


def test_parse_addresses():
    assert parse_addresses(" a:1, b:2 ,a:1,, ") == ["a:1", "b:2"]
    assert parse_addresses("[::1]:50051") == ["[::1]:50051"]
    assert parse_addresses("dns:///draft-headless.specdec.svc.cluster.local:50051") == DnsTarget(
        "draft-headless.specdec.svc.cluster.local", 50051
    )
    assert parse_addresses("dns:draft:50051") == DnsTarget("draft", 50051)
    assert parse_addresses("dns://8.8.8.8/draft:50051") == DnsTarget("draft", 50051)
    for bad in ("", "draft", "dns:///draft", "a:1,b", "a:x"):
        with pytest.raises(ValueError):
            parse_addresses(bad)


def test_routing_config_rejects_nonsense():
    with pytest.raises(ValueError):
        RoutingConfig(max_in_flight_per_replica=0)
    with pytest.raises(ValueError):
        RoutingConfig(refresh_seconds=0)


def test_dns_resolver_sorted_unique_with_injected_getaddrinfo():
    def fake(host, port, family, kind):
        assert (host, port, kind) == ("draft", 50051, socket.SOCK_STREAM)
        return [
            (socket.AF_INET, kind, 6, "", ("10.0.0.2", port)),
            (socket.AF_INET, kind, 6, "", ("10.0.0.1", port)),
            (socket.AF_INET, kind, 6, "", ("10.0.0.2", port)),
            (socket.AF_INET6, kind, 6, "", ("fd00::1", port, 0, 0)),
        ]

    got = asyncio.run(dns_resolver("draft", 50051, getaddrinfo=fake))
    assert got == ["10.0.0.1:50051", "10.0.0.2:50051", "[fd00::1]:50051"]


def test_dns_resolver_localhost_for_real():
    got = asyncio.run(dns_resolver("localhost", 50051))
    assert "127.0.0.1:50051" in got or "[::1]:50051" in got


class ChangingPods:
    """A stub resolver whose answer the test changes; can be made to fail."""

    def __init__(self, pods: list[str]) -> None:
        self.pods = list(pods)
        self.fail = False

    async def __call__(self) -> list[str]:
        if self.fail:
            raise socket.gaierror("NXDOMAIN")
        return list(self.pods)


def test_replica_set_follows_appearing_and_disappearing_pods():
    async def scenario():
        pods = ChangingPods(FOUR)
        rs = ReplicaSet(pods, RoutingConfig(max_in_flight_per_replica=1))
        first = await rs.refresh()
        assert first.added == frozenset(FOUR) and rs.replicas == tuple(sorted(FOUR))
        pods.pods.append(FIFTH)
        assert (await rs.refresh()).added == {FIFTH}
        moved_to_fifth = [s for s in SESSIONS[:500] if rs.pick(s) == FIFTH]
        assert moved_to_fifth
        rs.mark_unhealthy(FOUR[0])
        pods.pods.remove(FOUR[0])
        result = await rs.refresh()
        assert result.removed == {FOUR[0]} and FOUR[0] not in rs.unhealthy
        assert all(rs.pick(s) != FOUR[0] for s in SESSIONS[:500])
        pods.fail = True
        failed = await rs.refresh()
        assert failed.error and len(rs.replicas) == len(FOUR)  # last good list kept
        pods.fail, pods.pods = False, []
        await rs.refresh()
        assert rs.replicas == () and rs.pick("s") is None

    asyncio.run(scenario())


def test_replica_set_health_and_in_flight():
    rs = ReplicaSet(lambda: list(FOUR), RoutingConfig(max_in_flight_per_replica=1))
    asyncio.run(rs.refresh())
    ranked = rendezvous_rank("s3", FOUR)
    rs.mark_unhealthy(ranked[0])
    rs.mark_unhealthy("not-a-member:1")
    assert rs.unhealthy == {ranked[0]} and rs.pick("s3") == ranked[1]
    with rs.lease("s3") as held:
        assert held == ranked[1] and rs.in_flight(held) == 1
        assert rs.pick("s3") == ranked[2]  # saturated: spill
    assert rs.in_flight(ranked[1]) == 0
    rs.release(ranked[1])  # extra release is harmless
    assert rs.in_flight(ranked[1]) == 0
    rs.mark_healthy(ranked[0])
    assert rs.pick("s3") == ranked[0]
    for replica in FOUR:
        rs.mark_unhealthy(replica)
    with pytest.raises(NoReplicaAvailableError), rs.lease("s3"):
        pass


def test_a_replica_sets_remembered_preference_orders_pick_what_the_pure_rule_picks(monkeypatch):
    import specdec.routing as routing

    monkeypatch.setattr(routing, "RANK_MEMO_SESSIONS", 3)
    rs = ReplicaSet(lambda: list(FOUR), RoutingConfig(max_in_flight_per_replica=1))
    rs.set_replicas(FOUR)
    hashed = []
    real = routing.rendezvous_rank
    monkeypatch.setattr(routing, "rendezvous_rank", lambda s, r: hashed.append(s) or real(s, r))

    def pure(session):  # pick_replica's rule, unrecorded
        return routing.first_available(
            real(session, rs.replicas), {r: rs.in_flight(r) for r in rs.replicas}, 1, rs.unhealthy
        )

    for session in ["a", "b", "a", "c", "a"]:
        assert rs.pick(session) == pure(session)
    assert hashed == ["a", "b", "c"]  # a session's order is hashed once, then remembered
    rs.mark_unhealthy(rs.pick("a"))
    rs.acquire(rs.pick("b"))
    assert [rs.pick(s) for s in "abc"] == [pure(s) for s in "abc"] and hashed == ["a", "b", "c"]
    rs.set_replicas(FOUR[:3])  # a new list: every order is worked out again
    assert [rs.pick(s) for s in "abc"] == [pure(s) for s in "abc"] and hashed == ["a", "b", "c"] * 2
    rs.pick("d")  # a fourth session: the least recently used goes
    rs.pick("a")
    assert hashed[-2:] == ["d", "a"]


def test_make_resolver_static_and_dns():
    static = make_resolver("b:2,a:1")
    assert static() == ["b:2", "a:1"]
    rs = ReplicaSet(make_resolver("dns:///localhost:50051"))
    asyncio.run(rs.refresh())
    assert rs.replicas and all(r.endswith(":50051") for r in rs.replicas)


def test_refresh_forever_stops():
    async def scenario():
        calls = []

        def resolve():
            calls.append(1)
            return list(FOUR)

        rs = ReplicaSet(resolve, RoutingConfig(refresh_seconds=0.01))
        stop = asyncio.Event()
        task = asyncio.create_task(rs.refresh_forever(stop))
        await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(task, timeout=1)
        return len(calls)

    assert asyncio.run(scenario()) >= 2
