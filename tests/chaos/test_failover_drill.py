"""The failover_drill DAG, run by `dag.test()` against two real engines under load: `make
chaos` only (`chaos_only`: TWINSTREAM_CHAOS_FULL=1), a scenario of minutes (146 s on two
cores at pace 2.26: a pair's start, a handover, an audit and a restart). In `make test`:
the drill's tasks are tests/unit/ops/test_drill.py's, a kill -9 handover
tests/integration/test_engines.py's and the audit's report tests/unit/ops/test_audit.py's.

The module's two tests share one pipeline (`module_pipeline`), its engines stopped by pid
after the last; each puts the engines in the state it needs (`a` alone, or `a` active with
`b` its in-sync standby), so either runs alone or out of order."""

from __future__ import annotations

from typing import Any

import pytest

from devkit.harness import EngineProcess, Pipeline, wait_for
from devkit.pace import bound
from tests.integration.engines import (
    LONG_SESSIONS,
    assert_exactly_once_and_as_reference,
    load_dag,
    return_value,
    task_states,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.chaos,
    pytest.mark.usefixtures("quiet_stack_engines"),
]


def _in_sync_standby(engine: Any) -> bool:
    server, info = engine.try_get("/server") or {}, engine.try_get("/pipeline") or {}
    return bool(server.get("role") == "standby" and info.get("in_sync"))


def running(pipeline: Pipeline, engine_id: str) -> EngineProcess:
    """The pipeline's engine `engine_id`, started if it is not running."""
    engine = pipeline.engines.get(engine_id)
    if engine is None or engine.proc.poll() is not None:
        engine = pipeline.start(engine_id, **LONG_SESSIONS)
        pipeline.wait_running(engine)
    return engine


@pytest.mark.chaos_only
def test_the_drill_refuses_without_a_standby_and_stops_nothing(
    module_pipeline: Pipeline, dag_run_env
):
    pipeline = module_pipeline
    dag_run_env(pipeline)
    b = pipeline.engines.get("b")
    if b is not None and b.proc.poll() is None:
        b.stop()
    a = running(pipeline, "a")
    wait_for(lambda: a.role() == "active", 30, "a active")
    refused = load_dag("failover_drill").test()
    assert task_states(refused)["plan"] == "failed"
    assert task_states(refused)["stop_active"] == "upstream_failed"
    assert a.role() == "active"
    assert a.get("/pipeline")["state"] == "running"


@pytest.mark.chaos_only
def test_the_drill_hands_over_audits_and_puts_the_engine_back_exactly_once(
    module_pipeline: Pipeline, dag_run_env
):
    pipeline = module_pipeline
    dag_run_env(pipeline)
    a = running(pipeline, "a")
    wait_for(lambda: a.role() == "active", 30, "a active")
    b = running(pipeline, "b")
    assert b.role() == "standby", b.role()
    pipeline.warm_up(a, b)
    wait_for(lambda: _in_sync_standby(b), 120, "b an in-sync standby")
    old_epoch = a.get("/server")["epoch"]
    # Input must arrive after the handover for the audit to see past it: a load that runs
    # through the drill (whatever dag.test() takes on two busy cores) and stops then.
    # 250 events/s: the stopped engine catches up what arrived during the audit's Spark job.
    load = pipeline.load(200_000, rate=250)
    wait_for(lambda: (a.get("/pipeline")["last_msg_id_published"] or 0) > 2000, 60, "output")

    run = load_dag("failover_drill").test()
    assert run.state == "success", task_states(run)

    # What the drill says, checked against the engines themselves.
    takeover = return_value(run, "stop_active")
    assert takeover["stopped"] == a.engine_id
    assert takeover["new_active"] == b.engine_id
    assert takeover["old_epoch"] == old_epoch
    assert takeover["new_epoch"] > old_epoch
    assert 0 < takeover["role_s"] < bound(10), (takeover["role_s"], bound(10))
    assert takeover["first_output_s"] is not None
    assert b.get("/server")["role"] == "active"
    assert b.get("/server")["epoch"] == takeover["new_epoch"]
    assert "role standby" in return_value(run, "rejoin")
    # The drill saw it in sync; under load on two busy cores a batch can take longer than
    # the in-sync lag for a moment, so the engines' own word is awaited, not read once.
    wait_for(lambda: _in_sync_standby(a), 60, "the stopped engine an in-sync standby")
    audited = return_value(run, "audit")
    assert audited["ok"]
    assert audited["first_msg_id"] <= takeover["last_published_before"] < audited["end_msg_id"]
    line = return_value(run, "report")
    assert "0 missing, 0 duplicated" in line
    print(line)

    pipeline.stop_load(load)
    assert load.sent < 200_000, "the load ran out before the drill ended: make it longer"
    pipeline.wait_published(pipeline.produced - 1)
    assert_exactly_once_and_as_reference(pipeline, pipeline.produced)
