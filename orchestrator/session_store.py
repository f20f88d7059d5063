"""Sessions in Redis (``redis.asyncio``), two keys per session, every write one Lua script.

Layout: ``{prefix}session:{<session_id>}:ids`` is a string of the accepted token ids,
little-endian int32 (4 bytes per id), grown with ``APPEND``; ``{prefix}session:{<session_id>}``
is a hash with fields

    prompt_tokens       length of the prompt part of the latest turn
    turns               number of turns begun
    params              JSON of the resolved request parameters
    status              "idle" | "generating"
    rounds drafted accepted delivered   counters (HINCRBY)
    last_finish_reason  "" until a request finished
    last_text_chars     characters of text that request delivered (-1: not known; a replay's cut)
    created_at updated_at lease_until   Redis server time, integer milliseconds
    version             bumped by every state-changing write (not by renew_lease)
    owner               orchestrator instance holding the lease ("" = none)
    request_id          id of the latest request (kept after it finished)
    request_base_len    tokens the session had when that request began

The session id is the hash tag (between braces; the prefix stays outside), so both keys
map to one slot and every script stays single-slot on Redis Cluster. (An id that starts
with ``}`` gives an empty tag; such a session works on a single Redis but not on Cluster.)
Both keys always exist together: a session counts as present only while both do, every
write refreshes the TTL of both, :meth:`SessionStore.delete` removes both.

The per-round write (:meth:`SessionStore.append`) costs O(new tokens) in Redis and on the
wire: it appends to the ids string and answers only ``(version, length, lease_until)``
(:class:`Written`); the caller keeps the context ids itself. Reads of the whole session
(:meth:`~SessionStore.get`, ``create``, ``begin_request``, ``finish_request``) return the
full :class:`Session`.

Time comes from the Redis server (``TIME``), so leases do not depend on clock skew
between orchestrator instances.

Concurrency: :meth:`SessionStore.append`, :meth:`~SessionStore.truncate` and
:meth:`~SessionStore.finish_request` check the lease first (no lease, same owner or
expired lease), then ``version == expected_version``, in one atomic script; two
writers can therefore never interleave tokens: for one version exactly one wins.

Retries: the client (:func:`open_redis`) resends a command whose connection failed or timed
out, and a script may have run before its reply was lost. So every write (``create``,
``append``, ``truncate``, ``finish_request``) carries a write id (default: a fresh one per
call, the same for redis-py's resends of that call; pass your own to retry a write yourself).
A resent write that finds the session at the version it made, ``expected_version + 1``, with
its write id, is answered as a success without being applied again (tokens are not appended
twice, counters not added twice); any other writer at that version still gets
:class:`VersionConflict` (session_lua.py). ``begin_request`` is idempotent by its request id,
``renew_lease`` by nature.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from orchestrator.session_lua import (
    R_APPLIED,
    R_BUSY,
    R_EXISTS,
    R_LEASE,
    R_NOT_FOUND,
    R_OK,
    R_RANGE,
    R_RESUMED,
    R_REUSED,
    R_VERSION,
    SCRIPTS,
)
from orchestrator.session_types import (
    COUNTER_FIELDS,
    ID_BYTES,
    MS_PER_SECOND,
    LeaseLost,
    RequestReused,
    Session,
    SessionBusy,
    SessionExists,
    SessionNotFound,
    SessionStoreError,
    StoreUnavailable,
    VersionConflict,
    Written,
    decode_text,
    encode_ids,
    session_from_reply,
    written_from_reply,
)

logger = logging.getLogger(__name__)

DEFAULT_PREFIX = "specdec:"
DEFAULT_TTL_SECONDS = 24 * 60 * 60
DEFAULT_SOCKET_TIMEOUT_S = 5.0
DEFAULT_CONNECT_TIMEOUT_S = 2.0
DEFAULT_RETRIES = 2
RETRY_BACKOFF_CAP_S = 0.5
RETRY_BACKOFF_BASE_S = 0.05


def open_redis(
    url: str,
    socket_timeout: float = DEFAULT_SOCKET_TIMEOUT_S,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
    retries: int = DEFAULT_RETRIES,
) -> aioredis.Redis:
    """Return a ``redis.asyncio`` client suited to :class:`SessionStore`.

    Bytes responses (required: ids are binary), bounded timeouts and few, fast retries so
    that an unreachable Redis surfaces as :class:`StoreUnavailable` within seconds.
    """
    retry = Retry(ExponentialBackoff(cap=RETRY_BACKOFF_CAP_S, base=RETRY_BACKOFF_BASE_S), retries)
    return aioredis.Redis.from_url(
        url,
        decode_responses=False,
        socket_timeout=socket_timeout,
        socket_connect_timeout=connect_timeout,
        retry=retry,
    )


def _params_json(params: Mapping[str, Any]) -> str:
    """Serialize request parameters compactly and deterministically."""
    return json.dumps(dict(params), sort_keys=True, separators=(",", ":"))


def _write_id(write_id: str) -> str:
    """The id a write carries: the caller's, else a fresh one (a resend of the call keeps it)."""
    return write_id or uuid.uuid4().hex


def _lease_ms(lease_seconds: float) -> int:
    """Convert a lease duration to whole milliseconds (must be positive)."""
    if lease_seconds <= 0:
        raise ValueError("lease_seconds must be positive")
    return int(lease_seconds * MS_PER_SECOND)


class SessionStore:
    """Async access to sessions in Redis.

    Args:
        redis: a ``redis.asyncio.Redis`` with ``decode_responses=False`` (see :func:`open_redis`).
        prefix: key prefix (ACL-friendly: grant ``~specdec:*``).
        ttl_seconds: session TTL, refreshed on every write.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        prefix: str = DEFAULT_PREFIX,
        ttl_seconds: int = DEFAULT_TTL_SECONDS,
    ) -> None:
        if redis.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError("SessionStore needs a Redis client with decode_responses=False")
        if ttl_seconds <= 0:
            raise ValueError("ttl_seconds must be positive")
        self._redis = redis
        self.prefix = prefix
        self.ttl_seconds = int(ttl_seconds)
        self._scripts = {name: redis.register_script(src) for name, src in SCRIPTS.items()}

    async def close(self) -> None:
        """Close the Redis client's connections (the orchestrator's shutdown)."""
        await self._redis.aclose()

    def key(self, session_id: str) -> str:
        """Redis key of a session's hash (the session id is the Cluster hash tag)."""
        if not session_id:
            raise ValueError("session_id must be non-empty")
        return f"{self.prefix}session:{{{session_id}}}"

    def ids_key(self, session_id: str) -> str:
        """Redis key of a session's token ids (same hash tag, hence same slot, as the hash)."""
        return self.key(session_id) + ":ids"

    def keys(self, session_id: str) -> list[str]:
        """Both keys of a session: [hash, ids]."""
        return [self.key(session_id), self.ids_key(session_id)]

    def request_key(self, request_id: str) -> str:
        """Redis key of an idempotency key used without a session id: it names the session it was first used in."""
        return f"{self.prefix}request:{{{request_id}}}"

    async def claim_request_key(self, request_id: str, session_id: str) -> str:
        """The session of idempotency key ``request_id``: ``session_id`` when the key is new (kept for the
        store's TTL, ``SET NX``), else the session it was claimed for first (two racing claims get the same)."""
        key = self.request_key(request_id)
        if await self._run(self._redis.set(key, session_id, nx=True, ex=self.ttl_seconds)):
            return session_id
        stored = await self._run(self._redis.get(key))
        return decode_text(stored) if stored else session_id

    async def _run(self, coro: Any) -> Any:
        """Await a Redis call, turning connection failures into StoreUnavailable."""
        try:
            return await coro
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise StoreUnavailable(f"Redis unavailable ({type(exc).__name__}: {exc})") from None

    async def _script(self, name: str, session_id: str, *args: Any) -> list[Any]:
        """Run a registered Lua script on the session's two keys."""
        return await self._run(self._scripts[name](keys=self.keys(session_id), args=list(args)))

    def _raise_for(self, session_id: str, reply: list[Any], expected: int = 0) -> None:
        """Raise the error a script reported with its status word (no-op for OK/RESUMED)."""
        status = decode_text(reply[0])
        detail = decode_text(reply[1]) if len(reply) > 1 and isinstance(reply[1], bytes) else ""
        if status in (R_OK, R_RESUMED):
            return
        if status == R_APPLIED:
            logger.info("session %r: a resent write was already applied; not applied again", session_id)
            return
        if status == R_NOT_FOUND:
            raise SessionNotFound(f"session {session_id!r} not found")
        if status == R_EXISTS:
            raise SessionExists(f"session {session_id!r} already exists")
        if status == R_VERSION:
            raise VersionConflict(session_id, expected, int(detail))
        if status == R_LEASE:
            raise LeaseLost(session_id, detail)
        if status == R_BUSY:
            raise SessionBusy(session_id, detail)
        if status == R_REUSED:
            raise RequestReused(session_id, detail)
        if status == R_RANGE:
            raise ValueError(f"session {session_id!r} has only {detail} tokens")
        raise SessionStoreError(f"unexpected script reply {status!r}")

    async def create(
        self,
        session_id: str,
        ids: Sequence[int],
        prompt_tokens: int,
        params: Mapping[str, Any],
        write_id: str = "",
    ) -> Session:
        """Create a session holding ``ids`` (turns = 1 if ``ids`` else 0), status idle, version 1.

        ``write_id``: see the module docstring (a resent create that was applied is a success).

        Raises:
            SessionExists: the id is taken.  StoreUnavailable: Redis unreachable.
        """
        reply = await self._script(
            "create",
            session_id,
            encode_ids(ids),
            int(prompt_tokens),
            1 if ids else 0,
            _params_json(params),
            self.ttl_seconds,
            _write_id(write_id),
        )
        self._raise_for(session_id, reply)
        return session_from_reply(session_id, reply)

    async def get(self, session_id: str) -> Session | None:
        """Return the session (hash and ids read atomically), or None if it does not exist."""
        reply = await self._script("get", session_id)
        if decode_text(reply[0]) == R_NOT_FOUND:
            return None
        self._raise_for(session_id, reply)
        return session_from_reply(session_id, reply)

    async def append(
        self,
        session_id: str,
        expected_version: int,
        new_ids: Sequence[int],
        counters_delta: Mapping[str, int],
        owner: str,
        write_id: str = "",
    ) -> Written:
        """Atomically append ``new_ids`` and add ``counters_delta`` (keys: rounds, drafted,
        accepted, delivered); bumps version. Idempotent per ``write_id`` (module docstring): the
        same write run again after it was applied answers the same Written, appends nothing.

        Costs O(len(new_ids)): the reply is only the new version, length and lease expiry
        (the caller keeps the context ids; :meth:`get` reads them all).

        Raises:
            VersionConflict, LeaseLost, SessionNotFound, StoreUnavailable, ValueError (bad counter).
        """
        unknown = set(counters_delta) - COUNTER_FIELDS
        if unknown:
            raise ValueError(f"unknown counters {sorted(unknown)}; allowed {sorted(COUNTER_FIELDS)}")
        pairs = [x for name, delta in counters_delta.items() for x in (name, int(delta))]
        reply = await self._script(
            "append",
            session_id,
            int(expected_version),
            owner,
            encode_ids(new_ids),
            self.ttl_seconds,
            _write_id(write_id),
            *pairs,
        )
        self._raise_for(session_id, reply, expected_version)
        return written_from_reply(reply)

    async def begin_request(
        self,
        session_id: str,
        request_id: str,
        owner: str,
        lease_seconds: float,
        new_turn_ids: Sequence[int],
        params: Mapping[str, Any],
        create_missing: bool = False,
        fingerprint: str = "",
    ) -> tuple[Session, bool]:
        """Start (or resume) request ``request_id`` on the session; returns (session, resumed).

        * Same ``request_id`` as the session's latest request: nothing is appended,
          ``resumed=True``. If it is still generating, the caller takes over the lease
          (unless another owner's lease is live → SessionBusy); if it already finished
          (``status == "idle"``), nothing changes — the completion is
          ``session.completion_ids`` and ``last_finish_reason`` says how it ended.
        * Otherwise: appends ``new_turn_ids``, sets prompt_tokens = len(new_turn_ids),
          request_base_len = previous length, delivered = 0, turns += 1,
          status generating, lease to ``owner`` — unless a request is generating under
          a live lease (any owner) → SessionBusy. A generation whose lease expired
          (crashed instance) is superseded; its partial tokens stay in the session.
        * ``create_missing``: create the session atomically if absent (else SessionNotFound).
        * ``fingerprint`` (orchestrator/idempotency.py) is stored with a new request; the same
          ``request_id`` with another fingerprint → RequestReused, nothing changed ("" on either
          side: not checked).
        """
        if not request_id:
            raise ValueError("request_id must be non-empty")
        reply = await self._script(
            "begin",
            session_id,
            request_id,
            owner,
            _lease_ms(lease_seconds),
            encode_ids(new_turn_ids),
            _params_json(params),
            self.ttl_seconds,
            "1" if create_missing else "0",
            fingerprint,
        )
        self._raise_for(session_id, reply)
        return session_from_reply(session_id, reply), decode_text(reply[0]) == R_RESUMED

    async def renew_lease(self, session_id: str, owner: str, lease_seconds: float) -> float:
        """Extend ``owner``'s lease (no version bump); returns the new lease_until (seconds).

        Raises:
            LeaseLost: another owner holds a live lease, or no request is generating.
        """
        reply = await self._script("renew", session_id, owner, _lease_ms(lease_seconds), self.ttl_seconds)
        self._raise_for(session_id, reply)
        return int(reply[1]) / MS_PER_SECOND

    async def finish_request(
        self,
        session_id: str,
        owner: str,
        finish_reason: str,
        expected_version: int,
        write_id: str = "",
        text_chars: int = -1,
    ) -> Session:
        """Mark the request finished: status idle, lease cleared, last_finish_reason set, and the
        characters of text it delivered (``text_chars``; -1: not known), which a replay is cut to.

        The request_id is kept so that a retry of a finished request is recognised. Idempotent per
        ``write_id`` (module docstring).
        """
        reply = await self._script(
            "finish",
            session_id,
            owner,
            finish_reason,
            int(expected_version),
            self.ttl_seconds,
            _write_id(write_id),
            int(text_chars),
        )
        self._raise_for(session_id, reply, expected_version)
        return session_from_reply(session_id, reply)

    async def truncate(
        self, session_id: str, expected_version: int, length: int, owner: str, write_id: str = ""
    ) -> Written:
        """Keep only the first ``length`` ids (e.g. tokens after a stop string); bumps version.
        Idempotent per ``write_id`` (module docstring).

        Raises:
            ValueError: ``length`` exceeds the session's length (or is negative).
            VersionConflict, LeaseLost, SessionNotFound, StoreUnavailable.
        """
        if length < 0:
            raise ValueError("length must be >= 0")
        reply = await self._script(
            "truncate",
            session_id,
            int(expected_version),
            owner,
            length * ID_BYTES,
            self.ttl_seconds,
            _write_id(write_id),
        )
        self._raise_for(session_id, reply, expected_version)
        return written_from_reply(reply)

    async def delete(self, session_id: str) -> bool:
        """Delete the session (both keys); True if it existed."""
        return bool(await self._run(self._redis.delete(*self.keys(session_id))))

    async def memory_bytes(self, session_id: str) -> int | None:
        """Bytes Redis uses for the session, hash plus ids (``MEMORY USAGE``); None if absent."""

        async def both() -> list[Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in self.keys(session_id):
                    pipe.memory_usage(key, samples=0)
                return await pipe.execute()

        used = await self._run(both())
        if used[0] is None:
            return None
        return sum(int(u) for u in used if u is not None)
