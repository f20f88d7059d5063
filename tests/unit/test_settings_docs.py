"""docs/configuration.md is the table the settings models write: regenerated here, it must equal the page."""

from __future__ import annotations

from specdec.settings import docs


def test_the_committed_page_is_what_the_models_write():
    assert docs.PAGE.read_text(encoding="utf-8") == docs.render(), (
        "docs/configuration.md is out of date: run python -m specdec.settings.docs"
    )


def test_every_variable_is_described_and_listed_once():
    names = [row.split("`")[1] for row in docs.rows()]
    assert len(names) == len(set(names))
    assert all(not row.endswith("|  |") for row in docs.rows())  # no variable without a description
    for name in ("SPECDEC_PORT", "SPECDEC_HTTP_PORT", "SPECDEC_TOKEN", "REDIS_PASSWORD", "SPECDEC_ORCHESTRATOR_TLS"):
        assert name in names


def test_the_check_mode_fails_on_a_stale_page(tmp_path):
    page = tmp_path / "configuration.md"
    assert docs.main(["--check", "--out", str(page)]) == 1  # missing
    assert docs.main(["--out", str(page)]) == 0
    assert docs.main(["--check", "--out", str(page)]) == 0
    page.write_text(page.read_text(encoding="utf-8").replace("SPECDEC_MAX_BATCH", "SPECDEC_MAX_BATCHES"))
    assert docs.main(["--check", "--out", str(page)]) == 1
