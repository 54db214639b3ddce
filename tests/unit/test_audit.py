"""The audit's pure parts: ranges, findings, the cursor."""

from __future__ import annotations

from twinstream.audit import Cursor, find_problems, format_ranges, merge_ranges


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
