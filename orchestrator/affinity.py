"""Which replica a request without a session id goes to: its conversation's, not a random one.

Replicas keep KV caches per session, and a new session starts from the longest prefix another session on
the same replica holds (prefix sharing, KVCachePool.share_prefix). A stateless client (the OpenAI API)
resends the whole conversation each turn under a new session id; routed by that id, turn n + 1 meets turn
n's cache on one replica in m. Routed by a key that the turns of one conversation share, every turn goes
to the replica that holds the previous one (SGLang's router and vLLM's production stack route by prefix
for the same reason).

The key is the conversation's opening: its system messages and first user message; for a plain prompt
(no turns to tell apart) its first `prompt_chars` characters where it has that many (a long shared opening:
a document, few-shot examples), else none. Requests that open identically share a replica: that is the
prefix they can share, but not more than `max_live` generations at once from one orchestrator: further
ones (a load test repeating one prompt) take the key's next routes, `key#1`, `key#2`, ..., which rendezvous
hashing spreads over the other replicas (`ConversationRoutes`). A request with a session id, or without a
key, is routed by its session id.
"""

from __future__ import annotations

import hashlib
from typing import Any

KEY_PREFIX = "conversation:"  # apart from the orchestrator's session ids (uuid4 hex); a key only picks replicas
KEY_DIGEST_BYTES = 16
ROUTE_SLOT = "#"  # key#n: the n-th further route of a key with max_live generations in flight


def conversation_key(request: Any, prompt_chars: int) -> str:
    """The routing key of a GenerateRequest without a session id ("" for none: affinity off (prompt_chars <= 0),
    or a plain prompt shorter than prompt_chars)."""
    if prompt_chars <= 0:
        return ""
    digest = hashlib.blake2b(digest_size=KEY_DIGEST_BYTES)
    which = request.WhichOneof("input")
    if which == "messages":
        for message in request.messages.messages:
            digest.update(f"{len(message.role)}:{message.role}{len(message.content)}:".encode())
            digest.update(message.content.encode())
            if message.role == "user":
                break
    elif which == "prompt" and len(request.prompt) >= prompt_chars:
        digest.update(b"prompt:" + request.prompt[:prompt_chars].encode())
    else:
        return ""
    return KEY_PREFIX + digest.hexdigest()


class ConversationRoutes:
    """Generations in flight per conversation key in this orchestrator, and the route each one takes."""

    def __init__(self) -> None:
        self._live: dict[str, int] = {}

    def claim(self, key: str, max_live: int) -> str:
        """The route of one more generation with `key` ("" stays ""): the key itself while fewer than
        `max_live` of its generations are in flight, else `key#n` (n = its in-flight count // max_live)."""
        if not key:
            return key
        live = self._live.get(key, 0)
        self._live[key] = live + 1
        slot = live // max(1, max_live)
        return key if slot == 0 else f"{key}{ROUTE_SLOT}{slot}"

    def release(self, route: str) -> None:
        """One generation that took `route` (what claim returned) has ended."""
        key = route.partition(ROUTE_SLOT)[0]
        if key in self._live:
            self._live[key] -= 1
            if self._live[key] <= 0:
                del self._live[key]

    def live(self, key: str) -> int:
        return self._live.get(key, 0)


def routed_by(route: str) -> str:
    """What a claimed route says routed its generation (the `by` label of specdec_generation_routes_total)."""
    if not route:
        return "session"
    return "conversation_spread" if ROUTE_SLOT in route else "conversation"
