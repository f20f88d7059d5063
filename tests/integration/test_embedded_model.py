"""The embedded SmolLM2-135M GGUF: offline load, converted cache, tokenizer quirks, tiny pairs.

Slow (one GGUF dequantisation, ~15 s on 2 CPU threads). Outbound INET sockets are blocked
and offline mode is on, so nothing here can reach a hub.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
import torch

from specdec.models import gguf_cache
from specdec.models.loader import LoadConfig, LoadedModel, load_causal_lm, load_tokenizer
from specdec.models.resolve import embedded_gguf_path
from specdec.models.tiny import build_tiny_causal_lm, save_tiny_pair
from specdec.models.tokenizer_info import (
    compare_tokenizers,
    describe_tokenizer,
    eos_token_ids,
    tokenizer_fingerprint,
)

pytestmark = pytest.mark.slow

TEST_THREADS = 2
SMOLLM2_VOCAB = 49152
SMOLLM2_EOS = 2  # <|im_end|>; also its pad token
MAX_NEW_TOKENS = 24
TINY_NEW_TOKENS = 32


@pytest.fixture(scope="module", autouse=True)
def no_network() -> Any:
    """Fail any outbound INET connection for the whole module."""
    real_connect = socket.socket.connect

    def guarded(self: socket.socket, address: Any) -> Any:
        """Refuse INET connects; let local (AF_UNIX) sockets through."""
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise OSError(f"network disabled in tests (connect to {address!r})")
        return real_connect(self, address)

    socket.socket.connect = guarded  # type: ignore[method-assign]
    yield
    socket.socket.connect = real_connect  # type: ignore[method-assign]


@pytest.fixture(scope="module")
def cfg(tmp_path_factory: pytest.TempPathFactory) -> LoadConfig:
    """Offline CPU fp32 config with a fresh cache dir (so the first load really converts)."""
    torch.set_num_threads(TEST_THREADS)
    cache = tmp_path_factory.mktemp("specdec-cache")
    return LoadConfig(device="cpu", dtype="float32", cache_dir=str(cache), offline=True, threads=TEST_THREADS)


@pytest.fixture(scope="module")
def loads(cfg: LoadConfig) -> tuple[LoadedModel, LoadedModel]:
    """Load the embedded model twice: a converting load, then a cached load."""
    first = load_causal_lm("embedded", cfg)
    second = load_causal_lm("embedded:smollm2", cfg)
    print(f"\nembedded SmolLM2: first load {first.load_seconds:.1f} s, cached load {second.load_seconds:.2f} s")
    return first, second


def test_converted_cache_written_and_reused(cfg: LoadConfig, loads: tuple[LoadedModel, LoadedModel]) -> None:
    """First load converts and writes <cache>/converted/<sha16>/; the second reads it."""
    first, second = loads
    assert first.from_cache is False and second.from_cache is True
    assert first.model_id == second.model_id == "embedded:smollm2"
    converted = list((cfg.cache_root() / "converted").iterdir())
    dirs = [p for p in converted if p.is_dir()]
    assert len(dirs) == 1 and len(dirs[0].name) == gguf_cache.HASH_PREFIX_HEX
    assert not [p for p in converted if p.name.startswith(gguf_cache.TMP_PREFIX)]
    marker = json.loads((dirs[0] / gguf_cache.CONVERSION_MARKER).read_text())
    assert marker["sha256"].startswith(dirs[0].name)
    assert (dirs[0] / "config.json").is_file() and (dirs[0] / "tokenizer.json").is_file()
    state_a, state_b = first.model.state_dict(), second.model.state_dict()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)


def test_model_is_ready(loads: tuple[LoadedModel, LoadedModel]) -> None:
    """eval mode, fp32 on CPU, a plain Llama with full attention; greedy chat answer is sane."""
    model, tokenizer = loads[1].model, loads[1].tokenizer
    assert not model.training and model.dtype == torch.float32 and model.device.type == "cpu"
    assert model.config.model_type == "llama" and model.config.vocab_size == SMOLLM2_VOCAB
    assert getattr(model.config, "quantization_config", None) is None
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :])
    assert "4" in answer


def test_tokenizer_quirks(cfg: LoadConfig, loads: tuple[LoadedModel, LoadedModel]) -> None:
    """SmolLM2: pad == eos == <|im_end|>, bos = <|im_start|>, ChatML template with a system default."""
    model, tokenizer = loads[1].model, loads[1].tokenizer
    info = describe_tokenizer(tokenizer, model)
    assert info.vocab_size == SMOLLM2_VOCAB
    assert info.pad_id == SMOLLM2_EOS and info.eos_ids == (SMOLLM2_EOS,)
    assert tokenizer.convert_ids_to_tokens(SMOLLM2_EOS) == "<|im_end|>"
    assert tokenizer.bos_token == "<|im_start|>"
    assert "<|im_end|>" in tokenizer.chat_template and "SmolLM" in tokenizer.chat_template
    assert eos_token_ids(model, tokenizer) == [SMOLLM2_EOS]
    assert tokenizer("Hello world").input_ids[0] != info.bos_id  # no BOS is prepended


def test_tokenizer_only_load_matches_gguf(cfg: LoadConfig, loads: tuple[LoadedModel, LoadedModel]) -> None:
    """load_tokenizer (converted copy) and the GGUF's own tokenizer have the same fingerprint."""
    from transformers import AutoTokenizer

    gguf = embedded_gguf_path("smollm2")
    raw = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    fast = load_tokenizer("embedded", cfg)
    assert tokenizer_fingerprint(raw) == tokenizer_fingerprint(fast) == tokenizer_fingerprint(loads[0].tokenizer)


def test_tiny_pair_with_real_tokenizer(tmp_path: Path, loads: tuple[LoadedModel, LoadedModel]) -> None:
    """Tiny target/draft share SmolLM2's 49152-id space; greedy agreement is partial."""
    tokenizer = loads[1].tokenizer
    assert build_tiny_causal_lm(tokenizer, arch="qwen2").config.vocab_size == SMOLLM2_VOCAB
    pair = save_tiny_pair(tmp_path, tokenizer)
    cfg = LoadConfig(device="cpu", offline=True, cache_dir=str(tmp_path / "cache"))
    target, draft = load_causal_lm(f"local:{pair.target_dir}", cfg), load_causal_lm(str(pair.draft_dir), cfg)
    a, b = describe_tokenizer(target.tokenizer), describe_tokenizer(draft.tokenizer)
    assert compare_tokenizers(a, b, "target", "draft") is None
    assert compare_tokenizers(a, describe_tokenizer(tokenizer), "tiny", "smollm2") is None
    ids = tokenizer("The quick brown fox jumps over", return_tensors="pt").input_ids
    out = target.model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=TINY_NEW_TOKENS, do_sample=False
    )
    with torch.no_grad():
        agree = (target.model(out).logits.argmax(-1) == draft.model(out).logits.argmax(-1)).float().mean()
    print(f"\ntiny pair greedy agreement: {agree.item():.2f}")
    assert 0.0 < agree.item() < 1.0
