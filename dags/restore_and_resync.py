"""
### restore_and_resync

**Purpose.** Bring a failed engine back as a hot standby: from the newest valid snapshot
(`latest`), the newest taken by an engine that agreed with the active (`proven`; a cold
rebuild when there is none Kafka can still replay), a named snapshot, or `cold` (replay
from the inbound offset at now minus the window retention), then wait until it has caught
up with the inbound topic and prove it: its buffered outputs for the last `compare_last`
msg_ids must equal, byte for byte, what the active already published. Triggered from the
UI (the Params form) or by `watch_engines` (with `proven`).

Tasks: assess (refuses a healthy, in-sync engine unless `force`, and always the active; a
standby whose rows disagree with the published ones is restored without `force`) →
choose_snapshot (checksums, and Kafka still holds its next offset) → restore →
wait_in_sync (a reschedule-mode sensor; its log shows the lag shrinking and the engine's
agreement, and it fails if the engine disagrees again) → check_buffer → summary (a
teardown: it reports, and never turns a failed run into a success).

**Connections.** `twinstream_engine_<id>` per engine (HTTP: admin API host and port, the
bearer token as password), usually `AIRFLOW_CONN_TWINSTREAM_ENGINE_<ID>` JSON. Kafka and
the snapshot folder come from the `TWINSTREAM_*` settings.

**Recovery.** Every failure names the engine and the reason. A snapshot Kafka can no
longer replay is refused: choose a newer one or `cold`. If the wait runs out, the engine
keeps replaying: rerun with the same engine once `GET /pipeline` shows it in sync, or
raise `wait_minutes`. An engine that disagrees again after a `proven` restore: restore it
`cold`; if it still disagrees, the pipeline's transform is not deterministic. Rerunning
is safe: a restore only ever replaces a stopped engine's checkpoint (or, stopping it
first, a disagreeing standby's).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Param, PokeReturnValue, dag, task

from twinstream.ops.audit import SNAPSHOT_PARAM_PATTERN
from twinstream.platform import registry
from twinstream.platform.settings import TaskSettings, load

# Every engine of every pipeline of the stack: engine ids are the stack's, so the engine
# names its pipeline. Reads the pipelines file only.
ENGINES = registry.engines(load(TaskSettings))

DEFAULT_ARGS = {
    "owner": "twinstream",
    # A retry of a refused restore would refuse again: one retry covers a lost connection.
    "retries": 1,
    "retry_delay": timedelta(seconds=15),
}


@dag(
    dag_id="restore_and_resync",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    default_args=DEFAULT_ARGS,
    tags=["twinstream", "operate"],
    doc_md=__doc__,
    params={
        "engine": Param(
            ENGINES[-1],
            type="string",
            enum=ENGINES,
            title="Engine",
            description="The engine to restore (never its pipeline's active).",
        ),
        "snapshot": Param(
            "latest",
            type="string",
            pattern=SNAPSHOT_PARAM_PATTERN,
            title="Snapshot",
            description=(
                "'latest' (newest valid), 'proven' (newest taken by an engine that agreed "
                "with the active; 'cold' when there is none), 'cold' (replay the window), or "
                "a snapshot id."
            ),
        ),
        "wait_minutes": Param(
            30,
            type="integer",
            minimum=1,
            maximum=24 * 60,
            title="Wait for in sync (minutes)",
        ),
        "force": Param(
            False,
            type="boolean",
            title="Force",
            description=(
                "Restore even a healthy, in-sync standby (one that disagrees needs no force)."
            ),
        ),
        "compare_last": Param(
            1000,
            type="integer",
            minimum=1,
            maximum=100_000,
            title="Compare the last N buffered outputs with the published ones",
        ),
    },
)
def restore_and_resync() -> None:
    @task
    def assess(params: dict[str, Any]) -> str:
        from twinstream.ops.operate import (
            airflow_engine,
            assess,
            engine_settings,
            observe,
            refusals_fail_fast,
        )

        settings = engine_settings(params)
        with refusals_fail_fast(), airflow_engine(params["engine"], settings) as engine:
            return assess(observe(engine, settings.pipeline), bool(params["force"]))

    @task
    def choose_snapshot(params: dict[str, Any]) -> str:
        from twinstream.ops.operate import (
            airflow_engine,
            choose_snapshot,
            engine_settings,
            inbound_log_starts,
            refusals_fail_fast,
        )

        settings = engine_settings(params)
        with refusals_fail_fast(), airflow_engine(params["engine"], settings) as engine:
            # Only a snapshot of the code the engine runs: another version's state would
            # give it another starting point than its version's first engine.
            return choose_snapshot(
                settings,
                params["snapshot"],
                inbound_log_starts(settings),
                registry.load(settings).state_layout,
                engine.server().pipeline_version,
            )

    @task
    def restore(snapshot_id: str, params: dict[str, Any]) -> dict[str, Any]:
        from twinstream.ops.operate import (
            airflow_engine,
            engine_settings,
            refusals_fail_fast,
            start_restore,
        )

        settings = engine_settings(params)
        with refusals_fail_fast(), airflow_engine(params["engine"], settings) as engine:
            return start_restore(engine, settings.pipeline, snapshot_id, bool(params["force"]))

    @task.sensor(poke_interval=10, timeout=24 * 3600, mode="reschedule")
    def wait_in_sync(report: dict[str, Any], params: dict[str, Any]) -> PokeReturnValue:
        import logging

        from twinstream.ops.operate import (
            airflow_engine,
            engine_settings,
            refusals_fail_fast,
            sync_check,
        )

        settings = engine_settings(params)
        with refusals_fail_fast(), airflow_engine(params["engine"], settings) as engine:
            check = sync_check(
                engine,
                float(report["started_at"]),
                wait_s=60.0 * int(params["wait_minutes"]),
                now=time.time(),
            )
        logging.getLogger("twinstream").info("%s", check.message)
        return PokeReturnValue(is_done=check.done, xcom_value=check.message)

    @task
    def check_buffer(_in_sync: str, params: dict[str, Any]) -> dict[str, Any]:
        from dataclasses import asdict

        from twinstream.ops.operate import (
            airflow_engine,
            check_buffer,
            engine_settings,
            refusals_fail_fast,
        )

        settings = engine_settings(params)
        with refusals_fail_fast(), airflow_engine(params["engine"], settings) as engine:
            return asdict(check_buffer(engine, settings, int(params["compare_last"])))

    @task
    def summary(params: dict[str, Any]) -> str:
        import logging

        from twinstream.ops.operate import airflow_engine, engine_settings, observe

        settings = engine_settings(params)
        with airflow_engine(params["engine"], settings) as engine:
            line = observe(engine, settings.pipeline).describe()
        logging.getLogger("twinstream").info("after restore_and_resync: %s", line)
        return line

    assessed = assess()
    chosen = choose_snapshot()
    restored = restore(chosen)
    assessed >> chosen
    checked = check_buffer(wait_in_sync(restored))
    # A teardown: it runs whatever happened before it, and its own success never turns a
    # failed run into a successful one.
    checked >> summary().as_teardown()


restore_and_resync()
