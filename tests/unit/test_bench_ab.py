"""`specdec bench-ab`'s pure parts: arms, configurations and the paired summary."""

from __future__ import annotations

import argparse

import pytest

from specdec.bench.ab import config_k, parse_arm, summarize, table


def test_an_arm_is_a_name_and_its_environment():
    arm = parse_arm("serial:SPECDEC_LOOP_FORWARDS=0,SPECDEC_MAX_BATCH=1")
    assert arm.name == "serial" and arm.env == {"SPECDEC_LOOP_FORWARDS": "0", "SPECDEC_MAX_BATCH": "1"}
    assert parse_arm("base:").env == {}
    with pytest.raises(argparse.ArgumentTypeError, match="NAME:VAR=V"):
        parse_arm(":X=1")


def test_configurations_name_a_fixed_k_or_the_servers_default():
    assert config_k("k0") == 0 and config_k("k12") == 12 and config_k("default") is None
    with pytest.raises(ValueError, match="kN or default"):
        config_k("adaptive")


def _row(arm, prompt, rep, tok_s, config="k0", set_name="open"):
    return {"arm": arm, "set": set_name, "prompt": prompt, "config": config, "repeat": rep, "tok_s": tok_s}


def test_the_summary_pairs_each_arm_with_the_baseline_on_the_same_prompt_and_repeat():
    rows = [
        _row("a", "p1", 0, 10.0),
        _row("b", "p1", 0, 11.0),  # +10 %
        _row("a", "p2", 0, 40.0),
        _row("b", "p2", 0, 40.0),  # +0 %
        _row("a", "p3", 0, 20.0),
        _row("b", "p3", 0, 24.0),
    ]  # +20 %
    (line,) = summarize(rows, ["a", "b"])
    assert line["a"] == 20.0 and line["b"] == 24.0  # medians of tok/s
    assert line["b/a"] == 1.1  # the median of the paired ratios, not 24/20
    q1, q3 = line["b/a q1-q3"]
    assert q1 <= 1.1 <= q3
    assert "| open | k0 | 20.0 | 24.0 | 1.100" in table([line], ["a", "b"])


def test_a_pin_names_a_role_and_its_cpus():
    from specdec.bench.ab import parse_pin

    assert parse_pin("target=0") == ("target", {0}) and parse_pin("draft=1,2") == ("draft", {1, 2})
    with pytest.raises(argparse.ArgumentTypeError, match="ROLE=CPU"):
        parse_pin("target")
