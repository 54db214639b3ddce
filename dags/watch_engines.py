"""
### watch_engines

**Purpose.** Every minute, look at every engine of every pipeline through its admin API.
An engine that is unreachable, or whose pipeline is stopped or failed, for longer than
the grace period (`TWINSTREAM_WATCH_GRACE_S`, default 120 s) gets one
`restore_and_resync` run per incident: not one per minute. A running standby whose rows
disagree with the published ones (`GET /pipeline` `agreement`) gets one at once: it does
not heal by itself, and takes no part in the election meanwhile; one an operator
overrode (`POST /pipeline/override`) is left alone, and so is one that runs other code
than the active (a restore brings back state, not code: the log says so). Every run
restores the newest `proven` snapshot (taken by an agreeing engine), or rebuilds cold when
there is none. An incident ends when the engine is seen running (or restoring) again, and
not disagreeing. Whatever the cause, one engine is restored at most
`TWINSTREAM_WATCH_RESTORE_CAP` times (2) in `TWINSTREAM_WATCH_RESTORE_WINDOW_S` (1 h): past
that the log says it is not restored again, why, and what to do.

**Connections.** `twinstream_engine_<id>` per engine (HTTP: admin API host and port, the
bearer token as password). The incidents are remembered in the Airflow Variable
`twinstream_watch_incidents` and each engine's recent restores in
`twinstream_watch_restores` (JSON), read and written by the task only.

**Recovery.** The DAG only observes and triggers; a failed look changes nothing. To have
an engine restored again within the same incident, delete its entry from the Variable
or trigger `restore_and_resync` by hand.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import dag, task

INCIDENTS = "twinstream_watch_incidents"
RESTORES = "twinstream_watch_restores"

DEFAULT_ARGS = {
    "owner": "twinstream",
    "retries": 1,
    "retry_delay": timedelta(seconds=10),
}


@dag(
    dag_id="watch_engines",
    schedule=timedelta(minutes=1),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["twinstream", "operate"],
    doc_md=__doc__,
)
def watch_engines() -> None:
    @task
    def decide() -> list[dict[str, Any]]:
        import json
        import time

        from airflow.sdk import Variable

        from twinstream.ops.operate import (
            RestoreCap,
            engines_to_restore,
            observe_engines,
            restore_conf,
        )
        from twinstream.platform import registry
        from twinstream.platform.settings import TaskSettings, load

        settings = load(TaskSettings)
        # Every pipeline's engines (engine ids are the stack's, one pipeline each).
        views = [v for p in registry.stack(settings).values() for v in observe_engines(p)]
        remembered = json.loads(Variable.get(INCIDENTS, default="{}"))
        restored = json.loads(Variable.get(RESTORES, default="{}"))
        cap = RestoreCap(settings.watch_restore_cap, settings.watch_restore_window_s)
        to_restore, incidents = engines_to_restore(
            views, remembered, time.time(), settings.watch_grace_s, restored, cap
        )
        Variable.set(INCIDENTS, json.dumps(incidents))
        Variable.set(RESTORES, json.dumps(restored))
        return [restore_conf(engine_id) for engine_id in to_restore]

    TriggerDagRunOperator.partial(
        task_id="trigger_restore",
        trigger_dag_id="restore_and_resync",
    ).expand(conf=decide())


watch_engines()
