"""specdec.bench.runner.measure_loop: the bench's order and its time budget (no models, no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdec.bench import report, report_plot, report_table
from specdec.bench.plan import Config, Prompt, RunRecord
from specdec.bench.runner import interleave_sets, measure_loop
from tests.unit.test_bench_report import VERIFY, _rounds, _stats

CONFIGS = [Config("k0", "stack", 0), Config("k4", "stack", 4)]
PROMPTS = [
    Prompt("grounded", "g1", "a"),
    Prompt("grounded", "g2", "b"),
    Prompt("grounded", "g3", "c"),
    Prompt("open", "o1", "d"),
    Prompt("open", "o2", "e"),
]


class Clock:
    """A fake clock that each generation moves on by `step` seconds."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        return self.now


class Anchor:
    """An anchor that notes which prompt it measured, in the order of the run's generations."""

    def __init__(self, name: str, log: list[tuple[str, str]]) -> None:
        self.name, self.log = name, log

    def warm_up(self, ids) -> None:
        pass

    def measure(self, p: Prompt) -> None:
        self.log.append((p.id, self.name))

    def result(self) -> dict:
        return {}


def _run(
    budget_s: float, repeats: int = 2, step: float = 1.0, log: list[tuple[str, str]] | None = None
) -> list[RunRecord]:
    clock = Clock(step)
    log = [] if log is None else log
    anchors = [Anchor("server", log), Anchor("library", log)]

    def one(p: Prompt, cfg: Config, rep: int) -> RunRecord:
        clock.now += clock.step
        log.append((p.id, cfg.name))
        k = cfg.k or 0
        return RunRecord(
            p.set,
            p.id,
            cfg.name,
            rep,
            list(range(12)),
            0.6 if k == 0 else 0.3,
            [(0.05 * (i + 1), 1) for i in range(12)],
            _stats(k, [1] * 6 if k else []),
            _rounds(k, [1] * 6 if k else [0] * 12),
            {"session_tokens": 100, "redis_bytes": 900},
        )

    return measure_loop(one, PROMPTS, CONFIGS, repeats, budget_s, clock, anchors)


def test_the_sets_take_turns_and_each_keeps_its_order():
    assert [p.id for p in interleave_sets(PROMPTS)] == ["g1", "o1", "g2", "o2", "g3"]
    assert interleave_sets([]) == []


def test_without_a_budget_every_repeat_prompt_and_configuration_runs_once():
    records = _run(0.0)
    assert len(records) == 2 * len(PROMPTS) * len(CONFIGS)
    assert [(r.repeat, r.prompt, r.config) for r in records[:4]] == [
        (0, "g1", "k0"),
        (0, "g1", "k4"),
        (0, "o1", "k0"),
        (0, "o1", "k4"),
    ]


def test_each_prompt_runs_on_the_anchors_right_after_our_configurations():
    log: list[tuple[str, str]] = []
    _run(2.5, log=log)  # g1 and o1 of repeat 0, then the budget is spent
    assert log == [
        ("g1", "k0"),
        ("g1", "k4"),
        ("g1", "server"),
        ("g1", "library"),
        ("o1", "k0"),
        ("o1", "k4"),
        ("o1", "server"),
        ("o1", "library"),
    ]


@pytest.mark.parametrize("budget_s, prompts_run", [(0.5, 1), (2.0, 1), (2.5, 2), (5.0, 3), (100.0, 10)])
def test_a_budget_stops_between_prompts_with_every_configuration_of_each_prompt_run(budget_s, prompts_run):
    records = _run(budget_s)  # each generation takes 1 s, each prompt 2 s (two configurations)
    assert len(records) == prompts_run * len(CONFIGS)
    for i in range(0, len(records), len(CONFIGS)):
        assert [r.config for r in records[i : i + len(CONFIGS)]] == ["k0", "k4"]
        assert len({(r.repeat, r.prompt) for r in records[i : i + len(CONFIGS)]}) == 1


def test_a_stopped_run_reports_the_sets_it_measured_and_says_it_stopped(tmp_path: Path):
    records = _run(2.5)  # g1 and o1 of repeat 0
    records += [r for r in _run(0.0) if r.repeat == 1 and r.prompt == "g2"]  # and a ragged second repeat
    settings = {
        "draft_kind": "ngram",
        "configs": {c.name: c.label(4) for c in CONFIGS},
        "server_default_k": 4,
        "prompts": {"grounded": ["g1", "g2", "g3"], "open": ["o1", "o2"], "long": ["l1"]},
        "target_model_id": "t",
        "dtype": "float32",
        "max_new_tokens": 12,
        "repeats": 2,
        "threads": {"target_service": 1},
        "time_budget_s": 2.5,
        "generations": {"measured": len(records), "planned": 24},
    }
    machine = {"cpu_model": "cpu", "cores": 2, "usable_cores": 2, "torch": "x", "transformers": "y"}
    result = report.build(
        records,
        CONFIGS,
        PROMPTS + [Prompt("long", "l1", "f")],
        settings=settings,
        machine=machine,
        hf_settings={"draft_kind": "ngram"},
        verify=VERIFY,
        draft_step_cost=None,
        identity={},
        rss={},
        kv_per_token_model={"target": 46080},
        default_k=4,
    )
    assert "long" not in result  # never reached
    assert result["grounded"]["prompts_measured"] == 2 and result["open"]["prompts_measured"] == 1
    assert result["grounded"]["speedup"]["k4"]["n"] == 2 and result["open"]["speedup"]["k4"]["n"] == 1
    assert result["open"]["speedup"]["k4"]["median"] == pytest.approx(2.0)
    text = report_table.table(result)
    assert "stopped at the time budget (2.5 s): 6 of 24 generations" in text
    assert "== open (1 prompts) ==" in text
    report_plot.plot(result, tmp_path / "p.png")
