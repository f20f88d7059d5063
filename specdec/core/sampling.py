"""Logits -> probabilities, identical processing for the draft and the target model.

Vocabulary used throughout the project:

* **draft** - the small model that proposes k candidate tokens d1..dk;
* **target** - the large model whose output distribution must be preserved exactly;
* **accepted** - a draft token kept by the accept rule;
* **recovered** - the token the target supplies at the first rejection;
* **bonus** - the extra token sampled from the target when all k drafts are accepted.

``p`` is the target distribution and ``q`` the draft distribution. Both models run the
*same* functions of this module (penalties, temperature, top-k, top-p) so that ``p`` and
``q`` are comparable; the draft additionally truncates ``q`` to its top-N support ``q'``
(:func:`truncate_top_n`) and samples from ``q'`` - that sparse ``q'`` is what travels over
the wire and what the accept rule must see.

Randomness is never global: every draw uses a fresh CPU ``torch.Generator`` derived from
``(seed, absolute token position, purpose)`` by :func:`draw_generator`, so a session resumed
on another machine reproduces the same draws.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch

GREEDY_TEMPERATURE = 0.0
TOP_K_OFF = 0
TOP_P_OFF = 1.0
PENALTY_OFF = 1.0
ADDITIVE_PENALTY_OFF = 0.0
DEFAULT_DRAFT_TOP_N = 16
GREEDY_TOP_K = 1
# Penalty ranges: OpenAI's (and vLLM's) [-2, 2] for the additive ones; the repetition penalty divides
# (or multiplies) logits, so it is kept where float32 scores cannot overflow to inf.
ADDITIVE_PENALTY_RANGE = (-2.0, 2.0)
REPETITION_PENALTY_RANGE = (1e-2, 1e2)

SEED_DIGEST_BYTES = 8
SEED_BITS = 63
SEED_MASK = (1 << SEED_BITS) - 1
PURPOSES = ("draft", "accept", "recover", "bonus")

PROBS_DTYPE = torch.float32
COUNTS_DTYPE = torch.float32

# Per-row token histories: a [n, V] count tensor, or one list of token ids per row.
History = torch.Tensor | Sequence[Sequence[int]]
GeneratorFactory = Callable[[int, str], torch.Generator]


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling settings shared by the draft and the target.

    temperature: 0 means greedy (argmax); top_k: 0 is off; top_p: 1.0 is off;
    seed: base of every random draw (None only makes sense for greedy decoding);
    repetition_penalty: 1.0 is off (HF/CTRL style); frequency_penalty / presence_penalty:
    0 is off (OpenAI style); draft_top_n: size N of the sparse draft distribution q'.
    """

    temperature: float = GREEDY_TEMPERATURE
    top_k: int = TOP_K_OFF
    top_p: float = TOP_P_OFF
    seed: int | None = None
    repetition_penalty: float = PENALTY_OFF
    frequency_penalty: float = ADDITIVE_PENALTY_OFF
    presence_penalty: float = ADDITIVE_PENALTY_OFF
    draft_top_n: int = DEFAULT_DRAFT_TOP_N

    @property
    def greedy(self) -> bool:
        """True when decoding is deterministic argmax (temperature 0 or top_k 1)."""
        return self.temperature == GREEDY_TEMPERATURE or self.top_k == GREEDY_TOP_K

    @property
    def has_penalties(self) -> bool:
        """True when any of the three penalties changes the logits."""
        return (
            self.repetition_penalty != PENALTY_OFF
            or self.frequency_penalty != ADDITIVE_PENALTY_OFF
            or self.presence_penalty != ADDITIVE_PENALTY_OFF
        )

    def validate(self) -> SamplingConfig:
        """Raise ``ValueError`` with a human-readable message if a field is invalid; return self."""
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{f.name} must be a finite number, got {value!r}")
        for name in ("top_k", "draft_top_n"):
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"{name} must be an integer, got {getattr(self, name)!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        if not 0 < self.top_p <= TOP_P_OFF:
            raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.draft_top_n < 1:
            raise ValueError(f"draft_top_n must be >= 1, got {self.draft_top_n}")
        low, high = REPETITION_PENALTY_RANGE
        if not low <= self.repetition_penalty <= high:
            raise ValueError(
                f"repetition_penalty must be in [{low}, {high}] (1 disables it), got {self.repetition_penalty}"
            )
        low, high = ADDITIVE_PENALTY_RANGE
        for name in ("frequency_penalty", "presence_penalty"):
            if not low <= getattr(self, name) <= high:
                raise ValueError(f"{name} must be in [{low}, {high}] (0 disables it), got {getattr(self, name)}")
        return self


# ----------------------------------------------------------------------------- penalties


def token_counts(history_ids: Sequence[int] | torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Count occurrences of each token id in ``history_ids``; returns ``[vocab_size]`` float32.

    Ids outside ``[0, vocab_size)`` are ignored: a model cannot penalise a token it does not
    have (e.g. target-only padding ids seen by a narrower draft vocabulary).
    """
    ids = torch.as_tensor(history_ids, dtype=torch.int64).reshape(-1)
    ids = ids[(ids >= 0) & (ids < vocab_size)]
    return torch.bincount(ids, minlength=vocab_size).to(COUNTS_DTYPE)


def position_counts(base_counts: torch.Tensor, draft_ids: torch.Tensor) -> torch.Tensor:
    """Per-position histories for the k+1 rows of a speculative round.

    base_counts: ``[V]`` counts of the context; draft_ids: ``[k]`` int64.
    Returns ``[k+1, V]``: row i = context + d1..di (row 0 is the context alone), i.e. the
    history in force when the token at row i is produced. Draft ids outside ``[0, V)`` are
    ignored as in :func:`token_counts`. The draft, generating one token at a time, may
    instead keep one vector and add 1 at each drafted id: the values are identical.
    """
    vocab_size = base_counts.shape[-1]
    ids = torch.as_tensor(draft_ids, dtype=torch.int64).reshape(-1)
    inside = (ids >= 0) & (ids < vocab_size)
    steps = torch.zeros(ids.numel() + 1, vocab_size, dtype=COUNTS_DTYPE)
    rows = torch.arange(1, ids.numel() + 1)[inside]
    steps[rows, ids[inside]] = 1.0
    return base_counts.to(COUNTS_DTYPE).unsqueeze(0) + steps.cumsum(dim=0)


def _history_counts(history: History, n_rows: int, vocab_size: int) -> torch.Tensor:
    """Normalise a :data:`History` to a ``[n_rows, vocab_size]`` float32 count tensor."""
    if isinstance(history, torch.Tensor):
        counts = history.to(COUNTS_DTYPE)
        if counts.dim() == 1:
            counts = counts.unsqueeze(0).expand(n_rows, -1)
    else:
        if len(history) != n_rows:
            raise ValueError(f"got {len(history)} histories for {n_rows} logit rows")
        counts = torch.stack([token_counts(h, vocab_size) for h in history])
    if tuple(counts.shape) != (n_rows, vocab_size):
        raise ValueError(f"counts shape {tuple(counts.shape)} != logits shape {(n_rows, vocab_size)}")
    return counts


def apply_penalties(
    logits: torch.Tensor,  # [n, V]
    history: History,  # [n, V] counts (or [V], shared) | one id list per row
    cfg: SamplingConfig,
) -> torch.Tensor:  # [n, V] float32
    """Apply repetition, frequency and presence penalties; returns new float32 logits.

    Repetition (HF/CTRL): for tokens present in the history, positive logits are divided by
    the penalty and negative ones multiplied by it. Frequency/presence (OpenAI): subtract
    ``frequency_penalty * count + presence_penalty * (count > 0)``. Use
    :func:`position_counts` to build the k+1 per-position histories of a round.
    """
    out = logits.to(PROBS_DTYPE)
    if not cfg.has_penalties:
        return out.clone()
    counts = _history_counts(history, out.shape[0], out.shape[-1])
    present = counts > 0
    if cfg.repetition_penalty != PENALTY_OFF:
        penalised = torch.where(out > 0, out / cfg.repetition_penalty, out * cfg.repetition_penalty)
        out = torch.where(present, penalised, out)
    return out - cfg.frequency_penalty * counts - cfg.presence_penalty * present.to(PROBS_DTYPE)


# ----------------------------------------------------------------------------- warpers


def _mask_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:  # [n, V] -> [n, V]
    """Set logits below the k-th largest to -inf (ties with the k-th value are kept)."""
    if top_k == TOP_K_OFF or top_k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, -math.inf)


def _mask_top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:  # [n, V] -> [n, V]
    """Keep the smallest highest-probability set whose mass >= top_p (never empty); renormalise."""
    if top_p >= TOP_P_OFF:
        return probs
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    keep_sorted = mass_before < top_p  # the first token always has mass_before == 0
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = probs.masked_fill(~keep, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def argmax_rows(scores: torch.Tensor) -> torch.Tensor:  # [..., V] -> [...] int64
    """``torch.argmax(scores, dim=-1)``: the first maximal index of each row (ties -> lowest id).

    On CPU float tensors it runs through NumPy, whose argmax gives the same indices (the first
    maximum) about 10x faster than torch's CPU kernel here: 20 us vs 237 us for a [9, 49152]
    float32 verify pass -- a cost paid on every greedy round, outside the model forward.
    """
    if scores.device.type == "cpu" and scores.dtype in (torch.float32, torch.float64):
        return torch.from_numpy(np.asarray(_numpy_argmax(scores), dtype=np.int64))
    return torch.argmax(scores, dim=-1)


def argmax_ids(scores: torch.Tensor) -> list[int]:  # [n, V] -> n ids
    """``argmax_rows(scores).tolist()`` without the tensor in between: after a model forward every torch
    op runs with cold caches (~40 us each on CPU), and a round's accept rule needs only the ids."""
    if scores.device.type == "cpu" and scores.dtype in (torch.float32, torch.float64):
        return _numpy_argmax(scores).tolist()
    return argmax_rows(scores).tolist()


def argmax_until_mismatch(scores: torch.Tensor, draft: Sequence[int]) -> list[int]:  # [k+1, V], k ids
    """The argmax of rows 0..m, where m is the first row whose argmax is not ``draft[m]`` (k if none): the
    greedy accept rule's reads, and no more. On CPU row by row, so rows after a rejection are never read
    (each is ≈ 200 KB of logits, cache-cold after the forward); elsewhere one call, cut after row m.

    The CPU path asks the tensor nothing but its NumPy view: right after a forward each attribute read of
    the tensor (device, dtype, requires_grad) costs several microseconds cold."""
    try:
        rows = scores.numpy()
    except (TypeError, RuntimeError):  # not viewable by NumPy: CUDA, bfloat16, or requires grad
        ids = argmax_ids(scores)
        mismatch = next((i for i, (d, t) in enumerate(zip(draft, ids)) if d != t), len(draft))
        return ids[: mismatch + 1]
    ids = [int(np.argmax(rows[0]))]
    while len(ids) <= len(draft) and ids[-1] == draft[len(ids) - 1]:
        ids.append(int(np.argmax(rows[len(ids)])))
    return ids


def _numpy_argmax(scores: torch.Tensor) -> np.ndarray:
    return np.argmax((scores.detach() if scores.requires_grad else scores).numpy(), axis=-1)


def greedy_one_hot(logits: torch.Tensor) -> torch.Tensor:  # [n, V] -> [n, V] float32
    """One-hot of the argmax of each row (ties -> lowest id, as ``torch.argmax``)."""
    winners = argmax_rows(logits.to(PROBS_DTYPE))
    one_hot = torch.zeros(logits.shape, dtype=PROBS_DTYPE, device=logits.device)
    return one_hot.scatter_(-1, winners.to(logits.device).unsqueeze(-1), 1.0)


def penalised_scores(
    logits: torch.Tensor,  # [n, V]
    cfg: SamplingConfig,
    history: History | None = None,  # see apply_penalties; None = no penalties
) -> torch.Tensor:  # [n, V] float32
    """The logits after the penalties (if ``history``): for a greedy config, each row's argmax is the
    token `logits_to_probs` puts its one-hot on, so the greedy accept rule can take these directly."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be [n, V], got shape {tuple(logits.shape)}")
    scores = logits if logits.dtype == PROBS_DTYPE else logits.to(PROBS_DTYPE)
    return scores if history is None else apply_penalties(scores, history, cfg)


def logits_to_probs(
    logits: torch.Tensor,  # [n, V]
    cfg: SamplingConfig,
    history: History | None = None,  # see apply_penalties; None = no penalties
) -> torch.Tensor:  # [n, V] float32
    """Processed distribution: penalties (if ``history``), temperature, top-k, top-p, softmax.

    Greedy configs (:attr:`SamplingConfig.greedy`) return a one-hot of the argmax of the
    (penalised) logits. Both the draft and the target must call this with the same ``cfg``.
    """
    scores = penalised_scores(logits, cfg, history)
    if cfg.greedy:
        return greedy_one_hot(scores)
    scaled = scores / cfg.temperature
    if not bool(torch.isfinite(scaled).all()):  # a tiny temperature overflowed: the same softmax, shifted first
        scaled = (scores - scores.amax(dim=-1, keepdim=True)) / cfg.temperature
    scores = _mask_top_k(scaled, cfg.top_k)
    probs = torch.softmax(scores, dim=-1)
    return _mask_top_p(probs, cfg.top_p)


# ----------------------------------------------------------------------------- sparse q'


def truncate_top_n(
    probs: torch.Tensor,
    n_keep: int,  # [n, V]
) -> tuple[torch.Tensor, torch.Tensor]:  # ([n, N] int64, [n, N] float32)
    """The sparse draft distribution q': the top-N support of each row, renormalised.

    N = min(n_keep, V). Ids are sorted by decreasing probability; entries may be 0 when a
    row has fewer than N non-zero probabilities (e.g. greedy one-hots).
    """
    if n_keep < 1:
        raise ValueError(f"n_keep must be >= 1, got {n_keep}")
    top = torch.topk(probs.to(PROBS_DTYPE), min(n_keep, probs.shape[-1]), dim=-1, sorted=True)
    kept = top.values / top.values.sum(dim=-1, keepdim=True)
    return top.indices.to(torch.int64), kept


def sparse_to_dense(
    ids: torch.Tensor,
    probs: torch.Tensor,
    width: int,  # [n, N] int64, [n, N] float32
) -> torch.Tensor:  # [n, width] float32
    """Scatter a sparse distribution back into a dense ``[n, width]`` float32 tensor."""
    ids = torch.as_tensor(ids, dtype=torch.int64)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= width):
        raise ValueError(f"sparse ids must lie in [0, {width}), got range [{int(ids.min())}, {int(ids.max())}]")
    dense = torch.zeros(ids.shape[0], width, dtype=PROBS_DTYPE)
    return dense.scatter_(-1, ids, torch.as_tensor(probs, dtype=PROBS_DTYPE))


# ----------------------------------------------------------------------------- randomness


def derive_seed(seed: int, position: int, purpose: str) -> int:
    """Stable 63-bit seed from (seed, absolute position, purpose) via blake2b."""
    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {PURPOSES}, got {purpose!r}")
    key = f"{int(seed)}:{int(position)}:{purpose}".encode()
    digest = hashlib.blake2b(key, digest_size=SEED_DIGEST_BYTES).digest()
    return int.from_bytes(digest, "big") & SEED_MASK


def draw_generator(seed: int, position: int, purpose: str) -> torch.Generator:
    """A fresh CPU generator for one draw.

    ``position`` is the absolute index (prompt included) of the token being drawn or
    decided; ``purpose`` is one of "draft", "accept", "recover", "bonus".
    """
    generator = torch.Generator(device="cpu")
    generator.manual_seed(derive_seed(seed, position, purpose))
    return generator


def round_generators(seed: int, first_position: int) -> GeneratorFactory:
    """Generator factory for one round.

    Returns ``(i, purpose) -> draw_generator(seed, first_position + i, purpose)``.

    ``first_position`` is the absolute position of the first token the round produces
    (= context length), so row i of the target probabilities maps to ``first_position + i``.
    """

    def factory(index: int, purpose: str) -> torch.Generator:
        return draw_generator(seed, first_position + index, purpose)

    return factory


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:  # probs: [V]
    """Draw one token id from ``probs`` (non-negative, need not be normalised)."""
    return int(torch.multinomial(probs.to(PROBS_DTYPE), 1, generator=generator).item())
