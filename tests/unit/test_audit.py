"""The audit's pure parts: ranges, findings, the cursor, the verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from twinstream.audit import (
    REPORT,
    AuditFailed,
    Cursor,
    cursor_file,
    find_problems,
    format_ranges,
    merge_ranges,
    verdict,
)


def test_ranges_are_merged_not_listed_one_by_one():
    assert merge_ranges([9, 3, 4, 5, 5, 11, 10]) == [(3, 5), (9, 11)]
    assert merge_ranges([]) == []
    assert format_ranges([(3, 5), (9, 9)]) == "3..5, 9"
    assert format_ranges([(i, i) for i in range(0, 200, 2)], limit=2) == "0, 2 and 98 more ranges"


def test_a_clean_window_passes():
    findings = find_problems(reversed(range(100, 200)), 100, 200)
    assert findings.ok
    assert findings.summary() == "msg_id 100..199: 100 records; every msg_id exactly once"


def test_missing_duplicated_late_and_headerless_records_are_found():
    ids: list[int | None] = [i for i in range(100, 200) if not 120 <= i <= 129 and i != 150]
    ids += [160, 161, 161, 99, None]  # duplicates, a late duplicate of an audited id, no id
    findings = find_problems(ids, 100, 200)
    assert not findings.ok
    assert findings.missing == [(120, 129), (150, 150)]
    assert findings.duplicated == [(99, 99), (160, 161)]
    assert findings.without_msg_id == 1
    assert "missing: 120..129, 150; duplicated: 99, 160..161" in findings.summary()


def test_nothing_new_is_not_a_failure():
    assert find_problems([], 500, 500).ok


def test_the_cursor_round_trips_and_starts_at_zero(tmp_path):
    path = tmp_path / "audit" / "cursor.json"
    assert Cursor.load(path) == Cursor()
    Cursor(next_msg_id=10, out_offset=12, dlq_offset=1, audits=1).save(path)
    assert Cursor.load(path) == Cursor(10, 12, 1, 1)
    assert not path.with_name("cursor.json.tmp").exists()


def _report(path, **fields):
    report = {
        "run_id": "scheduled__1",
        "ok": True,
        "summary": "msg_id 0..99: 100 records; every msg_id exactly once",
        "expectations_met": True,
        "results": "/r.json",
        "data_docs": "/docs/index.html",
        **fields,
    }
    path.write_text(json.dumps(report))
    return path


def test_the_verdict_of_a_passed_audit_is_its_report(tmp_path):
    report = _report(tmp_path / REPORT)
    assert verdict(report, "scheduled__1")["ok"] is True


def test_a_failed_audit_names_its_ranges_and_what_to_do(tmp_path):
    summary = "msg_id 0..299: 288 records; missing: 100..109; duplicated: 200..201"
    report = _report(tmp_path / REPORT, ok=False, summary=summary)
    with pytest.raises(AuditFailed) as failed:
        verdict(report, "scheduled__1")
    assert "missing: 100..109; duplicated: 200..201" in str(failed.value)
    assert "move the cursor" in str(failed.value)
    assert "/docs/index.html" in str(failed.value)


def test_malformed_values_fail_the_verdict_and_point_at_the_results(tmp_path):
    report = _report(tmp_path / REPORT, ok=False, expectations_met=False)
    with pytest.raises(AuditFailed, match=r"malformed output values: see /r\.json"):
        verdict(report, "scheduled__1")


def test_a_report_of_another_run_or_none_is_an_error_not_a_finding(tmp_path):
    # The job crashed before writing this run's report: retried, never read as a verdict.
    report = _report(tmp_path / REPORT, run_id="scheduled__0", ok=False)
    with pytest.raises(RuntimeError, match="not 'scheduled__1': the audit job did not finish"):
        verdict(report, "scheduled__1")
    with pytest.raises(RuntimeError, match="no readable audit report"):
        verdict(tmp_path / "absent.json", "scheduled__1")


def test_the_cursor_is_the_given_one_or_the_pipelines_own(tmp_path):
    assert cursor_file(tmp_path) == tmp_path / "cursor.json"
    assert cursor_file(tmp_path, "/elsewhere/c.json") == Path("/elsewhere/c.json")
