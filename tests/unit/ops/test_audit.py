"""The audit's pure parts: ranges, findings, the cursor, the verdict."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest

from twinstream.ops.audit import (
    REPORT,
    SUITE_VALUES,
    Audited,
    AuditFailed,
    Cursor,
    Findings,
    Position,
    Span,
    UpTo,
    UpToError,
    Validation,
    below_the_engines,
    choose_ends,
    cursor_file,
    failed_expectations,
    find_id_problems,
    find_problems,
    format_ranges,
    from_records,
    id_expectations,
    job_args,
    merge_ranges,
    report_summary,
    verdict,
)
from twinstream.platform.settings import REPO_ROOT


def test_ranges_are_merged_not_listed_one_by_one():
    assert merge_ranges([9, 3, 4, 5, 5, 11, 10]) == [(3, 5), (9, 11)]
    assert merge_ranges([]) == []
    assert format_ranges([(3, 5), (9, 9)]) == "3..5, 9"
    assert format_ranges([(i, i) for i in range(0, 200, 2)], limit=2) == "0, 2 and 98 more ranges"


def spans_of(*ranges, outputs_each=1):
    """Progress records of transactions first..last, each msg_id with `outputs_each` rows."""
    return [Span(a, b, (b - a + 1) * outputs_each, 0) for a, b in ranges]


def rows_of(ids, kind="out"):
    return [(i, kind, 1) for i in ids]


def test_a_clean_window_passes():
    findings = find_problems(
        spans_of((150, 199), (100, 149)), rows_of(reversed(range(100, 200))), 100, 200
    )
    assert findings.ok
    assert findings.summary() == "msg_id 100..199: 100 records; every msg_id exactly once"


def test_inputs_without_output_and_fan_outs_are_accounted_for_by_their_ranges():
    spans = [Span(0, 9, 0, 0), Span(10, 19, 3, 1), Span(20, 29, 6, 0)]
    rows = [(12, "out", 3), (15, "dlq", 1), (20, "out", 2), (29, "out", 4)]
    assert find_problems(spans, rows, 0, 30).ok


def test_gaps_overlaps_late_ranges_misplaced_and_headerless_records_are_found():
    spans = spans_of((100, 119), (130, 149), (150, 169), (160, 199), (90, 99))
    ids: list[int | None] = [*range(100, 120), *range(130, 200), *range(90, 100)]
    rows = [*rows_of(ids), *rows_of(range(160, 170)), (None, "out", 1)]
    findings = find_problems(spans, rows, 100, 200)
    assert not findings.ok
    assert findings.missing == [(120, 129)]
    # 90..99 is below the cursor (audited before); 160..169 is covered twice, and the
    # overlapping ranges do not hold the outputs their records say.
    assert findings.duplicated == [(90, 99), (160, 169)]
    assert findings.mismatched == [(150, 169), (160, 199)]
    assert findings.without_msg_id == 1
    assert "missing: 120..129; duplicated: 90..99, 160..169" in findings.summary()


def test_a_range_whose_outputs_do_not_match_its_counts_is_a_finding():
    spans = [Span(0, 4, 5, 0), Span(5, 9, 5, 0)]
    rows = [*rows_of(range(10)), (7, "out", 1)]  # msg_id 7 published twice
    findings = find_problems(spans, rows, 0, 10)
    assert findings.mismatched == [(5, 9)]
    assert "outputs differ from their progress record: 5..9" in findings.summary()


def test_a_clipped_window_cuts_ranges_and_counts_only_whole_ones():
    spans = spans_of((0, 99), (100, 199), (200, 299))
    rows = rows_of(range(50, 250))
    assert find_problems(spans, rows, 50, 250, clip=True).ok
    assert find_problems(spans[:1] + spans[2:], rows, 50, 250, clip=True).missing == [(100, 199)]


def test_nothing_new_is_not_a_failure():
    assert find_problems([], [], 500, 500).ok


def test_records_become_spans_and_rows():
    spans, rows = from_records(
        [
            ("progress", 9, '{"first":0,"last":9,"outputs":1,"dead_letters":1}'),
            ("out", 3, "{}"),
            ("dlq", 5, "{}"),
        ]
    )
    assert spans == [Span(0, 9, 1, 1)]
    assert rows == [(3, "out", 1), (5, "dlq", 1)]


def test_the_cursor_round_trips_and_starts_at_zero(tmp_path):
    path = tmp_path / "audit" / "cursor.json"
    assert Cursor.load(path) == Cursor()
    Cursor(next_msg_id=10, out_offset=12, dlq_offset=1, audits=1).save(path)
    assert Cursor.load(path) == Cursor(10, 12, 1, 1)
    assert not path.with_name("cursor.json.tmp").exists()


def test_a_cursor_keeps_a_position_per_partition_and_reads_an_old_one_as_partition_0(tmp_path):
    path = tmp_path / "cursor.json"
    path.write_text(json.dumps({"next_msg_id": 10, "out_offset": 12, "dlq_offset": 1, "audits": 1}))
    old = Cursor.load(path)
    assert old.at(0) == Position(10, 12, 1, 0)
    assert old.at(2) == Position()  # a partition never audited starts at zero
    moved = old.moved({0: Position(20, 30, 2, 4), 2: Position(5, 6, 0, 3)})
    moved.save(path)
    again = Cursor.load(path)
    assert (again.next_msg_id, again.out_offset, again.audits) == (20, 30, 2)
    assert again.at(2) == Position(5, 6, 0, 3)


def test_findings_of_several_partitions_name_the_partition_and_fail_together():
    spans = {0: [Span(0, 9, 10, 0)], 1: [Span(0, 4, 5, 0), Span(7, 9, 3, 0)]}
    rows = {
        0: [(i, "out", 1) for i in range(10)],
        1: [(i, "out", 1) for i in (0, 1, 2, 3, 4, 7, 8, 9)],
    }
    audited = Audited({p: find_problems(spans[p], rows[p], 0, 10) for p in (0, 1)})
    assert not audited.ok
    assert audited.summary().startswith("partition 0: msg_id 0..9: 10 records; every msg_id")
    assert "partition 1: msg_id 0..9: 8 records; missing: 5..6" in audited.summary()
    report = audited.report()
    assert (report["first_msg_id"], report["end_msg_id"], report["records"]) == (0, 10, 18)
    assert report["partitions"]["1"]["missing"] == [(5, 6)]
    one = Audited({0: Findings(0, 10, 10)})
    assert one.summary() == Findings(0, 10, 10).summary()


def test_the_coverage_suite_counts_every_partitions_range():
    [_, unique, total, low, high] = id_expectations({0: (5, 10)})
    assert unique.column == "start"
    assert (total.min_value, low.min_value, high.max_value) == (5, 5, 9)
    several = id_expectations({0: (5, 10), 1: (0, 3)})
    assert len(several) == 3  # min and max mean nothing across partitions
    assert several[2].min_value == several[2].max_value == 8


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


def test_the_cursor_is_the_pipelines_own_or_one_named_by_id_in_its_folder(tmp_path):
    assert cursor_file(tmp_path) == tmp_path / "cursor.json"
    assert cursor_file(tmp_path, "copy-audit") == tmp_path / "cursors/copy-audit/cursor.json"
    assert cursor_file(tmp_path, "q4_2026") == tmp_path / "cursors/q4_2026/cursor.json"


@pytest.mark.parametrize(
    "hostile",
    ["/elsewhere/c.json", "../../etc/passwd", "a/b", ".", "..", "-rf", "Copy", "x" * 64, "a\nb"],
)
def test_a_cursor_that_is_not_an_id_is_refused_naming_the_rule(tmp_path, hostile):
    # A path in a trigger's Params once chose the file the audit job read and wrote.
    with pytest.raises(ValueError, match="is not a cursor id: lower-case letters") as info:
        cursor_file(tmp_path, hostile)
    assert "cursors/<id>/" in str(info.value)


def test_the_baselines_one_record_per_input_check_finds_gaps_and_repeats():
    findings = find_id_problems([*range(100, 120), 110, 99, None, *range(125, 200)], 100, 200)
    assert findings.missing == [(120, 124)]
    assert findings.duplicated == [(99, 99), (110, 110)]
    assert findings.without_msg_id == 1


def test_param_patterns_refuse_a_trailing_newline_that_pythons_dollar_lets_through():
    from airflow.exceptions import ParamValidationError
    from airflow.sdk import Param

    from twinstream.ops.audit import (
        CURSOR_ID_PATTERN,
        SNAPSHOT_PARAM_PATTERN,
        TOPIC_NAME_PATTERN,
        param_pattern,
    )

    assert re.search("^(latest)$", "latest\n"), "Python's $ (the reason for param_pattern)"
    for pattern, good, bad in [
        (SNAPSHOT_PARAM_PATTERN, "latest", "latest\n"),
        (SNAPSHOT_PARAM_PATTERN, "proven", "proven\n"),
        (SNAPSHOT_PARAM_PATTERN, "20261126T101010.123456Z-a-b7", "cold\n"),
        (CURSOR_ID_PATTERN, "mine", "mine\n"),
        (TOPIC_NAME_PATTERN, "a.out", "a.out\n"),
        (param_pattern("x"), "x", "x\n"),
    ]:
        assert Param(good, type="string", pattern=pattern).resolve(good) == good
        with pytest.raises(ParamValidationError, match="does not match"):
            Param(good, type="string", pattern=pattern).resolve(bad)


# Where an audit ends (the DAG's `up_to`): issue 33 point 8. A user audited right after a
# test and got "nothing to audit below msg_id 2142": the margin of 20,000 msg_ids below the
# inbound high watermark left 93 % of the run unaudited.


def test_up_to_reads_committed_margin_and_an_end_per_partition():
    assert UpTo.parse("committed") == UpTo() == UpTo.parse("")
    assert UpTo.parse("margin").mode == "margin"
    explicit = UpTo.parse("1:4200,0:5000")
    assert (explicit.mode, dict(explicit.asked)) == ("explicit", {0: 5000, 1: 4200})
    assert str(explicit) == "0:5000,1:4200"  # what the DAG passes the job, and the report says
    assert str(UpTo.parse("committed")) == "committed"


@pytest.mark.parametrize("bad", ["5000", "latest", "0:5000,", "-1:5", "0:5;rm", "0:5 1:6"])
def test_an_up_to_that_is_no_form_is_refused_naming_the_forms(bad):
    with pytest.raises(UpToError, match="is not <partition>:<msg_id>; write 'committed'"):
        UpTo.parse(bad)
    with pytest.raises(UpToError, match="partition 0 twice"):
        UpTo.parse("0:5,0:6")


def test_the_default_end_is_everything_committed_however_far_behind_the_inbound_end():
    # The user's run: 30,000 published in transactions of 1,000, the cursor at 0, the
    # inbound topic 30,000 long. The margin covered 10,000 of them; committed covers all.
    spans = {0: spans_of(*((i, i + 999) for i in range(0, 30_000, 1_000)))}
    highs = {0: 30_000}
    assert choose_ends(UpTo(), {0: 0}, spans, highs, inflight=20_000) == {0: 30_000}
    assert choose_ends(UpTo("margin"), {0: 0}, spans, highs, inflight=20_000) == {0: 10_000}
    # Still in flight (read, not published yet): not a gap, the next audit's.
    assert choose_ends(UpTo(), {0: 0}, spans, {0: 31_500}, inflight=0) == {0: 30_000}


def test_each_partition_ends_at_its_own_last_committed_record_never_below_its_cursor():
    spans = {0: spans_of((0, 99), (100, 149)), 1: spans_of((40, 59))}
    ends = choose_ends(UpTo(), {0: 0, 1: 40, 2: 7}, spans, {0: 200, 1: 60, 2: 7}, 0)
    assert ends == {0: 150, 1: 60, 2: 7}  # partition 2: nothing committed past its cursor
    # A late duplicate below the cursor moves no end back.
    assert choose_ends(UpTo(), {0: 500}, {0: spans_of((0, 99))}, {0: 600}, 0) == {0: 500}


def test_the_margin_end_is_moved_down_to_a_transactions_boundary():
    spans = {0: spans_of((0, 99), (100, 199), (200, 299))}
    # high 300 - margin 120 = 180, inside 100..199: the audit stops at 100.
    assert choose_ends(UpTo("margin"), {0: 0}, spans, {0: 300}, 120) == {0: 100}
    assert choose_ends(UpTo("margin"), {0: 0}, spans, {0: 300}, 0) == {0: 300}


def test_an_asked_end_is_moved_down_to_a_boundary_and_unnamed_partitions_wait():
    spans = {0: spans_of((0, 99), (100, 199)), 1: spans_of((0, 49))}
    starts = {0: 0, 1: 0}
    highs = {0: 300, 1: 50}
    # 150 is inside 100..199: that transaction is audited whole, next time.
    assert choose_ends(UpTo.parse("0:150"), starts, spans, highs, 0) == {0: 100, 1: 0}
    assert choose_ends(UpTo.parse("0:200,1:50"), starts, spans, highs, 0) == {0: 200, 1: 50}
    # Asked past what is committed: the end stays, and the audit names 200..249 missing.
    assert choose_ends(UpTo.parse("0:250"), starts, spans, highs, 0)[0] == 250
    findings = find_problems(spans[0], rows_of(range(200)), 0, 250)
    assert findings.missing == [(200, 249)]


def test_an_asked_end_past_the_inbound_end_or_of_no_partition_is_refused_with_the_fix():
    spans: dict[int, list[Span]] = {0: []}
    with pytest.raises(UpToError, match=r"high watermark is 300.*at most 0:300, or 'committed'"):
        choose_ends(UpTo.parse("0:301"), {0: 0}, spans, {0: 300}, 0)
    with pytest.raises(UpToError, match="partition 3, but the inbound topic has partitions 0, 1"):
        UpTo.parse("3:10").check({0: 300, 1: 300})


def test_the_job_is_told_where_to_end():
    params = {"pipeline": "", "up_to": "committed", "cursor": ""}
    assert job_args("payments", params, "r1") == [
        "--pipeline",
        "payments",
        "--up-to",
        "committed",
        "--run-id",
        "r1",
    ]
    assert job_args("payments", {**params, "up_to": "1:7,0:5"}, "r2")[2:4] == [
        "--up-to",
        "0:5,1:7",
    ]
    with pytest.raises(UpToError):
        job_args("payments", {**params, "up_to": "0:5,0:6"}, "r3")


# The failure summary (issue 33 point 9): a failed value expectation was reported as
# "... every msg_id exactly once", which named the wrong expectation.


def _great_expectations_result(values: list[float]) -> dict[str, Any]:
    """A real Great Expectations checkpoint result (pandas, in memory) of the hostmetrics
    pipeline's expectations on mem_used_sum20, as `validate` keeps it."""
    import great_expectations as gx
    import great_expectations.expectations as gxe
    import pandas as pd

    context = gx.get_context(mode="ephemeral")
    batch = (
        context.data_sources.add_pandas("outputs")
        .add_dataframe_asset("values")
        .add_batch_definition_whole_dataframe("all")
    )
    suite = context.suites.add(
        gx.ExpectationSuite(
            name=SUITE_VALUES,
            expectations=[
                gxe.ExpectColumnValuesToBeBetween(column="mem_used_sum20", min_value=0),
                gxe.ExpectColumnValuesToNotBeNull(column="mem_used_sum20"),
                gxe.ExpectColumnMinToBeBetween(column="window_count", min_value=1),
            ],
        )
    )
    definition = context.validation_definitions.add(
        gx.ValidationDefinition(name="values", data=batch, suite=suite)
    )
    checkpoint = context.checkpoints.add(
        gx.Checkpoint(name="values", validation_definitions=[definition], result_format="SUMMARY")
    )
    frame = pd.DataFrame({"mem_used_sum20": values, "window_count": [1] * len(values)})
    described = checkpoint.run(batch_parameters={"dataframe": frame}).describe_dict()
    return dict(described)


def test_the_summary_names_each_failed_expectation_its_column_bound_and_values():
    failed = failed_expectations({SUITE_VALUES: _great_expectations_result([5.0, -3.5, 7.0])})
    assert failed == [
        "twinstream_output_values: expect_column_values_to_be_between on mem_used_sum20 "
        "(min_value=0.0): 1 of 3 values unexpected, e.g. -3.5"
    ]
    findings = Audited({0: find_problems(spans_of((0, 2)), rows_of(range(3)), 0, 3)})
    summary = report_summary(findings, failed)
    # What failed comes first: the msg_ids being all there is not the verdict.
    assert summary.startswith("1 expectation FAILED: twinstream_output_values: expect_column_")
    assert summary.endswith("Coverage: msg_id 0..2: 3 records; every msg_id exactly once")
    # Passing expectations add nothing.
    assert failed_expectations({SUITE_VALUES: _great_expectations_result([5.0])}) == []
    assert report_summary(findings, []) == findings.summary()


def test_observed_values_exceptions_and_many_failures_are_said():
    from twinstream.ops.audit import describe_expectation

    observed = {
        "expectation_type": "expect_column_min_to_be_between",
        "success": False,
        "kwargs": {"batch_id": "x", "column": "window_count", "min_value": 1, "max_value": None},
        "result": {"observed_value": 0},
    }
    assert describe_expectation("s", observed) == (
        "s: expect_column_min_to_be_between on window_count (min_value=1): observed 0"
    )
    raised = {
        "expectation_type": "expect_column_pair_values_to_be_equal",
        "success": False,
        "kwargs": {"column_A": "msg_id", "column_B": "header_msg_id"},
        "result": {},
        "exception_info": {"raised_exception": True, "exception_message": "no column msg_id"},
    }
    assert describe_expectation("s", raised).endswith(
        "on msg_id, header_msg_id: raised no column msg_id"
    )
    many = report_summary(Audited({0: Findings(0, 1, 1)}), [f"e{i}" for i in range(12)], 10)
    assert many.startswith("12 expectations FAILED: e0; e1;")
    assert "e9; and 2 more." in many


def _audit_job():
    spec = importlib.util.spec_from_file_location(
        "audit_output_job", REPO_ROOT / "spark_jobs" / "audit_output.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_report_twinstream_status_reads_names_the_failed_expectation(tmp_path):
    from twinstream.ops.overview import latest_audit

    failed = failed_expectations({SUITE_VALUES: _great_expectations_result([-3.5, 1.0])})
    findings = Audited({0: find_problems(spans_of((0, 1)), rows_of(range(2)), 0, 2)})
    validation = Validation(False, Path("/r.json"), tmp_path / "index.html", {}, failed)
    _audit_job().write_report(
        tmp_path / "cursor.json", "r1", findings, validation, "run-1", UpTo.parse("0:2")
    )
    report = json.loads((tmp_path / REPORT).read_text())
    assert (report["ok"], report["up_to"], report["failed_expectations"]) == (False, "0:2", failed)
    view = latest_audit(tmp_path)
    assert view is not None
    assert not view.ok
    assert "expect_column_values_to_be_between on mem_used_sum20 (min_value=0.0)" in view.summary
    assert "e.g. -3.5" in view.summary


def test_the_job_refuses_a_bad_up_to_before_spark_starts(capsys):
    with pytest.raises(SystemExit) as exited:
        _audit_job().main(["--up-to", "5000"])
    assert exited.value.code == 2
    assert "write 'committed'" in capsys.readouterr().err


def test_each_versions_outputs_are_checked_against_its_own_kept_expectations(tmp_path: Path):
    """Issue 51: after a deploy the audit reads outputs of two versions. The code on disk's
    expectations check its own outputs (and those with no version header, published before
    outputs carried one); another version's outputs are checked against the expectations
    kept when its code was on disk, read back as the same expectations; a version whose
    expectations were never kept is named, not checked against another version's."""
    import great_expectations.expectations as gxe

    from twinstream.ops.audit import (
        SUITE_VALUES,
        save_expectations,
        saved_expectations,
        version_suites,
    )

    old = [
        gxe.ExpectColumnValuesToBeBetween(column="cpu", min_value=0, max_value=100),
        gxe.ExpectColumnValuesToNotBeNull(column="host"),
    ]
    new = [gxe.ExpectColumnValuesToBeBetween(column="cpu_pct", min_value=0, max_value=1)]
    save_expectations(tmp_path, "1+aaaaaaaaaaaa", "host STRING, cpu DOUBLE", old)
    kept = saved_expectations(tmp_path, "1+aaaaaaaaaaaa")
    assert kept is not None
    schema, expectations = kept
    assert schema == "host STRING, cpu DOUBLE"
    assert [e.configuration.to_json_dict() for e in expectations] == [
        e.configuration.to_json_dict() for e in old
    ]
    assert saved_expectations(tmp_path, "0+ffffffffffff") is None

    suites, unchecked = version_suites(
        [None, "2+bbbbbbbbbbbb", "1+aaaaaaaaaaaa", "0+ffffffffffff"],
        "2+bbbbbbbbbbbb",
        "host STRING, cpu_pct DOUBLE",
        new,
        lambda v: saved_expectations(tmp_path, v),
    )
    assert [(s.name, s.version, s.value_schema) for s in suites] == [
        (SUITE_VALUES, None, "host STRING, cpu_pct DOUBLE"),
        (f"{SUITE_VALUES}_1_aaaaaaaaaaaa", "1+aaaaaaaaaaaa", "host STRING, cpu DOUBLE"),
    ]
    assert suites[0].expectations is new
    assert [type(e).__name__ for e in suites[1].expectations] == [
        "ExpectColumnValuesToBeBetween",
        "ExpectColumnValuesToNotBeNull",
    ]
    assert unchecked == ["0+ffffffffffff"]
    # No other version read: the code on disk's suite alone, as before any deploy.
    alone, none = version_suites([None], "2+bbbbbbbbbbbb", "x INT", new, lambda v: None)
    assert [s.name for s in alone] == [SUITE_VALUES]
    assert none == []


def test_the_audit_job_starts_below_the_engines_and_never_above_a_lower_priority():
    """The pre_execute hook nices the task's thread, so the spark-submit it starts and the
    JVM under it inherit the niceness; a thread already lower stays lower. Run on a thread
    of its own: Linux sets a niceness per thread, and pytest's must stay as it is."""
    import subprocess
    import sys
    import threading

    seen: list[str] = []

    def task(first: int, then: int) -> None:
        below_the_engines(first)(None)
        below_the_engines(then)(None)
        child = [sys.executable, "-c", "import os; print(os.nice(0))"]
        seen.append(subprocess.run(child, capture_output=True, text=True, check=True).stdout)

    for first, then in ((10, 0), (12, 10)):
        thread = threading.Thread(target=task, args=(first, then))
        thread.start()
        thread.join(30)
    assert [int(s) for s in seen] == [10, 12]
