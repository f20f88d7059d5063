"""The reliability tests' fault injection (SPECDEC_FAULT_FILE): a wrapper installed at start, failing every call
of the worker while its file exists, counted as the worker's own failure."""

from __future__ import annotations

import pytest

from specdec.engine.faults import inject_faults
from specdec.engine.worker import ModelWorker


def test_calls_fail_while_the_file_exists_and_the_worker_counts_them(tmp_path):
    worker, fault = ModelWorker("t"), tmp_path / "fault"
    inject_faults(worker, str(fault))
    assert worker.call(lambda: 7) == 7
    fault.write_text("fail")
    with pytest.raises(RuntimeError, match="injected fault"):
        worker.call(lambda: 7)
    assert worker.state.failures == 1 and not worker.state.last_ok
    fault.unlink()
    assert worker.call(lambda: 8) == 8 and worker.state.last_ok


def test_a_worker_without_injection_runs_its_calls_unwrapped(tmp_path):
    worker = ModelWorker("t")
    assert "call" not in vars(worker)  # the class's own method: no wrapper on the path
    (tmp_path / "fault").write_text("fail")
    assert worker.call(lambda: 1) == 1
