"""Tokenizer identity: a stable fingerprint, a compact description, and compatibility checks.

Speculative decoding is only exact when draft and target map the same token ids
to the same strings, so both model services publish a :class:`TokenizerInfo`
and the orchestrator refuses a pair whose fingerprints differ.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from typing import Any

logger = logging.getLogger("specdec.models")

FINGERPRINT_VERSION = 1
#: Probe text rendered as the assistant turn to find the template's end-of-turn token.
_TEMPLATE_PROBE = "SPECDEC_PROBE_7f3a"
#: End-of-turn markers of common chat templates, used when rendering the template fails.
KNOWN_END_OF_TURN_TOKENS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<end_of_turn>",
    "<|end|>",
    "<|endoftext|>",
    "</s>",
    "<|end_of_text|>",
)
_MAX_LISTED_DIFFERENCES = 8


@dataclass(frozen=True)
class TokenizerInfo:
    """What two services must agree on about a tokenizer.

    Attributes:
        vocab_size: number of token ids the tokenizer can produce (``len(tokenizer)``).
        fingerprint: :func:`tokenizer_fingerprint` of the tokenizer.
        special_tokens: special token string -> id (named specials and special added tokens).
        bos_id: beginning-of-sequence id or None.
        eos_ids: sorted end-of-sequence ids (see :func:`eos_token_ids`).
        pad_id: padding id or None (SmolLM2's pad id equals its EOS id).
    """

    vocab_size: int
    fingerprint: str
    special_tokens: dict[str, int] = field(default_factory=dict)
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    pad_id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-serialisable dict (for metadata exchanged between services)."""
        data = asdict(self)
        data["eos_ids"] = list(self.eos_ids)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TokenizerInfo:
        """Rebuild a TokenizerInfo from :meth:`to_dict` output."""
        return cls(
            vocab_size=int(data["vocab_size"]),
            fingerprint=str(data["fingerprint"]),
            special_tokens={str(k): int(v) for k, v in data.get("special_tokens", {}).items()},
            bos_id=data.get("bos_id"),
            eos_ids=tuple(int(i) for i in data.get("eos_ids", ())),
            pad_id=data.get("pad_id"),
        )


def special_token_ids(tokenizer: Any) -> dict[str, int]:
    """Return every special token string -> id: named specials plus added tokens flagged special."""
    specials: dict[str, int] = {}
    for token in getattr(tokenizer, "all_special_tokens", []) or []:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int):
            specials[str(token)] = token_id
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    for token_id, added in decoder.items():
        if getattr(added, "special", False):
            specials[str(added.content)] = int(token_id)
    return dict(sorted(specials.items(), key=lambda item: (item[1], item[0])))


def _named_special_ids(tokenizer: Any) -> list[tuple[str, str, int | None]]:
    """Return sorted (role, token, id) for bos/eos/pad/unk/... as the tokenizer names them."""
    named = []
    for role, token in sorted((getattr(tokenizer, "special_tokens_map", {}) or {}).items()):
        tokens = token if isinstance(token, list) else [token]
        for item in tokens:
            named.append((role, str(item), tokenizer.convert_tokens_to_ids(str(item))))
    return named


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """Return a sha256 hex digest identifying a tokenizer's id space, stable across processes.

    Hashed (as canonical JSON): the vocabulary sorted by token (token -> id, added
    tokens included), the special tokens with their ids (named roles such as
    bos/eos/pad and added tokens flagged special), and ``len(tokenizer)``.
    Normalisation/pre-tokenisation rules are not hashed: two tokenizers with the same
    id space but different splitting rules get the same fingerprint.
    """
    payload = {
        "version": FINGERPRINT_VERSION,
        "vocab": sorted(tokenizer.get_vocab().items()),
        "special_tokens": sorted(special_token_ids(tokenizer).items()),
        "named_special": _named_special_ids(tokenizer),
        "size": len(tokenizer),
    }
    blob = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _as_id_list(value: Any) -> list[int]:
    """Normalise an int, a list of ints or None to a list of ints."""
    if value is None:
        return []
    if isinstance(value, (list, tuple, set)):
        return [int(v) for v in value if v is not None]
    return [int(value)]


def _end_of_turn_by_rendering(tokenizer: Any, specials: dict[str, int]) -> int | None:
    """Render a probe conversation; return the special token right after the assistant text."""
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": _TEMPLATE_PROBE},
    ]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except (ValueError, TypeError, KeyError, AttributeError, RuntimeError) as exc:
        logger.debug("chat template could not render a probe conversation: %s", exc)
        return None
    if not isinstance(text, str) or _TEMPLATE_PROBE not in text:
        return None
    suffix = text.split(_TEMPLATE_PROBE, 1)[1].lstrip()
    for token in sorted(specials, key=len, reverse=True):
        if token and suffix.startswith(token):
            return specials[token]
    return None


def _end_of_turn_by_scanning(template: str, specials: dict[str, int]) -> int | None:
    """Return the first known end-of-turn marker that the template text mentions and is special."""
    for token in KNOWN_END_OF_TURN_TOKENS:
        if token in template and token in specials:
            return specials[token]
    return None


def chat_end_of_turn_id(tokenizer: Any) -> int | None:
    """Return the chat template's end-of-turn token id if it is a special token, else None."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or not template:
        return None
    specials = special_token_ids(tokenizer)
    found = _end_of_turn_by_rendering(tokenizer, specials)
    return found if found is not None else _end_of_turn_by_scanning(template, specials)


def eos_token_ids(model: Any | None, tokenizer: Any) -> list[int]:
    """Return the sorted ids that end generation for this model/tokenizer pair.

    Rule: the union of
      1. ``model.generation_config.eos_token_id`` (an int or a list; skipped when
         ``model`` is None or has no generation config),
      2. ``tokenizer.eos_token_id``, and
      3. the chat template's end-of-turn token (e.g. ``<|im_end|>``, ``<|eot_id|>``,
         ``<end_of_turn>``) when it is a special token: found by rendering a probe
         assistant turn and taking the special token right after it, falling back to
         scanning the template for well-known markers.
    """
    ids: set[int] = set()
    generation_config = getattr(model, "generation_config", None) if model is not None else None
    if generation_config is not None:
        ids.update(_as_id_list(getattr(generation_config, "eos_token_id", None)))
    ids.update(_as_id_list(getattr(tokenizer, "eos_token_id", None)))
    end_of_turn = chat_end_of_turn_id(tokenizer)
    if end_of_turn is not None:
        ids.add(end_of_turn)
    return sorted(ids)


def describe_tokenizer(tokenizer: Any, model: Any | None = None) -> TokenizerInfo:
    """Summarise a tokenizer (and optionally its model's EOS ids) as a :class:`TokenizerInfo`."""
    return TokenizerInfo(
        vocab_size=len(tokenizer),
        fingerprint=tokenizer_fingerprint(tokenizer),
        special_tokens=special_token_ids(tokenizer),
        bos_id=getattr(tokenizer, "bos_token_id", None),
        eos_ids=tuple(eos_token_ids(model, tokenizer)),
        pad_id=getattr(tokenizer, "pad_token_id", None),
    )


def _special_differences(a: TokenizerInfo, b: TokenizerInfo, a_name: str, b_name: str) -> list[str]:
    """List special tokens missing on one side or mapped to different ids."""
    diffs = []
    for token in sorted(set(a.special_tokens) | set(b.special_tokens)):
        a_id, b_id = a.special_tokens.get(token), b.special_tokens.get(token)
        if a_id == b_id:
            continue
        if a_id is None:
            diffs.append(f"{token} only in {b_name} (id {b_id})")
        elif b_id is None:
            diffs.append(f"{token} only in {a_name} (id {a_id})")
        else:
            diffs.append(f"{token} is id {a_id} in {a_name} but {b_id} in {b_name}")
    if len(diffs) > _MAX_LISTED_DIFFERENCES:
        hidden = len(diffs) - _MAX_LISTED_DIFFERENCES
        diffs = diffs[:_MAX_LISTED_DIFFERENCES] + [f"and {hidden} more"]
    return diffs


def compare_tokenizers(a: TokenizerInfo, b: TokenizerInfo, a_name: str, b_name: str) -> str | None:
    """Return None when the tokenizers are interchangeable, else a one-line reason naming both.

    The reason says what differs: the vocabulary size, which special tokens (missing
    or with other ids), or -- when both agree -- only the fingerprint (the ordinary
    vocabulary maps some token to another id).
    """
    if a.fingerprint == b.fingerprint:
        return None
    head = f"tokenizers of {a_name} and {b_name} differ"
    reasons = []
    if a.vocab_size != b.vocab_size:
        reasons.append(f"vocabulary size {a.vocab_size} ({a_name}) vs {b.vocab_size} ({b_name})")
    specials = _special_differences(a, b, a_name, b_name)
    if specials:
        reasons.append("special tokens: " + "; ".join(specials))
    if not reasons:
        reasons.append(
            f"same size and special tokens but different vocabularies "
            f"(fingerprint {a.fingerprint[:12]} vs {b.fingerprint[:12]})"
        )
    return f"{head}: " + "; ".join(reasons)
