"""The operating DAGs' shapes and forms: what the Airflow UI offers and refuses."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest

from twinstream.platform.settings import REPO_ROOT, load_settings


@pytest.fixture(scope="module")
def dags():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO_ROOT / "dags"))
    assert bag.import_errors == {}
    return bag.dags


def _form(dag, **values):
    """What the trigger form does with the user's values: defaults, then validation."""
    import copy

    params = copy.deepcopy(dag.params)
    params.update(values)
    return params.validate()


def test_the_restore_form_accepts_good_input_and_rejects_a_bad_engine(dags):
    from airflow.sdk.exceptions import ParamValidationError

    dag = dags["restore_and_resync"]
    ok = _form(dag, engine="a", snapshot="cold", wait_minutes=5)
    assert ok["engine"] == "a"
    assert ok["snapshot"] == "cold"
    assert _form(dag, snapshot="20261122T031500.123456Z-b-b42")["snapshot"].endswith("b42")
    # What watch_engines asks for (operate.restore_conf).
    assert _form(dag, snapshot="proven")["snapshot"] == "proven"
    with pytest.raises(ParamValidationError, match="engine"):
        _form(dag, engine="zzz")
    with pytest.raises(ParamValidationError, match="snapshot"):
        _form(dag, snapshot="../../etc/passwd")
    with pytest.raises(ParamValidationError, match="wait_minutes"):
        _form(dag, wait_minutes=0)


def test_the_engine_choice_is_every_pipelines_engines(dags):
    enum = dags["restore_and_resync"].params.get_param("engine").schema["enum"]
    # hostmetrics runs a and b, payments c and d (pipelines.toml).
    assert enum == ["a", "b", "c", "d"]


def test_the_drill_takes_the_pipeline_from_the_stacks_list(dags):
    from airflow.sdk.exceptions import ParamValidationError

    dag = dags["failover_drill"]
    assert dag.params.get_param("pipeline").schema["enum"] == ["hostmetrics", "payments"]
    assert _form(dag, pipeline="payments")["pipeline"] == "payments"
    with pytest.raises(ParamValidationError, match="pipeline"):
        _form(dag, pipeline="nope")


def _mapped_over(task):
    """The literal list a task (or its mapped task group) is expanded over."""
    from airflow.sdk.definitions.taskgroup import MappedTaskGroup

    group = task.task_group
    if isinstance(group, MappedTaskGroup):
        return group._expand_input.value
    return task._get_specified_expand_input().value


def test_scheduled_dags_work_on_every_pipeline(dags):
    every = {"pipeline": ["hostmetrics", "payments"]}
    assert _mapped_over(dags["persist_standby_state"].task_dict["each_pipeline.persist"]) == every
    audit = dags["audit_output_topic"]
    chosen = audit.task_dict["pipelines"].python_callable
    assert chosen(params=_form(audit)) == ["hostmetrics", "payments"]
    assert chosen(params=_form(audit, pipeline="payments")) == ["payments"]
    # Other copies of the topics are one pipeline's: which one must be said.
    with pytest.raises(ValueError, match="set the `pipeline` Param"):
        chosen(params=_form(audit, outbound_topic="copy.out"))
    assert _mapped_over(dags["check_kafka_retention"].task_dict["check_retention"]) == every


def test_restore_runs_its_steps_in_order_and_the_summary_is_a_teardown(dags):
    dag = dags["restore_and_resync"]
    order = ["assess", "choose_snapshot", "restore", "wait_in_sync", "check_buffer"]
    for before, after in itertools.pairwise(order):
        assert after in dag.task_dict[before].downstream_task_ids, (before, after)
    summary = dag.task_dict["summary"]
    assert summary.is_teardown
    assert dag.task_dict["wait_in_sync"].mode == "reschedule"


def test_persist_runs_every_persist_interval(dags):
    dag = dags["persist_standby_state"]
    assert dag.timetable.delta == timedelta(seconds=load_settings().persist_interval_s)
    order = [f"each_pipeline.{t}" for t in ("pick_standby", "persist", "verify", "prune")]
    for before, after in itertools.pairwise(order):
        assert after in dag.task_dict[before].downstream_task_ids, (before, after)


def test_watch_engines_runs_every_minute(dags):
    dag = dags["watch_engines"]
    assert dag.timetable.delta == timedelta(minutes=1)
    assert dag.task_dict["trigger_restore"].partial_kwargs["trigger_dag_id"] == "restore_and_resync"


def test_the_audit_submits_the_spark_job_with_the_kafka_connector(dags):
    from pathlib import Path

    dag = dags["audit_output_topic"]
    assert dag.timetable.delta == timedelta(seconds=load_settings().audit_interval_s)
    submit = dag.task_dict["each_pipeline.audit_output"]
    assert Path(submit.application).is_file()
    assert submit.application.endswith("spark_jobs/audit_output.py")
    assert submit._conn_id == "spark_default"
    assert submit.driver_class_path.endswith("spark-kafka/*")
    # Its JVM runs below the engines: the task's thread is niced before the submit.
    assert submit._pre_execute_hook is not None
    assert submit._pre_execute_hook.__qualname__.startswith("below_the_engines")
    # The job leaves the verdict to a task of its own: a finding fails without a retry.
    assert "each_pipeline.audit_output" in dag.task_dict["each_pipeline.verdict"].upstream_task_ids
    job_args = dag.task_dict["each_pipeline.job_args"].python_callable
    assert job_args("payments", _form(dag), "r1") == [
        "--pipeline",
        "payments",
        "--up-to",
        "committed",
        "--run-id",
        "r1",
    ]
    copy = _form(dag, pipeline="payments", outbound_topic="c.out", cursor="c-audit")
    assert job_args("payments", copy, "r2") == [
        "--pipeline",
        "payments",
        "--outbound-topic",
        "c.out",
        "--cursor",
        "c-audit",
        "--up-to",
        "committed",
        "--run-id",
        "r2",
    ]
    explicit = _form(dag, pipeline="payments", up_to="1:4200,0:5000")
    assert job_args("payments", explicit, "r3")[2:4] == ["--up-to", "0:5000,1:4200"]


def test_the_audit_covers_everything_committed_unless_told_where_to_end(dags):
    """Issue 33 point 8: the audit stopped 20,000 msg_ids below the inbound end, so an
    audit right after a test covered almost none of it. Its end is a Param now."""
    from airflow.sdk.exceptions import ParamValidationError

    dag = dags["audit_output_topic"]
    assert _form(dag)["up_to"] == "committed"  # the scheduled audit's
    for good in ("margin", "committed", "0:5000", "0:5000,1:4200,2:0"):
        assert _form(dag, up_to=good)["up_to"] == good
    for bad in ("", "5000", "latest", "0:5000,", "0:-1", "0:5\n", "0:5; rm", "a:1", ["0:5"]):
        with pytest.raises(ParamValidationError, match="up_to"):
            _form(dag, up_to=bad)
    # The form and the DAG's page say what each choice does.
    param = dag.params.get_param("up_to")
    for said in ("committed", "margin", "TWINSTREAM_AUDIT_INFLIGHT_MSGS", "0:5000,1:4200"):
        assert said in param.description
    assert param.schema["examples"] == ["committed", "margin"]
    assert "**Where an audit ends** (the `up_to` Param" in dag.doc_md


def test_the_audits_params_take_topic_names_and_a_cursor_id_never_a_path(dags):
    from airflow.sdk.exceptions import ParamValidationError

    dag = dags["audit_output_topic"]
    ok = _form(dag, outbound_topic="hostmetrics.out.copy", cursor="copy-audit")
    assert (ok["outbound_topic"], ok["cursor"]) == ("hostmetrics.out.copy", "copy-audit")
    assert _form(dag)["cursor"] == ""  # the pipeline's own
    for hostile in ("/tmp/c.json", "../../etc/passwd", "a/b", "Copy", "x" * 64):
        with pytest.raises(ParamValidationError, match="cursor"):
            _form(dag, cursor=hostile)
    for hostile in ("a topic", "../x", "t" * 250, "out;rm"):
        with pytest.raises(ParamValidationError, match="outbound_topic"):
            _form(dag, outbound_topic=hostile)


def test_a_finding_fails_the_audit_without_a_retry(dags, tmp_path, monkeypatch):
    import json

    from airflow.sdk.exceptions import AirflowFailException

    from twinstream.ops.overview import latest_audit

    monkeypatch.setenv("TWINSTREAM_STATE_DIR", str(tmp_path))
    report = {"run_id": "r1", "ok": False, "summary": "missing: 100..109"}
    report |= {"expectations_met": True, "results": None, "data_docs": None}
    folder = tmp_path / "audit" / "payments"
    folder.mkdir(parents=True)
    (folder / "last-audit.json").write_text(json.dumps(report))
    verdict = dags["audit_output_topic"].task_dict["each_pipeline.verdict"].python_callable
    params = {"cursor": ""}
    with pytest.raises(AirflowFailException, match=r"missing: 100\.\.109"):
        verdict(pipeline="payments", params=params, run_id="r1")
    # Another run's report: the job did not finish, an error Airflow retries.
    with pytest.raises(RuntimeError, match="did not finish"):
        verdict(pipeline="payments", params=params, run_id="r2")
    # It runs however the job ended, and each run records how it ended (issue 49).
    task = dags["audit_output_topic"].task_dict["each_pipeline.verdict"]
    assert task.trigger_rule == "all_done"
    seen = latest_audit(folder)
    assert seen is not None
    assert (seen.run, seen.ok, seen.tasks_text()) == ("r2", False, "verdict FAILED")
    assert "did not finish" in seen.summary


def test_the_audit_fails_when_an_engine_disagrees_and_not_when_one_is_down(
    dags, monkeypatch, tmp_path
):
    from airflow.sdk.exceptions import AirflowFailException

    monkeypatch.setenv("TWINSTREAM_STATE_DIR", str(tmp_path))

    from tests.unit.fakes import disagreement
    from twinstream.engine.api import AgreementInfo
    from twinstream.ops import operate
    from twinstream.ops.overview import EngineView, latest_audit

    dag = dags["audit_output_topic"]
    check = dag.task_dict["each_pipeline.agreement"]
    # Beside the Spark job, not after it: a failed job hides no disagreement.
    assert "each_pipeline.audit_output" not in check.upstream_task_ids
    # Each pipeline the run audits.
    assert "pipelines" in check.task_group.upstream_task_ids
    seen = [
        EngineView(pipeline="payments", engine_id="c", role="active", state="running"),
        EngineView(pipeline="payments", engine_id="d", problem="GET /server: refused"),
    ]
    asked: list[str] = []

    def observe_engines(settings):
        asked.append(settings.pipeline)
        return seen

    monkeypatch.setattr(operate, "observe_engines", observe_engines)
    assert "no engine disagrees" in check.python_callable(pipeline="payments", run_id="r1")
    seen[1] = EngineView(
        pipeline="payments",
        engine_id="d",
        agreement=AgreementInfo.model_validate(disagreement()),
        role="standby",
        state="running",
        in_sync=True,
    )
    with pytest.raises(AirflowFailException, match=r"engine d disagrees .* at msg_id 1000 \("):
        check.python_callable(pipeline="payments", run_id="r2")
    assert asked == ["payments", "payments"]
    # Status and the page show the run's true outcome, task by task (issue 49): the job's
    # report may pass, the run failed.
    first = latest_audit(tmp_path / "audit" / "payments")
    assert first is not None
    assert (first.run, first.ok, first.tasks_text()) == ("r2", False, "agreement FAILED")
    assert first.summary.startswith("agreement: engine d disagrees")


def test_the_retention_guard_runs_hourly_and_fixes_only_when_asked(dags):
    dag = dags["check_kafka_retention"]
    assert dag.timetable.delta == timedelta(hours=1)
    assert _form(dag)["apply_fix"] is False
    assert _form(dag, apply_fix=True)["apply_fix"] is True


def test_platform_health_fails_while_a_pipeline_has_no_standby_that_could_take_over(
    dags, monkeypatch
):
    """Issue 49: a pipeline whose next failure would stop its output is unhealthy."""
    from twinstream.ops import operate
    from twinstream.ops.platform_health import PlatformUnhealthy

    task = dags["platform_health"].task_dict["standby_could_take_over"]
    engines = {
        "hostmetrics": [
            engine_view_of("hostmetrics", "a", "active", True),
            engine_view_of("hostmetrics", "b", "standby", True),
        ],
        "payments": [
            engine_view_of("payments", "c", "active", True),
            engine_view_of("payments", "d", "standby", False),
        ],
    }
    monkeypatch.setattr(operate, "observe_engines", lambda settings: engines[settings.pipeline])
    with pytest.raises(PlatformUnhealthy, match=r"pipeline payments: no standby could take over"):
        task.python_callable()
    engines["payments"][1] = engine_view_of("payments", "d", "standby", True)
    assert task.python_callable() == ["hostmetrics", "payments"]


def engine_view_of(pipeline: str, engine_id: str, role: str, in_sync: bool):
    from twinstream.ops.overview import EngineView

    return EngineView(
        pipeline=pipeline, engine_id=engine_id, role=role, state="running", in_sync=in_sync
    )


def test_a_deploy_prepares_asks_for_the_switch_then_switches(dags):
    """deploy_pipeline: the tests and the standbys first, then a human-in-the-loop approval
    that shows the shadow's summary (unanswered: no switch), then the switch."""
    from airflow.providers.standard.operators.hitl import ApprovalOperator
    from airflow.sdk.exceptions import ParamValidationError

    dag = dags["deploy_pipeline"]
    assert type(dag.timetable).__name__ == "NullTimetable"  # manual trigger only
    assert dag.params.get_param("pipeline").schema["enum"] == ["hostmetrics", "payments"]
    form = _form(dag, pipeline="payments")
    assert (form["rollback"], form["run_tests"]) == (False, True)
    with pytest.raises(ParamValidationError, match="pipeline"):
        _form(dag, pipeline="nope")
    with pytest.raises(ParamValidationError, match="wait_minutes"):
        _form(dag, wait_minutes=0)
    order = ["prepare", "approve_switch", "switch"]
    for before, after in itertools.pairwise(order):
        assert dag.task_dict[before].downstream_task_ids == {after}, (before, after)
    approve = dag.task_dict["approve_switch"]
    assert isinstance(approve, ApprovalOperator)
    assert approve.defaults == ["Reject"]
    assert approve.response_timeout == timedelta(days=1)
    assert "summary" in str(approve.body)
