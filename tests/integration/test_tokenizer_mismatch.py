"""A draft whose tokenizer differs from the target's is refused: health NOT_SERVING,
requests FAILED_PRECONDITION with a message naming both models and what differs."""

from __future__ import annotations

import grpc
import pytest

from specdec.launcher import StackConfig
from specdec.models.tiny import build_tiny_causal_lm
from specdec.v1 import orchestrator_pb2 as pb
from tests.prompts import IDENTITY_PROMPTS
from tests.support import make_tiny_pair, refused_generate, smollm2_tokenizer

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def save_other_vocab_draft(directory) -> None:
    """A tiny draft whose tokenizer has one extra special token (vocabulary 49,153)."""
    tok = smollm2_tokenizer()
    tok = tok.__class__.from_pretrained(tok.name_or_path)
    tok.add_special_tokens({"additional_special_tokens": ["<|draft_only|>"]})
    model = build_tiny_causal_lm(tok, seed=3)
    model.save_pretrained(str(directory))
    tok.save_pretrained(str(directory))


def test_incompatible_draft_is_refused_with_a_clear_message(tmp_path, redis_server):
    target_dir, _ = make_tiny_pair(tmp_path / "pair", IDENTITY_PROMPTS)
    other = tmp_path / "other-draft"
    save_other_vocab_draft(other)
    err = refused_generate(
        StackConfig(
            target_model=str(target_dir), draft_model=str(other), draft_kind="model", redis_url=redis_server.url
        ),
        pb.GenerateRequest(prompt="hello", max_new_tokens=4),
        30,
    )
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    message = err.details()
    print("\n" + message)
    assert "differ" in message and "vocabulary size 49152" in message and "49153" in message
    assert str(other) in message and str(target_dir) in message
