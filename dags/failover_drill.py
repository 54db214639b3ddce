"""
### failover_drill

**Purpose.** The game-day drill to run before trusting a deployment, and after any change
to it: stop the active engine through its admin API (`POST /pipeline/stop`, the engine
leaves the election first), measure how long the in-sync standby takes to become active
and to publish the first output of its epoch, audit the msg_ids around the handover for
gaps and duplicates, then start the stopped engine again and wait until it is an in-sync
standby. The `report` task logs the figures in one line and returns them as XCom.

Manual trigger only. The drill refuses to start unless exactly one engine is active (and
ZooKeeper agrees) and a standby is in sync, so it never causes the outage it rehearses.
Run it under load: without input after the handover there is nothing to audit.

**Connections.** `twinstream_engine_<id>` per engine (HTTP: admin API, bearer token as
password); Kafka and ZooKeeper from the `TWINSTREAM_*` settings.

**Recovery.** If no standby takes over within `takeover_timeout_s`, the stopped engine is
started again at once and the run fails: look at the standbys' logs and `GET /pipeline`.
A failed audit names the missing and duplicated msg_id ranges; the scheduled
`audit_output_topic` will report them too. If `rejoin` fails, the stopped engine is not a
standby again: run `restore_and_resync` for it.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Param, PokeReturnValue, dag, task

from twinstream.platform import registry
from twinstream.platform.settings import TaskSettings, load

# Reads the pipelines file only (no pipeline code is imported at parse time).
PIPELINES = list(registry.stack(load(TaskSettings)))

DEFAULT_ARGS = {
    "owner": "twinstream",
    # For a lost connection. A retried stop_active refuses (its engine is no longer the
    # active), so a retry never stops a second engine.
    "retries": 1,
    "retry_delay": timedelta(seconds=15),
}


@dag(
    dag_id="failover_drill",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["twinstream", "operate", "drill"],
    doc_md=__doc__,
    params={
        "pipeline": Param(
            PIPELINES[0],
            type="string",
            enum=PIPELINES,
            title="Pipeline",
            description="Whose active engine to stop; the other pipelines are not touched.",
        ),
        "takeover_timeout_s": Param(
            60,
            type="integer",
            minimum=5,
            maximum=600,
            title="Takeover timeout (s)",
            description="Fail the drill (and restart the stopped engine) after this long.",
        ),
        "rejoin_minutes": Param(
            15,
            type="integer",
            minimum=1,
            maximum=24 * 60,
            title="Wait for the stopped engine to be an in-sync standby (minutes)",
        ),
    },
)
def failover_drill() -> None:
    @task
    def plan(params: dict[str, Any]) -> dict[str, Any]:
        from twinstream.ops.drill import plan
        from twinstream.ops.operate import observe_engines, refusals_fail_fast, zk_leader

        settings = registry.pipeline_settings(params["pipeline"])
        with refusals_fail_fast():
            return plan(observe_engines(settings), zk_leader(settings))

    @task
    def stop_active(chosen: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
        from contextlib import ExitStack

        from twinstream.ops.drill import KafkaEpochTail, as_dict, stop_and_measure
        from twinstream.ops.operate import airflow_engine, refusals_fail_fast

        settings = registry.pipeline_settings(params["pipeline"])
        with ExitStack() as stack, refusals_fail_fast():
            active = stack.enter_context(airflow_engine(chosen["active"], settings))
            standbys = {
                e: stack.enter_context(airflow_engine(e, settings)) for e in chosen["standbys"]
            }
            # From the outbound topic's end before the stop: the new epoch's first record.
            tail = stack.enter_context(KafkaEpochTail(settings))
            timeout = float(params["takeover_timeout_s"])
            return as_dict(stop_and_measure(active, standbys, tail, timeout_s=timeout))

    @task
    def audit(takeover: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
        from twinstream.ops.drill import audit_handover
        from twinstream.ops.operate import airflow_engine, refusals_fail_fast

        settings = registry.pipeline_settings(params["pipeline"])
        with refusals_fail_fast(), airflow_engine(takeover["new_active"], settings) as engine:
            return audit_handover(settings, engine, takeover)

    @task
    def start_stopped(takeover: dict[str, Any], params: dict[str, Any]) -> float:
        from twinstream.ops.operate import airflow_engine

        settings = registry.pipeline_settings(params["pipeline"])
        with airflow_engine(takeover["stopped"], settings) as engine:
            engine.start()
        return time.time()

    @task.sensor(poke_interval=5, timeout=24 * 3600, mode="reschedule")
    def rejoin(
        started_at: float, takeover: dict[str, Any], params: dict[str, Any]
    ) -> PokeReturnValue:
        import logging

        from twinstream.ops.operate import airflow_engine, refusals_fail_fast, sync_check

        settings = registry.pipeline_settings(params["pipeline"])
        with refusals_fail_fast(), airflow_engine(takeover["stopped"], settings) as engine:
            check = sync_check(
                engine,
                started_at,
                wait_s=60.0 * int(params["rejoin_minutes"]),
                now=time.time(),
                since="its start",
            )
            role = engine.server().role
        logging.getLogger("twinstream").info("%s (role %s)", check.message, role)
        done = check.done and role == "standby"
        return PokeReturnValue(is_done=done, xcom_value=f"{check.message}, role {role}")

    @task
    def report(takeover: dict[str, Any], audited: dict[str, Any], rejoined: str) -> str:
        import logging

        from twinstream.ops.drill import figures

        line = figures(takeover, audited, rejoined)
        logging.getLogger("twinstream").info("%s", line)
        return line

    takeover = stop_active(plan())
    audited = audit(takeover)
    rejoined = rejoin(start_stopped(takeover), takeover)
    # The stopped engine is started again whatever the audit finds: a branch of its own.
    report(takeover, audited, rejoined)


failover_drill()
