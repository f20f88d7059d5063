"""Local stacks (`specdec up`, `make demo`): torch threads per model service from the usable cores."""

from __future__ import annotations

import os

from specdec.launcher import default_threads


def test_the_target_gets_every_core_with_the_ngram_draft_and_half_with_a_model_draft(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5}, raising=False)
    assert default_threads("ngram") == 6
    assert default_threads("model") == default_threads("combined") == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert default_threads("ngram") == default_threads("model") == 1
