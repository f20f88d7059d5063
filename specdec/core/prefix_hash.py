"""The prefix hash of the delta wire form: a 64-bit chained hash over token ids, one step per token.

hash(ids[:0]) = EMPTY_HASH; hash(ids[:n+1]) = step(hash(ids[:n]), ids[n]). Both sides of the wire
(the orchestrator that sends a delta and the replica that checks it) use `step`, so a context that
grows by a few tokens per round costs a few steps per round, never a pass over the whole context.

`step` adds the token (times an odd constant) to the running hash and applies the splitmix64
finaliser, a bijection of 64-bit words: a chained (non-linear) hash, so unlike a polynomial hash
modulo 2^64 it has no structured collisions (Thue-Morse sequences collide for every odd base of
those). Not a cryptographic hash: it detects a replica holding another context, it does not
authenticate one (the session id and the service token do that).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

MASK64 = (1 << 64) - 1
EMPTY_HASH = 0x6A09E667F3BCC908  # hash of the empty prefix (sqrt(2) fraction bits, as SHA-512's IV)
TOKEN_MULTIPLIER = 0x9E3779B97F4A7C15  # 2^64 / golden ratio, odd
MIX_1 = 0xBF58476D1CE4E5B9
MIX_2 = 0x94D049BB133111EB


def step(h: int, token: int) -> int:
    """The hash of a prefix extended by one token (h: the prefix's hash)."""
    z = (h + (token + 1) * TOKEN_MULTIPLIER) & MASK64
    z = ((z ^ (z >> 30)) * MIX_1) & MASK64
    z = ((z ^ (z >> 27)) * MIX_2) & MASK64
    return z ^ (z >> 31)


def prefix_hash(ids: Iterable[int], h: int = EMPTY_HASH) -> int:
    """The hash of `ids` (continuing a prefix whose hash is h)."""
    for token in ids:
        h = step(h, token)
    return h


class PrefixHashes:
    """The hash of every prefix of a growing token sequence: at(n) = hash(ids[:n]) in O(1).

    `extend` costs one step per new token and `truncate` drops hashes (no rehash), so a context
    that grows, or rolls back and grows again, is never hashed from the start twice.
    """

    def __init__(self, ids: Iterable[int] = ()) -> None:
        self._hashes = array("Q", [EMPTY_HASH])  # _hashes[n] = hash(ids[:n])
        self.extend(ids)

    def __len__(self) -> int:
        """Tokens covered (one hash more than that is held: the empty prefix's)."""
        return len(self._hashes) - 1

    def at(self, n: int) -> int:
        """The hash of the first n tokens (0 <= n <= len(self))."""
        return self._hashes[n]

    def extend(self, ids: Iterable[int]) -> None:
        h, hashes = self._hashes[-1], self._hashes
        for token in ids:
            h = step(h, token)
            hashes.append(h)

    def truncate(self, n: int) -> None:
        """Keep the hashes of the first n tokens' prefixes."""
        del self._hashes[n + 1 :]

    def copy(self) -> PrefixHashes:
        """An independent copy (one memcpy of 8 bytes a token)."""
        out = PrefixHashes()
        out._hashes = array("Q", self._hashes)
        return out

    def extend_from(self, other: PrefixHashes, n: int) -> None:
        """Cover the first n tokens of `other`'s sequence, which continues this one's (no hashing)."""
        self._hashes.extend(other._hashes[len(self._hashes) : n + 1])


def shared_prefix(a: PrefixHashes, b: PrefixHashes, limit: int) -> int:
    """The longest n <= limit with a.at(n) == b.at(n): the two sequences' common prefix, found with
    O(log limit) hash comparisons (a prefix that differs once differs for every longer n)."""
    if a.at(limit) == b.at(limit):
        return limit
    lo, hi = 0, limit - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a.at(mid) == b.at(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
