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
prefix they can share; the pool's in-flight limit still spills a saturated replica's rounds to the next
choice (specdec/routing.py). A request with a session id, or without a key, is routed by its session id.
"""

from __future__ import annotations

import hashlib
from typing import Any

KEY_PREFIX = "conversation:"     # apart from the orchestrator's session ids (uuid4 hex); a key only picks replicas
KEY_DIGEST_BYTES = 16


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
