"""Replica routing for the orchestrator: pure functions plus a small replica set.

Sessions are sticky: a draft or target replica keeps the KV cache of the
sessions it served, so the next round of a session should go to the same
replica.  Rendezvous (highest-random-weight) hashing gives every session a
stable preference order over the replicas; when a replica is added only the
sessions whose new first choice is that replica move (about 1/n of them), and
when a replica goes away only its own sessions move.

Nothing here speaks gRPC.  Discovery is an injected resolver function:
a static list, or DNS (`dns:///draft-headless.specdec.svc.cluster.local:50051`
in Kubernetes, `dns:///draft:50051` under docker compose), which returns the
address of every ready pod / container behind the name.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import logging
import socket
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

HASH_DIGEST_BYTES = 8
"""blake2b digest size for rendezvous scores: 64 bits, ample against ties."""

HASH_KEY_SEPARATOR = "|"
DNS_SCHEME = "dns:"
DEFAULT_MAX_IN_FLIGHT_PER_REPLICA = 64
DEFAULT_REFRESH_SECONDS = 5.0
#: sessions whose replica preference order a ReplicaSet remembers (its list unchanged): a round's pick hashes nothing.
RANK_MEMO_SESSIONS = 4096

Resolver = Callable[[], Awaitable[list[str]]] | Callable[[], list[str]]


@dataclass(frozen=True)
class RoutingConfig:
    """How the orchestrator spreads sessions over replicas.

    max_in_flight_per_replica: rounds a replica may have outstanding before new
        rounds spill to the session's next choice.
    refresh_seconds: how often the replica list is re-resolved.
    """

    max_in_flight_per_replica: int = DEFAULT_MAX_IN_FLIGHT_PER_REPLICA
    refresh_seconds: float = DEFAULT_REFRESH_SECONDS

    def __post_init__(self) -> None:
        """Reject limits that would make routing impossible."""
        if self.max_in_flight_per_replica < 1:
            raise ValueError("max_in_flight_per_replica must be >= 1")
        if self.refresh_seconds <= 0:
            raise ValueError("refresh_seconds must be > 0")


def rendezvous_score(session_id: str, replica: str) -> int:
    """Stable 64-bit weight of `replica` for `session_id` (same in every process)."""
    key = f"{replica}{HASH_KEY_SEPARATOR}{session_id}".encode()
    digest = hashlib.blake2b(key, digest_size=HASH_DIGEST_BYTES).digest()
    return int.from_bytes(digest, "big")


def rendezvous_rank(session_id: str, replicas: Sequence[str]) -> list[str]:
    """Replicas in the session's preference order, best first (duplicates dropped).

    Ties (astronomically unlikely with 64 bits) are broken by address so the
    order never depends on the order of `replicas`.
    """
    unique = set(replicas)
    return sorted(unique, key=lambda r: (-rendezvous_score(session_id, r), r))


def pick_replica(
    session_id: str,
    replicas: Sequence[str],
    in_flight: Mapping[str, int],
    max_in_flight: int,
    unhealthy: set[str] | frozenset[str],
) -> str | None:
    """The session's first choice that is healthy and not saturated, else None.

    A replica is saturated when its in-flight count has reached `max_in_flight`;
    the round then spills to the session's next choice (losing the warm KV
    cache for that round, which the replica rebuilds from the context).
    """
    if max_in_flight < 1:
        raise ValueError("max_in_flight must be >= 1")
    return first_available(rendezvous_rank(session_id, replicas), in_flight, max_in_flight, unhealthy)


def first_available(
    ranked: Sequence[str], in_flight: Mapping[str, int], max_in_flight: int, unhealthy: set[str] | frozenset[str]
) -> str | None:
    """The first of `ranked` (a session's preference order) that is healthy and not saturated, else None."""
    for replica in ranked:
        if replica in unhealthy:
            continue
        if in_flight.get(replica, 0) >= max_in_flight:
            continue
        return replica
    return None


@dataclass(frozen=True)
class DnsTarget:
    """A `dns:///host:port` target: every address the name resolves to."""

    host: str
    port: int


def _split_host_port(text: str) -> tuple[str, int]:
    """Split `host:port` or `[v6]:port`; ValueError when the port is missing."""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError(f"bad address {text!r}: expected [ipv6]:port")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            raise ValueError(f"bad address {text!r}: expected host:port")
    if not port_text.isdigit():
        raise ValueError(f"bad port in {text!r}")
    return host, int(port_text)


def parse_addresses(text: str) -> list[str] | DnsTarget:
    """Parse SPECDEC_*_ADDRESSES: `h1:p1,h2:p2` (static list) or `dns:[//authority/]host:port`.

    A static list keeps its order with duplicates and blanks removed.
    """
    text = text.strip()
    if not text:
        raise ValueError("empty address list")
    if text.startswith(DNS_SCHEME):
        rest = text[len(DNS_SCHEME) :]
        if rest.startswith("//"):
            _authority, _sep, rest = rest[2:].partition("/")
        host, port = _split_host_port(rest)
        return DnsTarget(host=host, port=port)
    seen: dict[str, None] = {}
    for item in text.split(","):
        item = item.strip()
        if item:
            _split_host_port(item)
            seen.setdefault(item, None)
    return list(seen)


def format_address(ip: str, port: int) -> str:
    """`ip:port`, with brackets around IPv6 literals."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


async def dns_resolver(
    host: str,
    port: int,
    getaddrinfo: Callable[..., list[tuple]] = socket.getaddrinfo,
) -> list[str]:
    """Every `ip:port` that `host` resolves to, sorted and unique.

    getaddrinfo blocks, so it runs in a worker thread.  A headless Service
    (or compose's embedded DNS) answers with one record per ready replica.
    """
    infos = await asyncio.to_thread(getaddrinfo, host, port, 0, socket.SOCK_STREAM)
    return sorted({format_address(info[4][0], port) for info in infos})


def make_resolver(text: str) -> Resolver:
    """A resolver for ReplicaSet from an SPECDEC_*_ADDRESSES value."""
    parsed = parse_addresses(text)
    if isinstance(parsed, DnsTarget):

        async def resolve_dns() -> list[str]:
            """Every ready replica behind the DNS name."""
            return await dns_resolver(parsed.host, parsed.port)

        return resolve_dns
    static = list(parsed)
    return lambda: list(static)


class NoReplicaAvailableError(RuntimeError):
    """Every replica is unhealthy or saturated (or none is known)."""


@dataclass(frozen=True)
class RefreshResult:
    """What one refresh changed; `error` is set when the resolver failed."""

    added: frozenset[str] = frozenset()
    removed: frozenset[str] = frozenset()
    error: str | None = None


@dataclass
class _State:
    """Mutable state of a ReplicaSet."""

    replicas: tuple[str, ...] = ()
    unhealthy: set[str] = field(default_factory=set)
    in_flight: dict[str, int] = field(default_factory=dict)


class ReplicaSet:
    """The discovered replicas of one pool (draft or target) and their load.

    `refresh()` re-resolves; a resolver error keeps the last good list (a DNS
    hiccup must not empty the pool), while an empty answer is taken as is.
    Health marks are set by the caller (health-check watcher or failed RPCs)
    and dropped when the replica disappears.
    """

    def __init__(self, resolve: Resolver, config: RoutingConfig | None = None) -> None:
        """Keep the resolver; nothing is resolved until `refresh()`."""
        self._resolve = resolve
        self.config = config or RoutingConfig()
        self._state = _State()
        self._ranks: OrderedDict[str, tuple[tuple[str, ...], list[str]]] = OrderedDict()  # see rank()

    @property
    def replicas(self) -> tuple[str, ...]:
        """Known replicas, sorted."""
        return self._state.replicas

    @property
    def unhealthy(self) -> frozenset[str]:
        """Known replicas currently marked unhealthy."""
        return frozenset(self._state.unhealthy)

    @property
    def healthy(self) -> tuple[str, ...]:
        """Known replicas not marked unhealthy."""
        return tuple(r for r in self._state.replicas if r not in self._state.unhealthy)

    def in_flight(self, replica: str) -> int:
        """Outstanding rounds on `replica`."""
        return self._state.in_flight.get(replica, 0)

    async def _call_resolver(self) -> list[str]:
        """Call the injected resolver, sync or async."""
        result = self._resolve()
        if inspect.isawaitable(result):
            result = await result
        return list(result)

    async def refresh(self) -> RefreshResult:
        """Re-resolve the pool and apply appearing / disappearing replicas."""
        try:
            found = await self._call_resolver()
        except (OSError, ValueError, RuntimeError, asyncio.TimeoutError) as exc:
            log.warning("replica resolution failed, keeping %d known: %s", len(self._state.replicas), exc)
            return RefreshResult(error=str(exc))
        return self.set_replicas(found)

    def set_replicas(self, replicas: Iterable[str]) -> RefreshResult:
        """Replace the known list; health marks of vanished replicas are dropped."""
        new = set(replicas)
        old = set(self._state.replicas)
        self._state.replicas = tuple(sorted(new))
        self._state.unhealthy &= new
        added, removed = frozenset(new - old), frozenset(old - new)
        if added or removed:
            log.info("replicas changed: +%s -%s", sorted(added), sorted(removed))
        return RefreshResult(added=added, removed=removed)

    def mark_unhealthy(self, replica: str) -> None:
        """Skip `replica` until it is marked healthy again (unknown ones are ignored)."""
        if replica in self._state.replicas:
            self._state.unhealthy.add(replica)

    def mark_healthy(self, replica: str) -> None:
        """Route to `replica` again."""
        self._state.unhealthy.discard(replica)

    def pick(self, session_id: str) -> str | None:
        """Where the next round of `session_id` should go, or None (pick_replica, with the session's preference
        order remembered while the replica list stays the same: a round costs no hashing, at any pool size)."""
        return first_available(
            self.rank(session_id), self._state.in_flight, self.config.max_in_flight_per_replica, self._state.unhealthy
        )

    def rank(self, session_id: str) -> list[str]:
        """rendezvous_rank of the session over the known replicas, remembered for the RANK_MEMO_SESSIONS
        sessions used last."""
        replicas = self._state.replicas
        known = self._ranks.get(session_id)
        if known is not None and known[0] == replicas:
            self._ranks.move_to_end(session_id)
            return known[1]
        ranked = rendezvous_rank(session_id, replicas)
        self._ranks[session_id] = (replicas, ranked)
        if len(self._ranks) > RANK_MEMO_SESSIONS:
            self._ranks.popitem(last=False)
        return ranked

    def acquire(self, replica: str) -> None:
        """Count one more outstanding round on `replica`."""
        self._state.in_flight[replica] = self._state.in_flight.get(replica, 0) + 1

    def release(self, replica: str) -> None:
        """Count one round on `replica` as finished (extra releases are ignored)."""
        remaining = self._state.in_flight.get(replica, 0) - 1
        if remaining > 0:
            self._state.in_flight[replica] = remaining
        else:
            self._state.in_flight.pop(replica, None)

    @contextlib.contextmanager
    def lease(self, session_id: str):
        """Pick and acquire a replica for one round; released on exit.

        Raises NoReplicaAvailableError when every replica is unhealthy or saturated.
        """
        replica = self.pick(session_id)
        if replica is None:
            raise NoReplicaAvailableError(
                f"no replica available ({len(self._state.replicas)} known, {len(self._state.unhealthy)} unhealthy)"
            )
        self.acquire(replica)
        try:
            yield replica
        finally:
            self.release(replica)

    async def refresh_forever(self, stop: asyncio.Event) -> None:
        """Refresh every `refresh_seconds` until `stop` is set."""
        while not stop.is_set():
            await self.refresh()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.config.refresh_seconds)


@contextlib.asynccontextmanager
async def running_refresh(replica_set: ReplicaSet) -> AsyncIterator[ReplicaSet]:
    """Refresh once, then keep refreshing in the background while the block runs."""
    stop = asyncio.Event()
    await replica_set.refresh()
    task = asyncio.create_task(replica_set.refresh_forever(stop))
    try:
        yield replica_set
    finally:
        stop.set()
        await task
