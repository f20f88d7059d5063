"""Service defaults: torch threads per model service of a local stack (`specdec up`, `make demo`) from the
usable cores, and the model a service loads when none is named."""

from __future__ import annotations

import os

from specdec.launcher import default_threads


def test_the_target_gets_every_core_with_the_ngram_draft_and_half_with_a_model_draft(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.3, 0.2, 0.1), raising=False)
    assert default_threads("ngram") == 6
    assert default_threads("model") == default_threads("combined") == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert default_threads("ngram") == default_threads("model") == 1


def test_cores_busy_with_other_work_are_not_given_threads(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (2.6, 2.0, 1.0), raising=False)
    assert default_threads("ngram") == 3 and default_threads("model") == 1
    monkeypatch.setattr(os, "getloadavg", lambda: (17.0, 19.0, 18.0), raising=False)
    assert default_threads("ngram") == default_threads("model") == 1


def test_a_service_without_a_model_loads_the_embedded_target_or_its_shipped_draft(monkeypatch):
    from specdec.config import DEFAULT_MODELS, ModelServiceConfig
    from specdec.models.spec import parse_model_spec

    monkeypatch.delenv("SPECDEC_MODEL", raising=False)
    assert ModelServiceConfig(role="target").model == "embedded"
    assert ModelServiceConfig(role="draft").model == DEFAULT_MODELS["draft"] == "embedded:smollm2-draft"
    assert parse_model_spec(DEFAULT_MODELS["draft"]).name.endswith("smollm2-135m-draft")  # the shipped directory
    assert ModelServiceConfig(role="draft", model="hf:org/name").model == "hf:org/name"
    monkeypatch.setenv("SPECDEC_MODEL", "local:/m")
    assert ModelServiceConfig(role="draft").model == "local:/m"


def test_importing_specdec_leaves_openmp_spinning_as_the_environment_has_it():
    """libgomp's own spin count (GOMP_SPINCOUNT unset) measured faster on the llama.cpp default (docs/performance.md,
    "What each mechanism is worth"): importing specdec sets nothing."""
    import subprocess
    import sys

    probe = "import os, specdec; print(os.environ.get('GOMP_SPINCOUNT', 'unset'))"
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["unset"]
