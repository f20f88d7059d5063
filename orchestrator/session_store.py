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
"""

from __future__ import annotations

import json
import logging
import sys
from array import array
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

logger = logging.getLogger(__name__)

DEFAULT_PREFIX = "specdec:"
DEFAULT_TTL_SECONDS = 24 * 60 * 60
MS_PER_SECOND = 1000
US_PER_MS = 1000
ID_BYTES = 4
"""Each token id is stored as a little-endian int32."""
COUNTER_FIELDS = frozenset({"rounds", "drafted", "accepted", "delivered"})
STATUS_IDLE = "idle"
STATUS_GENERATING = "generating"
DEFAULT_SOCKET_TIMEOUT_S = 5.0
DEFAULT_CONNECT_TIMEOUT_S = 2.0
DEFAULT_RETRIES = 2
RETRY_BACKOFF_CAP_S = 0.5
RETRY_BACKOFF_BASE_S = 0.05


# --- Lua scripts -------------------------------------------------------------------------
# KEYS[1] = session hash, KEYS[2] = ids string (same hash tag).
# Replies are {STATUS, detail...}: OK/RESUMED of create/begin/finish/get carry the HGETALL of
# the hash and the ids string; OK of append/truncate carries version, length, lease_until (ms).
_R_OK, _R_RESUMED, _R_NOT_FOUND, _R_EXISTS = "OK", "RESUMED", "NOT_FOUND", "EXISTS"
_R_VERSION, _R_LEASE, _R_BUSY, _R_RANGE = "VERSION", "LEASE", "BUSY", "RANGE"

_LUA_PRELUDE = """
if redis.replicate_commands then redis.replicate_commands() end
local H, I = KEYS[1], KEYS[2]
local function now_ms()  -- Redis server clock: seconds, microseconds -> milliseconds
  local t = redis.call('TIME')
  return tonumber(t[1]) * MS_PER_SECOND + math.floor(tonumber(t[2]) / US_PER_MS)
end
local function present()  -- both keys (a lone one, e.g. after eviction, is no session)
  return redis.call('EXISTS', H, I) == 2
end
local function hnum(field)
  return tonumber(redis.call('HGET', H, field) or '0') or 0
end
local function lease_ok(owner, now)
  local cur = redis.call('HGET', H, 'owner') or ''
  return cur == '' or cur == owner or hnum('lease_until') <= now
end
local function check(expected, owner, now)
  if not present() then return {'NOT_FOUND'} end
  if not lease_ok(owner, now) then return {'LEASE', redis.call('HGET', H, 'owner')} end
  local v = hnum('version')
  if v ~= tonumber(expected) then return {'VERSION', tostring(v)} end
  return nil
end
local function expire(ttl)
  redis.call('EXPIRE', H, ttl)
  redis.call('EXPIRE', I, ttl)
end
local function touch(now, ttl)  -- returns the new version
  local v = redis.call('HINCRBY', H, 'version', 1)
  redis.call('HSET', H, 'updated_at', now)
  expire(ttl)
  return v
end
local function init(now, blob, prompt_tokens, turns, params)
  redis.call('DEL', H, I)
  redis.call('SET', I, blob)
  redis.call('HSET', H, 'prompt_tokens', prompt_tokens, 'turns', turns,
    'params', params, 'status', 'idle', 'rounds', 0, 'drafted', 0, 'accepted', 0,
    'delivered', 0, 'last_finish_reason', '', 'created_at', now, 'updated_at', now,
    'version', 1, 'owner', '', 'lease_until', 0, 'request_id', '', 'request_base_len', 0)
end
local function full(status)
  return {status, redis.call('HGETALL', H), redis.call('GET', I)}
end
local function written(version, nbytes)
  return {'OK', version, math.floor(nbytes / ID_BYTES), hnum('lease_until')}
end
"""

_LUA_GET = """
if not present() then return {'NOT_FOUND'} end
return full('OK')
"""

# ARGV: ids, prompt_tokens, turns, params, ttl
_LUA_CREATE = """
if present() then return {'EXISTS'} end
init(now_ms(), ARGV[1], ARGV[2], ARGV[3], ARGV[4])
expire(ARGV[5])
return full('OK')
"""

# ARGV: expected_version, owner, ids, ttl, counter, delta, counter, delta...
_LUA_APPEND = """
local now = now_ms()
local err = check(ARGV[1], ARGV[2], now)
if err then return err end
local nbytes = redis.call('APPEND', I, ARGV[3])
for i = 5, #ARGV, 2 do redis.call('HINCRBY', H, ARGV[i], ARGV[i + 1]) end
return written(touch(now, ARGV[4]), nbytes)
"""

# ARGV: expected_version, owner, length_in_bytes, ttl
_LUA_TRUNCATE = """
local now = now_ms()
local err = check(ARGV[1], ARGV[2], now)
if err then return err end
local have, n = redis.call('STRLEN', I), tonumber(ARGV[3])
if n > have then return {'RANGE', tostring(have / ID_BYTES)} end
if n == 0 then
  redis.call('SET', I, '')
elseif n < have then
  redis.call('SET', I, redis.call('GETRANGE', I, 0, n - 1))
end
return written(touch(now, ARGV[4]), n)
"""

# ARGV: request_id, owner, lease_ms, turn_ids, params, ttl, create_missing
_LUA_BEGIN = """
local now = now_ms()
if not present() then
  if ARGV[7] ~= '1' then return {'NOT_FOUND'} end
  init(now, '', 0, 0, ARGV[5])
end
local owner = redis.call('HGET', H, 'owner') or ''
local live = owner ~= '' and hnum('lease_until') > now
local generating = redis.call('HGET', H, 'status') == 'generating'
if redis.call('HGET', H, 'request_id') == ARGV[1] then
  if generating then
    if live and owner ~= ARGV[2] then return {'BUSY', owner} end
    redis.call('HSET', H, 'owner', ARGV[2], 'lease_until', now + tonumber(ARGV[3]))
    touch(now, ARGV[6])
  end
  return full('RESUMED')
end
if generating and live then return {'BUSY', owner} end
local base = redis.call('STRLEN', I)
redis.call('APPEND', I, ARGV[4])
redis.call('HSET', H, 'prompt_tokens', #ARGV[4] / ID_BYTES,
  'params', ARGV[5], 'status', 'generating', 'owner', ARGV[2],
  'lease_until', now + tonumber(ARGV[3]), 'request_id', ARGV[1],
  'request_base_len', base / ID_BYTES, 'delivered', 0, 'last_finish_reason', '')
redis.call('HINCRBY', H, 'turns', 1)
touch(now, ARGV[6])
return full('OK')
"""

# ARGV: owner, lease_ms, ttl
_LUA_RENEW = """
local now = now_ms()
if not present() then return {'NOT_FOUND'} end
if redis.call('HGET', H, 'status') ~= 'generating' then return {'LEASE', ''} end
if not lease_ok(ARGV[1], now) then
  return {'LEASE', redis.call('HGET', H, 'owner')}
end
local lease_until = now + tonumber(ARGV[2])
redis.call('HSET', H, 'owner', ARGV[1], 'lease_until', lease_until)
expire(ARGV[3])
return {'OK', tostring(lease_until)}
"""

# ARGV: owner, finish_reason, expected_version, ttl
_LUA_FINISH = """
local now = now_ms()
local err = check(ARGV[3], ARGV[1], now)
if err then return err end
redis.call('HSET', H, 'status', 'idle', 'owner', '', 'lease_until', 0,
  'last_finish_reason', ARGV[2])
touch(now, ARGV[4])
return full('OK')
"""

_LUA_CONSTANTS = {"ID_BYTES": ID_BYTES, "MS_PER_SECOND": MS_PER_SECOND, "US_PER_MS": US_PER_MS}


def _lua(body: str) -> str:
    """Prefix a script body with the prelude and substitute the Python constants it names."""
    source = _LUA_PRELUDE + body
    for name, value in _LUA_CONSTANTS.items():
        source = source.replace(name, str(value))
    return source


_SCRIPTS = {
    "get": _lua(_LUA_GET), "create": _lua(_LUA_CREATE), "append": _lua(_LUA_APPEND),
    "truncate": _lua(_LUA_TRUNCATE), "begin": _lua(_LUA_BEGIN), "renew": _lua(_LUA_RENEW),
    "finish": _lua(_LUA_FINISH),
}


class SessionStoreError(Exception):
    """Base class of session store errors."""


class SessionExists(SessionStoreError):
    """create() for a session id that is already present."""


class SessionNotFound(SessionStoreError):
    """The session does not exist (never created, deleted or expired)."""


class VersionConflict(SessionStoreError):
    """The session changed since the caller read it (``current`` is its version now)."""

    def __init__(self, session_id: str, expected: int, current: int) -> None:
        super().__init__(f"session {session_id!r}: expected version {expected}, found {current}")
        self.expected = expected
        self.current = current


class LeaseLost(SessionStoreError):
    """Another orchestrator instance holds a live lease (``owner``), or no request is in progress."""

    def __init__(self, session_id: str, owner: str) -> None:
        holder = f"lease held by {owner!r}" if owner else "no request in progress"
        super().__init__(f"session {session_id!r}: {holder}")
        self.owner = owner


class SessionBusy(SessionStoreError):
    """begin_request while another request is generating under a live lease (``owner``)."""

    def __init__(self, session_id: str, owner: str) -> None:
        super().__init__(f"session {session_id!r} is generating another request (owner {owner!r})")
        self.owner = owner


class StoreUnavailable(SessionStoreError):
    """Redis cannot be reached (maps to gRPC UNAVAILABLE)."""


@dataclass
class Session:
    """A session as stored in Redis (times in seconds since the epoch, Redis server clock)."""

    session_id: str
    ids: list[int]
    prompt_tokens: int
    turns: int
    params: dict[str, Any]
    status: str
    rounds: int
    drafted: int
    accepted: int
    delivered: int
    last_finish_reason: str
    created_at: float
    updated_at: float
    version: int
    owner: str
    lease_until: float
    request_id: str
    request_base_len: int

    @property
    def completion_ids(self) -> list[int]:
        """Ids generated so far by the latest request (after its prompt)."""
        return self.ids[self.request_base_len + self.prompt_tokens:]


@dataclass(frozen=True)
class Written:
    """Result of :meth:`SessionStore.append` / :meth:`~SessionStore.truncate`: O(1) in size.

    ``version`` is the session's version after the write (pass it as the next
    ``expected_version``), ``length`` the number of ids after the write, ``lease_until``
    the lease expiry in seconds since the epoch (Redis server clock; 0 = no lease).
    """

    version: int
    length: int
    lease_until: float


def encode_ids(ids: Sequence[int]) -> bytes:
    """Pack token ids as little-endian int32 bytes.

    Raises:
        ValueError: if an id does not fit in int32.
    """
    try:
        packed = array("i", ids)
    except OverflowError as exc:
        raise ValueError(f"token id out of int32 range: {exc}") from None
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def decode_ids(blob: bytes) -> list[int]:
    """Unpack little-endian int32 bytes into token ids."""
    packed = array("i")
    packed.frombytes(blob)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tolist()


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


def _text(value: Optional[bytes]) -> str:
    """Decode a hash value (absent → '')."""
    return value.decode("utf-8") if value is not None else ""


def _session_from_reply(session_id: str, reply: Sequence[Any]) -> Session:
    """Build a Session from a script reply ``[status, HGETALL flat list, ids blob]``."""
    flat, blob = reply[1], reply[2]
    h = {_text(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}

    def num(name: str) -> int:
        return int(h.get(name) or 0)

    return Session(
        session_id=session_id,
        ids=decode_ids(blob or b""),
        prompt_tokens=num("prompt_tokens"),
        turns=num("turns"),
        params=json.loads(h.get("params") or b"{}"),
        status=_text(h.get("status")) or STATUS_IDLE,
        rounds=num("rounds"),
        drafted=num("drafted"),
        accepted=num("accepted"),
        delivered=num("delivered"),
        last_finish_reason=_text(h.get("last_finish_reason")),
        created_at=num("created_at") / MS_PER_SECOND,
        updated_at=num("updated_at") / MS_PER_SECOND,
        version=num("version"),
        owner=_text(h.get("owner")),
        lease_until=num("lease_until") / MS_PER_SECOND,
        request_id=_text(h.get("request_id")),
        request_base_len=num("request_base_len"),
    )


def _written_from_reply(reply: Sequence[Any]) -> Written:
    """Build a Written from a script reply ``[status, version, length, lease_until_ms]``."""
    return Written(
        version=int(reply[1]), length=int(reply[2]), lease_until=int(reply[3]) / MS_PER_SECOND
    )


def _params_json(params: Mapping[str, Any]) -> str:
    """Serialize request parameters compactly and deterministically."""
    return json.dumps(dict(params), sort_keys=True, separators=(",", ":"))


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
        self._scripts = {name: redis.register_script(src) for name, src in _SCRIPTS.items()}

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
        status = _text(reply[0])
        detail = _text(reply[1]) if len(reply) > 1 and isinstance(reply[1], bytes) else ""
        if status in (_R_OK, _R_RESUMED):
            return
        if status == _R_NOT_FOUND:
            raise SessionNotFound(f"session {session_id!r} not found")
        if status == _R_EXISTS:
            raise SessionExists(f"session {session_id!r} already exists")
        if status == _R_VERSION:
            raise VersionConflict(session_id, expected, int(detail))
        if status == _R_LEASE:
            raise LeaseLost(session_id, detail)
        if status == _R_BUSY:
            raise SessionBusy(session_id, detail)
        if status == _R_RANGE:
            raise ValueError(f"session {session_id!r} has only {detail} tokens")
        raise SessionStoreError(f"unexpected script reply {status!r}")

    async def create(
        self, session_id: str, ids: Sequence[int], prompt_tokens: int, params: Mapping[str, Any]
    ) -> Session:
        """Create a session holding ``ids`` (turns = 1 if ``ids`` else 0), status idle, version 1.

        Raises:
            SessionExists: the id is taken.  StoreUnavailable: Redis unreachable.
        """
        reply = await self._script(
            "create", session_id, encode_ids(ids), int(prompt_tokens), 1 if ids else 0,
            _params_json(params), self.ttl_seconds,
        )
        self._raise_for(session_id, reply)
        return _session_from_reply(session_id, reply)

    async def get(self, session_id: str) -> Optional[Session]:
        """Return the session (hash and ids read atomically), or None if it does not exist."""
        reply = await self._script("get", session_id)
        if _text(reply[0]) == _R_NOT_FOUND:
            return None
        self._raise_for(session_id, reply)
        return _session_from_reply(session_id, reply)

    async def append(
        self,
        session_id: str,
        expected_version: int,
        new_ids: Sequence[int],
        counters_delta: Mapping[str, int],
        owner: str,
    ) -> Written:
        """Atomically append ``new_ids`` and add ``counters_delta`` (keys: rounds, drafted,
        accepted, delivered); bumps version.

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
            "append", session_id, int(expected_version), owner, encode_ids(new_ids),
            self.ttl_seconds, *pairs,
        )
        self._raise_for(session_id, reply, expected_version)
        return _written_from_reply(reply)

    async def begin_request(
        self,
        session_id: str,
        request_id: str,
        owner: str,
        lease_seconds: float,
        new_turn_ids: Sequence[int],
        params: Mapping[str, Any],
        create_missing: bool = False,
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
        """
        if not request_id:
            raise ValueError("request_id must be non-empty")
        reply = await self._script(
            "begin", session_id, request_id, owner, _lease_ms(lease_seconds),
            encode_ids(new_turn_ids), _params_json(params), self.ttl_seconds,
            "1" if create_missing else "0",
        )
        self._raise_for(session_id, reply)
        return _session_from_reply(session_id, reply), _text(reply[0]) == _R_RESUMED

    async def renew_lease(self, session_id: str, owner: str, lease_seconds: float) -> float:
        """Extend ``owner``'s lease (no version bump); returns the new lease_until (seconds).

        Raises:
            LeaseLost: another owner holds a live lease, or no request is generating.
        """
        reply = await self._script(
            "renew", session_id, owner, _lease_ms(lease_seconds), self.ttl_seconds
        )
        self._raise_for(session_id, reply)
        return int(reply[1]) / MS_PER_SECOND

    async def finish_request(
        self, session_id: str, owner: str, finish_reason: str, expected_version: int
    ) -> Session:
        """Mark the request finished: status idle, lease cleared, last_finish_reason set.

        The request_id is kept so that a retry of a finished request is recognised.
        """
        reply = await self._script(
            "finish", session_id, owner, finish_reason, int(expected_version), self.ttl_seconds
        )
        self._raise_for(session_id, reply, expected_version)
        return _session_from_reply(session_id, reply)

    async def truncate(
        self, session_id: str, expected_version: int, length: int, owner: str
    ) -> Written:
        """Keep only the first ``length`` ids (e.g. tokens after a stop string); bumps version.

        Raises:
            ValueError: ``length`` exceeds the session's length (or is negative).
            VersionConflict, LeaseLost, SessionNotFound, StoreUnavailable.
        """
        if length < 0:
            raise ValueError("length must be >= 0")
        reply = await self._script(
            "truncate", session_id, int(expected_version), owner, length * ID_BYTES,
            self.ttl_seconds,
        )
        self._raise_for(session_id, reply, expected_version)
        return _written_from_reply(reply)

    async def delete(self, session_id: str) -> bool:
        """Delete the session (both keys); True if it existed."""
        return bool(await self._run(self._redis.delete(*self.keys(session_id))))

    async def memory_bytes(self, session_id: str) -> Optional[int]:
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
