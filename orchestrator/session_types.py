"""What the session store (orchestrator/session_store.py) stores and returns, and how it fails:
:class:`Session`, :class:`Written`, the errors, the int32 id encoding and the parsing of script replies.
No Redis client here.
"""

from __future__ import annotations

import json
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MS_PER_SECOND = 1000
US_PER_MS = 1000
ID_BYTES = 4
"""Each token id is stored as a little-endian int32."""
COUNTER_FIELDS = frozenset({"rounds", "drafted", "accepted", "delivered"})
STATUS_IDLE = "idle"
STATUS_GENERATING = "generating"


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


class RequestReused(SessionStoreError):
    """begin_request with the latest request's id but another fingerprint (a reused idempotency key)."""

    def __init__(self, session_id: str, request_id: str) -> None:
        super().__init__(f"request_id {request_id!r} of session {session_id!r} names a different request")
        self.session_id, self.request_id = session_id, request_id


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
    fingerprint: str = ""  # of the latest request (orchestrator/idempotency.py); "" = stored before they existed
    last_text_chars: int = -1  # characters of text the finished request delivered; -1 = not known

    @property
    def completion_ids(self) -> list[int]:
        """Ids generated so far by the latest request (after its prompt)."""
        return self.ids[self.request_base_len + self.prompt_tokens :]


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


def decode_text(value: bytes | None) -> str:
    """Decode a hash value (absent → '')."""
    return value.decode("utf-8") if value is not None else ""


def session_from_reply(session_id: str, reply: Sequence[Any]) -> Session:
    """Build a Session from a script reply ``[status, HGETALL flat list, ids blob]``."""
    flat, blob = reply[1], reply[2]
    h = {decode_text(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}

    def num(name: str) -> int:
        return int(h.get(name) or 0)

    return Session(
        session_id=session_id,
        ids=decode_ids(blob or b""),
        prompt_tokens=num("prompt_tokens"),
        turns=num("turns"),
        params=json.loads(h.get("params") or b"{}"),
        status=decode_text(h.get("status")) or STATUS_IDLE,
        rounds=num("rounds"),
        drafted=num("drafted"),
        accepted=num("accepted"),
        delivered=num("delivered"),
        last_finish_reason=decode_text(h.get("last_finish_reason")),
        created_at=num("created_at") / MS_PER_SECOND,
        updated_at=num("updated_at") / MS_PER_SECOND,
        version=num("version"),
        owner=decode_text(h.get("owner")),
        lease_until=num("lease_until") / MS_PER_SECOND,
        request_id=decode_text(h.get("request_id")),
        request_base_len=num("request_base_len"),
        fingerprint=decode_text(h.get("fingerprint")),
        last_text_chars=int(h.get("last_text_chars") or -1),
    )


def written_from_reply(reply: Sequence[Any]) -> Written:
    """Build a Written from a script reply ``[status, version, length, lease_until_ms]``."""
    return Written(version=int(reply[1]), length=int(reply[2]), lease_until=int(reply[3]) / MS_PER_SECOND)
