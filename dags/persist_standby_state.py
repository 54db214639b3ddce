"""
### persist_standby_state

**Purpose.** Every persist interval, for each pipeline the stack runs (one mapped task
group per pipeline), snapshot the state of an in-sync **standby** engine
(its Spark checkpoint with the RocksDB state, and its buffer of recent outputs) to shared
storage, so that a failed engine comes back from recent state instead of replaying from
the beginning. The active is never persisted: it must never pause. Then verify the
snapshot's manifest and checksums on disk and prune to the newest `snapshots_keep`, never
deleting the newest valid snapshot.

The schedule is `TWINSTREAM_PERSIST_INTERVAL_S` (default 900 s). This DAG's schedule is
the single source of that number: `check_kafka_retention` reads it from here.

**Connections.** `twinstream_engine_<id>` per engine (HTTP: admin API host and port, the
bearer token as password), usually `AIRFLOW_CONN_TWINSTREAM_ENGINE_<ID>` JSON. ZooKeeper and
the snapshot folder come from the `TWINSTREAM_*` settings.

**Recovery.** "No in-sync standby" means every engine but the active is down, stopped or
behind: run `restore_and_resync` for it. A failed persist leaves the standby running (its
query restarts) and at most a `.tmp` folder that no restore ever uses. Clearing the run
takes a new snapshot; nothing is half-done in between.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import dag, task, task_group

from twinstream.platform import registry
from twinstream.platform.settings import TaskSettings, load

# Read from the environment and the pipelines file only (no network, no Variables, no
# pipeline code): the schedule and the mapping need them.
SETTINGS = load(TaskSettings)
PERSIST_INTERVAL = timedelta(seconds=SETTINGS.persist_interval_s)
PIPELINES = list(registry.stack(SETTINGS))

DEFAULT_ARGS = {
    "owner": "twinstream",
    "retries": 1,
    "retry_delay": timedelta(seconds=30),
}


@dag(
    dag_id="persist_standby_state",
    schedule=PERSIST_INTERVAL,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["twinstream", "operate"],
    doc_md=__doc__,
)
def persist_standby_state() -> None:
    @task
    def pick_standby(pipeline: str) -> str:
        from twinstream.ops.operate import (
            observe_engines,
            pick_standby,
            refusals_fail_fast,
            zk_leader,
        )

        settings = registry.pipeline_settings(pipeline)
        views = observe_engines(settings)
        with refusals_fail_fast():
            return pick_standby(views, zk_leader(settings))

    @task
    def persist(engine_id: str, pipeline: str) -> dict[str, Any]:
        from twinstream.ops.operate import airflow_engine, persist_from

        with airflow_engine(engine_id, registry.pipeline_settings(pipeline)) as engine:
            return persist_from(engine)

    @task
    def verify(manifest: dict[str, Any], pipeline: str) -> str:
        from twinstream.ops.operate import refusals_fail_fast, verify_persisted

        with refusals_fail_fast():
            return verify_persisted(registry.pipeline_settings(pipeline), manifest)

    @task
    def prune(_verified: str, pipeline: str) -> list[str]:
        from twinstream.ops.operate import prune

        settings = registry.pipeline_settings(pipeline)
        return prune(settings, settings.snapshots_keep)

    # One group per pipeline: a pipeline without an in-sync standby fails its own group
    # and never holds up another pipeline's snapshot.
    @task_group
    def each_pipeline(pipeline: str) -> None:
        engine_id = pick_standby(pipeline)
        prune(verify(persist(engine_id, pipeline), pipeline), pipeline)

    each_pipeline.expand(pipeline=PIPELINES)


persist_standby_state()
