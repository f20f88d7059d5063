"""Adaptive k: choose each round's draft length to maximise expected tokens per second.

For a round with k draft tokens:
    E[tokens](k) = 1 + sum_{i=1..k} prod_{j<=i} a_j          (the +1 is the recovered/bonus token)
    E[time](k)   = v(k+1) + (k > 0) * (k * c + o_draft) + o
where a_j is the session's running acceptance rate at draft position j (given positions < j were
accepted), c the cost of one draft step, v(n) the cost of verifying n tokens, o_draft the draft hop's
overhead and o the rest of a round. k = 0 is always a candidate, so speculation backs off when it does not
pay; after a run of k = 0 rounds one round probes a short draft (PROBE_K), and a probe that accepts nothing
doubles the run before the next one (up to PROBE_EVERY_MAX).

Costs belong to the deployment and are shared by an orchestrator's sessions (`CostModel`); acceptance is per
session (`AcceptanceTracker`); both are kept per proposer (`ngram`, `model`), since a combined draft's lookup
and model differ in cost and depth of acceptance. Acceptance starts from an optimistic prior at position 1;
a deeper position leans on the one before it until it has data of its own.

Under load a target verifies many sessions in one pass: a pass costs a fixed part plus about m per token, so
v is measured per pass and keyed by the tokens the whole pass computed. With B sessions a pass, each
drafting k, every round waits for v(B·(k+1)); as batches fill, choose_k backs off towards k = 0 by itself,
while where extra tokens are nearly free (m ≈ 0) it keeps speculating. Time queued at the target is left out
of the overhead, since v(B·(k+1)) already prices it.

A generation's first round drafts nothing with a model draft (the draft would first prefill the whole prompt,
delaying the first token); an in-process lookup still drafts there.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

EMA_WEIGHT = 0.2  # weight of a new observation in running means
PRIOR_ACCEPTS, PRIOR_TRIES = 1.5, 2.0  # optimistic Beta prior at position 1 (a_1 = 0.75 before data)
LEAN_TRIES = 2.0  # weight (in tries) of position j-1's rate in position j's estimate
DECAY = 0.9  # older rounds count less: acceptance drifts with the context
PROBE_EVERY = 8  # rounds at k = 0 before the first probing round
PROBE_EVERY_MAX = 128  # the longest run of k = 0 rounds between probes (after failed probes)
PROBE_K = 2  # draft tokens of a probing round


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - EMA_WEIGHT) * old + EMA_WEIGHT * new


NO_DRAFT = ""  # the overhead key of rounds without a draft
ANY_DRAFT = "draft"  # the proposer when a caller does not tell them apart


@dataclass
class CostModel:
    """Measured costs of the pair, in milliseconds, shared across sessions.

    Draft step cost and per-round overhead are kept per proposer (`ngram`, `model`, ...);
    the overhead of rounds without a draft under NO_DRAFT.
    """

    verify_ms: dict[int, float] = field(default_factory=dict)  # tokens one target pass computed -> ms
    draft_step_ms: dict[str, float] = field(default_factory=dict)  # proposer -> ms per draft token
    overhead_ms: dict[str, float] = field(default_factory=dict)  # proposer or NO_DRAFT -> non-forward ms a round
    batch: float = 1.0  # sessions per target pass of recent rounds
    _sorted: tuple[dict, list[int]] = field(default=({}, []), repr=False, compare=False)  # _known()'s cache

    def observe_batch(self, size: int) -> None:
        """Account for the number of sessions the target verified in one round's forward pass (0: unknown)."""
        if size > 0:
            self.batch = (1 - EMA_WEIGHT) * self.batch + EMA_WEIGHT * size

    def observe(
        self,
        k: int,
        pass_tokens: int,
        draft_ms: float,
        target_ms: float,
        overhead_ms: float,
        proposer: str = ANY_DRAFT,
    ) -> None:
        """Account for one round: k tokens proposed by `proposer`, verified in a target pass that computed
        `pass_tokens` tokens (k + 1 alone; with the other sessions' tokens in a batch) in `target_ms`;
        `overhead_ms`: the round's time outside the forwards and the target's queue."""
        self.verify_ms[pass_tokens] = _ema(self.verify_ms.get(pass_tokens), target_ms)
        key = proposer if k > 0 else NO_DRAFT
        if k > 0:
            self.draft_step_ms[key] = _ema(self.draft_step_ms.get(key), draft_ms / k)
        self.overhead_ms[key] = _ema(self.overhead_ms.get(key), overhead_ms)

    def verify(self, n: float) -> float:
        """v(n), a pass computing n tokens: measured, or interpolated/extrapolated linearly from the measured
        points (between the nearest ones around n; beyond them, along the two largest)."""
        whole = int(n)
        if whole == n and whole in self.verify_ms:
            return self.verify_ms[whole]
        known = self._known()
        if not known:
            return 1.0
        if len(known) == 1:
            return self.verify_ms[known[0]]
        i = bisect.bisect_left(known, n)  # known[i - 1] < n < known[i]
        lo = known[i - 1] if i > 0 else known[0]
        hi = known[i] if i < len(known) else known[-1]
        if lo == hi:
            lo, hi = known[-2], known[-1]
        slope = (self.verify_ms[hi] - self.verify_ms[lo]) / (hi - lo)
        return max(self.verify_ms[lo] + slope * (n - lo), 0.0)

    def _known(self) -> list[int]:
        """verify_ms's pass sizes, sorted; re-sorted only when a size was added (every round calls verify)."""
        if self._sorted[0] is not self.verify_ms or len(self._sorted[1]) != len(self.verify_ms):
            self._sorted = (self.verify_ms, sorted(self.verify_ms))
        return self._sorted[1]

    def round_ms(self, k: int, proposer: str = ANY_DRAFT) -> float:
        """Expected wall time of a round with k draft tokens from `proposer` (a cost not yet measured
        counts as the no-draft overhead and a free draft step: optimistic, so it gets measured)."""
        key = proposer if k > 0 else NO_DRAFT
        base = self.overhead_ms.get(key, self.overhead_ms.get(NO_DRAFT, next(iter(self.overhead_ms.values()), 0.0)))
        draft = k * self.draft_step_ms.get(key, 0.0) if k > 0 else 0.0
        return self.pass_ms(k + 1) + draft + base

    def pass_ms(self, n: int) -> float:
        """The target pass a round scoring n tokens of this session waits for, when self.batch sessions share it
        each with about as many: v(batch·n) (module docstring). Alone it is v(n)."""
        return self.verify(n * max(1.0, self.batch))


@dataclass
class AcceptanceTracker:
    """Per-position acceptance of one session, decayed so that it follows the context."""

    k_max: int
    accepts: list[float] = field(default_factory=list)
    tries: list[float] = field(default_factory=list)
    rounds_at_zero: int = 0
    probe_every: int = PROBE_EVERY  # rounds at k = 0 before the next probe
    probing: bool = False  # the round in flight is a probe

    def __post_init__(self) -> None:
        # position 1 starts from the prior (it decays with the data); deeper ones from nothing (see rates)
        self.accepts = [PRIOR_ACCEPTS] + [0.0] * (self.k_max - 1)
        self.tries = [PRIOR_TRIES] + [0.0] * (self.k_max - 1)

    def observe(self, proposed: int, accepted: int) -> None:
        """Positions 1..accepted were accepted; position accepted+1 (if proposed) was rejected."""
        if self.probing:
            self.probing = False
            self.probe_every = PROBE_EVERY if accepted else min(2 * self.probe_every, PROBE_EVERY_MAX)
        for i in range(self.k_max):
            self.accepts[i] *= DECAY
            self.tries[i] *= DECAY
        for i in range(min(proposed, accepted + 1)):
            self.tries[i] += 1
            self.accepts[i] += i < accepted

    def rates(self) -> list[float]:
        """a_j per position: position 1 from the prior and its data, position j from its data and a_(j-1)."""
        out = [self.accepts[0] / self.tries[0]] if self.k_max else []
        for accepts, tries in zip(self.accepts[1:], self.tries[1:], strict=False):
            out.append((accepts + LEAN_TRIES * out[-1]) / (tries + LEAN_TRIES))
        return out

    def expected_tokens(self, k: int) -> float:
        """1 + sum over positions of the probability that all positions up to it are accepted."""
        return self.expected_tokens_upto(k)[k] if k <= self.k_max else self.expected_tokens_upto(self.k_max)[-1]

    def expected_tokens_upto(self, k_cap: int) -> list[float]:
        """[expected_tokens(k) for k in 0..k_cap] in one pass over the rates (k beyond k_max adds nothing)."""
        out, survive = [1.0], 1.0
        rates = self.rates()
        for k in range(k_cap):
            survive = survive * rates[k] if k < len(rates) else 0.0
            out.append(out[-1] + survive)
        return out


def best_k(costs: CostModel, acceptance: AcceptanceTracker, k_cap: int, proposer: str = ANY_DRAFT) -> int:
    """The k in [0, k_cap] with the most expected tokens per ms (no probing; changes no state)."""
    tokens = acceptance.expected_tokens_upto(k_cap)
    return max(range(k_cap + 1), key=lambda k: tokens[k] / max(costs.round_ms(k, proposer), 1e-6))


def choose_k(costs: CostModel, acceptance: AcceptanceTracker, k_cap: int, proposer: str = ANY_DRAFT) -> int:
    """The k in [0, k_cap] with the most expected tokens per ms for a draft from `proposer` (whose
    acceptance `acceptance` tracks), probing a short draft now and then."""
    if k_cap <= 0:
        return 0
    if acceptance.rounds_at_zero >= acceptance.probe_every:
        acceptance.rounds_at_zero = 0
        acceptance.probing = True
        return min(PROBE_K, k_cap)
    best = best_k(costs, acceptance, k_cap, proposer)
    acceptance.rounds_at_zero = acceptance.rounds_at_zero + 1 if best == 0 else 0
    return best
