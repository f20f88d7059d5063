"""Which engine a model service runs (--engine / SPECDEC_ENGINE), and the llama.cpp engine's refusals, each a
clear error before any model is loaded."""

from __future__ import annotations

import pytest

import specdec.engine.llamacpp_lib as llamacpp_lib
from specdec.config import ModelServiceConfig
from specdec.engine.loading import _load_llamacpp, choose_engine


def cfg(**fields) -> ModelServiceConfig:
    return ModelServiceConfig(role="target", **{"model": "embedded", "device": "cpu", "dtype": "auto", **fields})


def test_auto_runs_a_gguf_on_cpu_at_its_own_precision_on_llamacpp_and_everything_else_on_torch(monkeypatch):
    monkeypatch.setattr(llamacpp_lib, "available", lambda: True)
    assert choose_engine(cfg()) == "llamacpp"
    assert choose_engine(cfg(dtype="float32")) == "torch"  # a torch dtype asks for torch
    assert choose_engine(cfg(device="cuda")) == "torch"
    assert choose_engine(cfg(model="embedded:smollm2-draft")) == "torch"  # safetensors, not a GGUF
    assert choose_engine(cfg(engine="torch")) == "torch"
    assert choose_engine(cfg(engine=" LlamaCpp ", model="hf:org/name")) == "llamacpp"  # explicit: as asked


def test_auto_falls_back_to_torch_without_llama_cpp_python(monkeypatch, caplog):
    monkeypatch.setattr(llamacpp_lib, "available", lambda: False)
    assert choose_engine(cfg()) == "torch"
    assert "llama-cpp-python is not installed" in caplog.text


def test_an_unknown_engine_is_refused_by_name():
    with pytest.raises(ValueError, match=r"engine='tensorrt': .*\(allowed: one of auto, torch, llamacpp\)"):
        cfg(engine="tensorrt")  # refused when the configuration is built (specdec/settings/model_service.py)


def test_the_llamacpp_engine_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="runs GGUF models; hf:org/name is not one"):
        _load_llamacpp(cfg(engine="llamacpp", model="hf:org/name"))
    with pytest.raises(ValueError, match="runs on the CPU here, not on 'cuda'"):
        _load_llamacpp(cfg(engine="llamacpp", device="cuda"))
