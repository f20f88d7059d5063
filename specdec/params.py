"""The ONE table of request defaults, shared by gRPC, the CLI and the HTTP API.

Every request parameter is a proto3 `optional` field: unset means "the value
in DEFAULTS below", never 0. The CLI leaves a flag unset when the user did not
give it, and the HTTP front maps a missing JSON field to unset, so the three
entry points behave the same. Note: temperature defaults to 0 (greedy, output
identical to the target alone), unlike OpenAI's 1.0; pass temperature
explicitly to sample.

Limits (max k, max new tokens, ...) are configuration (specdec.config.Limits),
not defaults: a request over a limit is INVALID_ARGUMENT.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from specdec.config import Limits
from specdec.core.sampling import SamplingConfig
from specdec.errors import InvalidArgument

SEED_BITS = 63

DEFAULTS: dict[str, Any] = {
    # generation
    "max_new_tokens": 128,
    "k": 4,  # draft tokens per round; 0 = target-only decoding
    "draft_kind": "",  # "" = the draft service's own kind
    "trace": False,
    "ignore_eos": False,
    "min_tokens": 0,
    "logprobs": -1,  # -1 = no logprobs; 0 = chosen token only; n = top-n too
    "add_generation_prompt": True,
    "create_session": False,
    "resume_offset": 0,
    # true: k is the cap; each round picks k in [0, k] from the measured costs and acceptance (orchestrator/adaptive.py),
    # k = 0 among them, so speculation backs off where it does not pay; false: every round drafts k. None (unset):
    # on for a greedy request that names no k (the default configuration); off when it asks for a k (it gets that
    # k), and for sampling, whose tokens for a seed depend on each round's k (a timing-priced k would make a seeded
    # request's output vary from run to run).
    "adaptive_k": None,
    "max_rounds": 0,  # 0 = no cap beyond max_new_tokens (every round yields >= 1 token)
    # sampling (applied identically by draft and target)
    "temperature": 0.0,
    "top_k": 0,
    "top_p": 1.0,
    "seed": None,  # None = a fresh random seed per request (returned in the session)
    "repetition_penalty": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "draft_top_n": 16,
}

SAMPLING_FIELDS = (
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "draft_top_n",
)
MODEL, NGRAM, COMBINED = "model", "ngram", "combined"  # draft kinds
DRAFT_KINDS = ("", MODEL, NGRAM, COMBINED)
MODEL_DRAFT_KINDS = (MODEL, COMBINED)  # kinds that need draft weights


def field_or_default(message: Any, name: str, defaults: dict[str, Any] = DEFAULTS) -> Any:
    """Value of an optional proto field, or the table's default when unset."""
    if message is not None and message.HasField(name):
        return getattr(message, name)
    return defaults[name]


@dataclass(frozen=True)
class GenerationParams:
    """Everything one generation needs, resolved against DEFAULTS and validated."""

    max_new_tokens: int
    k: int
    draft_kind: str
    sampling: SamplingConfig
    stop: tuple[str, ...] = ()
    trace: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int = -1
    add_generation_prompt: bool = True
    max_rounds: int = 0
    adaptive_k: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def resolve_sampling(message: Any) -> SamplingConfig:
    """SamplingParams proto (or None) -> validated SamplingConfig (INVALID_ARGUMENT when impossible)."""
    values = {name: field_or_default(message, name) for name in SAMPLING_FIELDS}
    if values["seed"] is None:
        values["seed"] = secrets.randbits(SEED_BITS)
    try:
        return SamplingConfig(**values).validate()
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


def resolve_generation(request: Any, limits: Limits) -> GenerationParams:
    """GenerateRequest proto -> validated GenerationParams (INVALID_ARGUMENT on bad values)."""
    get = lambda name: field_or_default(request, name)  # noqa: E731
    max_new = get("max_new_tokens")
    if not 1 <= max_new <= limits.max_new_tokens:
        raise InvalidArgument(f"max_new_tokens must be in [1, {limits.max_new_tokens}], got {max_new}")
    k = get("k")
    if not 0 <= k <= limits.max_k:
        raise InvalidArgument(f"k must be in [0, {limits.max_k}] (0 = target-only), got {k}")
    draft_kind = get("draft_kind")
    if draft_kind not in DRAFT_KINDS:
        kinds = ", ".join(repr(kind) for kind in DRAFT_KINDS if kind)
        raise InvalidArgument(f"draft_kind must be one of {kinds} or unset, got {draft_kind!r}")
    stop = tuple(request.stop)
    _validate_stops(stop, limits)
    min_tokens, logprobs = get("min_tokens"), get("logprobs")
    if min_tokens < 0 or min_tokens > max_new:
        raise InvalidArgument(f"min_tokens must be in [0, max_new_tokens={max_new}], got {min_tokens}")
    if request.HasField("logprobs") and not 0 <= logprobs <= limits.max_logprobs:  # unset = -1 = none
        raise InvalidArgument(f"logprobs must be in [0, {limits.max_logprobs}], got {logprobs}")
    max_rounds = get("max_rounds")
    if max_rounds < 0:
        raise InvalidArgument(f"max_rounds must be >= 0 (0 = no cap), got {max_rounds}")
    sampling = resolve_sampling(request.sampling if request.HasField("sampling") else None)
    adaptive = get("adaptive_k")
    if adaptive is None:
        adaptive = not request.HasField("k") and sampling.greedy
    return GenerationParams(
        max_rounds=max_rounds,
        adaptive_k=adaptive,
        max_new_tokens=max_new,
        k=k,
        draft_kind=draft_kind,
        sampling=sampling,
        stop=stop,
        trace=get("trace"),
        ignore_eos=get("ignore_eos"),
        min_tokens=min_tokens,
        logprobs=logprobs,
        add_generation_prompt=get("add_generation_prompt"),
    )


def _validate_stops(stop: tuple[str, ...], limits: Limits) -> None:
    if len(stop) > limits.max_stop_strings:
        raise InvalidArgument(f"at most {limits.max_stop_strings} stop strings, got {len(stop)}")
    for s in stop:
        if not s:
            raise InvalidArgument("stop strings must not be empty")
        if len(s) > limits.max_stop_chars:
            raise InvalidArgument(f"a stop string is longer than {limits.max_stop_chars} characters")
