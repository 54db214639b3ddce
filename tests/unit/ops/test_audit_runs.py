"""Issue 49: `twinstream status` printed "last audit: passed" while every run's `agreement`
task failed. Each task of a run records how it ended; the last run passes only when every
task did, and status shows it task by task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from twinstream.ops.audit_runs import KEEP, RUNS, last_run, outcome_of, record
from twinstream.ops.overview import PipelineView, latest_audit
from twinstream.ops.status_view import console, history


def passing_report(audit_dir: Path, run: str) -> None:
    audit_dir.mkdir(parents=True, exist_ok=True)
    report = {"run_id": run, "ok": True, "summary": "1,000 msg_ids, no gap", "data_docs": None}
    (audit_dir / "last-audit.json").write_text(json.dumps(report))


def test_a_run_whose_report_passed_but_whose_agreement_failed_failed(tmp_path: Path) -> None:
    passing_report(tmp_path, "scheduled__1")
    with outcome_of(tmp_path, "scheduled__1", "verdict") as say:
        say("1,000 msg_ids, no gap")
    with (
        pytest.raises(RuntimeError, match="engine b disagrees"),
        outcome_of(tmp_path, "scheduled__1", "agreement"),
    ):
        raise RuntimeError("engine b disagrees with the published output at msg_id 999")
    seen = latest_audit(tmp_path)
    assert seen is not None
    assert (seen.run, seen.ok) == ("scheduled__1", False)
    assert seen.tasks_text() == "agreement FAILED, verdict passed"
    assert seen.summary == "agreement: engine b disagrees with the published output at msg_id 999"
    view = PipelineView(
        name="p", active="a", problems=[], engines=[], takeovers=[], snapshots=[], audit=None
    )
    view.add_audit(seen)
    assert view.problems == [
        "the last audit (scheduled__1) failed (agreement FAILED, verdict passed): agreement: "
        "engine b disagrees with the published output at msg_id 999"
    ]
    out = console()
    with out.capture() as captured:
        out.print(history(view))
    assert "last audit: FAILED [agreement FAILED, verdict passed] (scheduled__1" in captured.get()


def test_a_passing_run_shows_its_report_and_a_retry_replaces_the_failed_try(tmp_path: Path):
    passing_report(tmp_path, "manual__2")
    record(tmp_path, "manual__2", "verdict", False, "no readable audit report")
    record(tmp_path, "manual__2", "verdict", True, "1,000 msg_ids, no gap")
    record(tmp_path, "manual__2", "agreement", True, "no engine disagrees")
    seen = latest_audit(tmp_path)
    assert seen is not None
    assert seen.ok
    assert seen.summary == "1,000 msg_ids, no gap"
    assert seen.tasks_text() == "agreement passed, verdict passed"


def test_without_records_the_report_alone_speaks_and_old_runs_are_pruned(tmp_path: Path):
    passing_report(tmp_path, "r0")
    seen = latest_audit(tmp_path)
    assert seen is not None
    assert (seen.ok, seen.tasks) == (True, [])
    clock = iter(range(1_000, 2_000))
    for n in range(KEEP + 5):
        record(tmp_path, f"run/{n}", "verdict", True, "ok", clock=lambda: float(next(clock)))
    assert len(list((tmp_path / RUNS).iterdir())) == KEEP
    assert (tmp_path / RUNS / "run_0").exists() is False  # a run id never makes a path
    found = last_run(tmp_path)
    assert found is not None
    assert found.run == f"run/{KEEP + 4}"
