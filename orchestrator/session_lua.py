"""The session store's Lua scripts (orchestrator/session_store.py): every write is one script, atomic
on the session's two keys (same hash tag, so single-slot on Redis Cluster).

KEYS[1] = session hash, KEYS[2] = ids string. Replies are {STATUS, detail...}: OK/RESUMED of
create/begin/finish/get carry the HGETALL of the hash and the ids string; OK of append/truncate
carries version, length, lease_until (ms). Python constants the scripts name (ID_BYTES,
MS_PER_SECOND, US_PER_MS) are substituted into the source by :func:`_lua`.

Idempotent writes: create, append, truncate and finish carry a write id (an ARGV, see each
script), which the write stores in the hash's ``write_id`` field with the version it makes. When the same write is
run again (redis-py resends a script whose reply was lost: the connection broke or timed out after
Redis had applied it) and the session is still at the version that write made (``expected + 1``,
nothing written since) with that write id, the script applies nothing and answers APPLIED with
the same reply an OK would carry. Any other writer at the same expected version still gets VERSION.
The check comes before the lease check: a write that was applied under the lease stays applied.
"""

from __future__ import annotations

from orchestrator.session_types import ID_BYTES, MS_PER_SECOND, US_PER_MS

R_OK, R_RESUMED, R_NOT_FOUND, R_EXISTS = "OK", "RESUMED", "NOT_FOUND", "EXISTS"
R_VERSION, R_LEASE, R_BUSY, R_RANGE, R_REUSED = "VERSION", "LEASE", "BUSY", "RANGE", "REUSED"
R_APPLIED = "APPLIED"  # a retried write found already applied (nothing done again)

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
local function applied(expected, write_id)  -- this very write made the current version
  return write_id ~= '' and hnum('version') == tonumber(expected) + 1
    and redis.call('HGET', H, 'write_id') == write_id
end
local function expire(ttl)
  redis.call('EXPIRE', H, ttl)
  redis.call('EXPIRE', I, ttl)
end
local function touch(now, ttl, write_id)  -- returns the new version
  local v = redis.call('HINCRBY', H, 'version', 1)
  redis.call('HSET', H, 'updated_at', now, 'write_id', write_id)
  expire(ttl)
  return v
end
local function init(now, blob, prompt_tokens, turns, params, write_id)
  redis.call('DEL', H, I)
  redis.call('SET', I, blob)
  redis.call('HSET', H, 'prompt_tokens', prompt_tokens, 'turns', turns,
    'params', params, 'status', 'idle', 'rounds', 0, 'drafted', 0, 'accepted', 0,
    'delivered', 0, 'last_finish_reason', '', 'created_at', now, 'updated_at', now,
    'version', 1, 'owner', '', 'lease_until', 0, 'request_id', '', 'request_base_len', 0,
    'write_id', write_id)
end
local function full(status)
  return {status, redis.call('HGETALL', H), redis.call('GET', I)}
end
local function written(status, version, nbytes)
  return {status, version, math.floor(nbytes / ID_BYTES), hnum('lease_until')}
end
"""

_LUA_GET = """
if not present() then return {'NOT_FOUND'} end
return full('OK')
"""

# ARGV: ids, prompt_tokens, turns, params, ttl, write_id
_LUA_CREATE = """
if present() then
  if applied(0, ARGV[6]) then return full('APPLIED') end
  return {'EXISTS'}
end
init(now_ms(), ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[6])
expire(ARGV[5])
return full('OK')
"""

# ARGV: expected_version, owner, ids, ttl, write_id, counter, delta, counter, delta...
_LUA_APPEND = """
if present() and applied(ARGV[1], ARGV[5]) then
  return written('APPLIED', hnum('version'), redis.call('STRLEN', I))
end
local now = now_ms()
local err = check(ARGV[1], ARGV[2], now)
if err then return err end
local nbytes = redis.call('APPEND', I, ARGV[3])
for i = 6, #ARGV, 2 do redis.call('HINCRBY', H, ARGV[i], ARGV[i + 1]) end
return written('OK', touch(now, ARGV[4], ARGV[5]), nbytes)
"""

# ARGV: expected_version, owner, length_in_bytes, ttl, write_id
_LUA_TRUNCATE = """
if present() and applied(ARGV[1], ARGV[5]) then
  return written('APPLIED', hnum('version'), redis.call('STRLEN', I))
end
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
return written('OK', touch(now, ARGV[4], ARGV[5]), n)
"""

# ARGV: request_id, owner, lease_ms, turn_ids, params, ttl, create_missing, fingerprint ('' = not checked)
_LUA_BEGIN = """
local now = now_ms()
if not present() then
  if ARGV[7] ~= '1' then return {'NOT_FOUND'} end
  init(now, '', 0, 0, ARGV[5], '')
end
local owner = redis.call('HGET', H, 'owner') or ''
local live = owner ~= '' and hnum('lease_until') > now
local generating = redis.call('HGET', H, 'status') == 'generating'
if redis.call('HGET', H, 'request_id') == ARGV[1] then
  local stored = redis.call('HGET', H, 'fingerprint') or ''
  if ARGV[8] ~= '' and stored ~= '' and stored ~= ARGV[8] then return {'REUSED', ARGV[1]} end
  if generating then
    if live and owner ~= ARGV[2] then return {'BUSY', owner} end
    redis.call('HSET', H, 'owner', ARGV[2], 'lease_until', now + tonumber(ARGV[3]))
    touch(now, ARGV[6], '')
  end
  return full('RESUMED')
end
if generating and live then return {'BUSY', owner} end
local base = redis.call('STRLEN', I)
redis.call('APPEND', I, ARGV[4])
redis.call('HSET', H, 'prompt_tokens', #ARGV[4] / ID_BYTES,
  'params', ARGV[5], 'status', 'generating', 'owner', ARGV[2],
  'lease_until', now + tonumber(ARGV[3]), 'request_id', ARGV[1],
  'request_base_len', base / ID_BYTES, 'delivered', 0, 'last_finish_reason', '', 'last_text_chars', -1,
  'fingerprint', ARGV[8])
redis.call('HINCRBY', H, 'turns', 1)
touch(now, ARGV[6], '')
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

# ARGV: owner, finish_reason, expected_version, ttl, write_id, text_chars
_LUA_FINISH = """
if present() and applied(ARGV[3], ARGV[5]) then return full('APPLIED') end
local now = now_ms()
local err = check(ARGV[3], ARGV[1], now)
if err then return err end
redis.call('HSET', H, 'status', 'idle', 'owner', '', 'lease_until', 0,
  'last_finish_reason', ARGV[2], 'last_text_chars', ARGV[6])
touch(now, ARGV[4], ARGV[5])
return full('OK')
"""

_LUA_CONSTANTS = {"ID_BYTES": ID_BYTES, "MS_PER_SECOND": MS_PER_SECOND, "US_PER_MS": US_PER_MS}


def _lua(body: str) -> str:
    """Prefix a script body with the prelude and substitute the Python constants it names."""
    source = _LUA_PRELUDE + body
    for name, value in _LUA_CONSTANTS.items():
        source = source.replace(name, str(value))
    return source


SCRIPTS = {
    "get": _lua(_LUA_GET),
    "create": _lua(_LUA_CREATE),
    "append": _lua(_LUA_APPEND),
    "truncate": _lua(_LUA_TRUNCATE),
    "begin": _lua(_LUA_BEGIN),
    "renew": _lua(_LUA_RENEW),
    "finish": _lua(_LUA_FINISH),
}
