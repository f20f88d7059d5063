"""Model spec parser: every accepted form, canonical round trip, one-line errors."""

from __future__ import annotations

import os

import pytest

from specdec.models.spec import (
    ModelLoadError,
    ModelSpec,
    ModelSpecError,
    parse_model_spec,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("modelscope:qwen/Qwen1.5-1.8B-Chat", ModelSpec("modelscope", "qwen/Qwen1.5-1.8B-Chat")),
        ("ms:qwen/Qwen1.5-1.8B-Chat@v1.0.0", ModelSpec("modelscope", "qwen/Qwen1.5-1.8B-Chat", "v1.0.0")),
        ("hf:Qwen/Qwen2.5-0.5B-Instruct", ModelSpec("hf", "Qwen/Qwen2.5-0.5B-Instruct")),
        ("huggingface:Qwen/Qwen2.5-0.5B-Instruct@main", ModelSpec("hf", "Qwen/Qwen2.5-0.5B-Instruct", "main")),
        ("HF:Org/Name@refs/pr/1", ModelSpec("hf", "Org/Name", "refs/pr/1")),
        (
            "hf:bartowski/SmolLM2-GGUF@abc123::SmolLM2.Q4_K_M.gguf",
            ModelSpec("hf", "bartowski/SmolLM2-GGUF", "abc123", "SmolLM2.Q4_K_M.gguf"),
        ),
        ("/models/qwen", ModelSpec("local", "/models/qwen")),
        ("local:/models/qwen/", ModelSpec("local", "/models/qwen")),
        ("/models/a@b", ModelSpec("local", "/models/a@b")),
        ("gguf:/models/x/file.gguf", ModelSpec("gguf", "/models/x", None, "file.gguf")),
        ("gguf:/models/x::file.Q4_1.GGUF", ModelSpec("gguf", "/models/x", None, "file.Q4_1.GGUF")),
        ("local:/models/x/file.gguf", ModelSpec("gguf", "/models/x", None, "file.gguf")),
        ("embedded", ModelSpec("embedded", "smollm2")),
        ("embedded:smollm2", ModelSpec("embedded", "smollm2")),
        ("  embedded:smollm2  ", ModelSpec("embedded", "smollm2")),
    ],
)
def test_parse_forms(text: str, expected: ModelSpec) -> None:
    """Every documented form parses to the expected spec and round-trips through str()."""
    spec = parse_model_spec(text)
    assert spec == expected
    assert parse_model_spec(str(spec)) == spec


def test_relative_and_home_paths() -> None:
    """./dir and ~/dir are local paths; ~ is expanded."""
    assert parse_model_spec("./m").source == "local"
    home = parse_model_spec("~/models/m")
    assert home == ModelSpec("local", os.path.join(os.path.expanduser("~"), "models", "m"))


def test_existing_bare_directory_is_local(tmp_path) -> None:
    """A bare relative name that exists on disk is taken as a local directory."""
    (tmp_path / "mymodel").mkdir()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert parse_model_spec("mymodel") == ModelSpec("local", "mymodel")
    finally:
        os.chdir(cwd)


def test_spec_properties() -> None:
    """is_hub / is_gguf reflect the source."""
    assert parse_model_spec("hf:a/b").is_hub
    assert not parse_model_spec("hf:a/b").is_gguf
    assert parse_model_spec("hf:a/b::c.gguf").is_gguf
    assert parse_model_spec("embedded").is_gguf
    assert not parse_model_spec("/x").is_hub


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("Qwen/Qwen2.5-0.5B-Instruct", "expected hf:"),
        ("junk", "expected hf:"),
        ("hf:", "org/name"),
        ("hf:justaname", "org/name"),
        ("hf:a/b/c", "org/name"),
        ("modelscope:a b/c", "org/name"),
        ("hf:a/b@", "revision"),
        ("hf:a/b@bad rev", "revision"),
        ("hf:a/b::weights.bin", ".gguf"),
        ("gguf:/x/model.bin", ".gguf"),
        ("gguf:/x/", "gguf:/path/file.gguf"),
        ("gguf:/x::sub/f.gguf", "directory"),
        ("embedded:llama70b", "unknown embedded model"),
        ("local:", "empty local path"),
        ("s3:bucket/key", "expected hf:"),
    ],
)
def test_parse_errors(text: str, fragment: str) -> None:
    """Junk raises ModelSpecError (a ValueError and a ModelLoadError) with a one-line message."""
    with pytest.raises(ModelSpecError) as info:
        parse_model_spec(text)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, ModelLoadError)


def test_non_string_is_rejected() -> None:
    """A non-string spec is a ModelSpecError, not an AttributeError."""
    with pytest.raises(ModelSpecError):
        parse_model_spec(None)  # type: ignore[arg-type]


def test_long_junk_is_truncated_in_message() -> None:
    """The message quotes a bounded prefix of very long input."""
    with pytest.raises(ModelSpecError) as info:
        parse_model_spec("x" * 5000)
    assert len(str(info.value)) < 400
