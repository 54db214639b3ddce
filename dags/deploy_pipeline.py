"""
### deploy_pipeline

**Purpose.** Bring every engine of one pipeline to the code on disk with no gap in its
output, as `twinstream deploy PIPELINE` does (README, "Change a running pipeline"): the new
version's own tests first (`test_*.py` beside its code); then one standby at a time
restarts on the new version (the first from its own checkpoint when the keyed state's
shape is unchanged, else by a replay of the retained input a window back, refused naming
the fix when retention does not reach it; every later one from a snapshot of the first);
the switch of the lead at a transaction boundary once the operator approves it; the old
active last, from a snapshot of the new version. `rollback` deploys the version the last
deploy replaced (its code must be on disk).

Tasks: prepare (the tests and the standbys; its log and XCom end with the shadow's
difference summary: ranges compared, differing, an example of both versions' rows) →
approve_switch (a human-in-the-loop approval in Airflow's *Required actions*, showing that
summary; rejected or unanswered within a day: no switch) → switch (the lead passes to the
new version; the cutover msg_id per partition is recorded in ZooKeeper and shown by
`twinstream status` and the operator page).

Manual trigger only (the page's *Deploy* button, or the Params form). It runs on the local
stack's machine: it restarts engines through the stack's supervisord. Under Docker Compose
a deploy is not built yet.

**Connections.** `twinstream_engine_<id>` per engine (HTTP: admin API, bearer token as
password); Kafka and ZooKeeper from the `TWINSTREAM_*` settings.

**Recovery.** Every refusal names its fix and restarts nothing after it: the engines not yet
touched run the old version and the active leads. Rerunning is safe: a deploy resumes where
it stopped (the recorded start stands; standbys already on the version are not restarted).
A rejected switch leaves the new version's standbys beside the old active: trigger the DAG
again to switch, or deploy the old code (`rollback`) to bring them back.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import Param, dag, task

from twinstream.platform import registry
from twinstream.platform.settings import TaskSettings, load

# Reads the pipelines file only (no pipeline code is imported at parse time).
PIPELINES = list(registry.stack(load(TaskSettings)))

DEFAULT_ARGS = {
    "owner": "twinstream",
    # For a lost connection: a deploy resumes where it stopped (the recorded start stands,
    # a standby already on the version is not restarted). A refusal fails at once.
    "retries": 1,
    "retry_delay": timedelta(seconds=30),
}


@dag(
    dag_id="deploy_pipeline",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["twinstream", "operate", "deploy"],
    doc_md=__doc__,
    params={
        "pipeline": Param(
            PIPELINES[0],
            type="string",
            enum=PIPELINES,
            title="Pipeline",
            description="The pipeline whose engines move to the code on disk.",
        ),
        "rollback": Param(
            False,
            type="boolean",
            title="Roll back",
            description="Deploy the version the last deploy replaced (its code on disk).",
        ),
        "run_tests": Param(
            True,
            type="boolean",
            title="Run the new version's tests first",
            description="Off only for a pipeline with no tests beside its code.",
        ),
        "start_minutes": Param(
            7,
            type="integer",
            minimum=1,
            maximum=60,
            title="Wait for a restarted engine to answer (minutes)",
        ),
        "wait_minutes": Param(
            10,
            type="integer",
            minimum=1,
            maximum=24 * 60,
            title="Wait for a restarted engine to be in sync (minutes)",
        ),
    },
)
def deploy_pipeline() -> None:
    @task(execution_timeout=timedelta(hours=6))
    def prepare(params: dict[str, Any]) -> dict[str, Any]:
        from twinstream.ops.deploy import task

        return task(params, switch=False)

    approve_switch = ApprovalOperator(
        task_id="approve_switch",
        subject="Switch {{ params.pipeline }} to version "
        "{{ ti.xcom_pull(task_ids='prepare')['version'] }}?",
        body="{{ ti.xcom_pull(task_ids='prepare')['summary'] }}",
        # Unanswered for a day: no switch (the new version's standbys stay beside the old
        # active, as a rejection leaves them).
        defaults="Reject",
        response_timeout=timedelta(days=1),
    )

    @task(execution_timeout=timedelta(hours=6))
    def switch(params: dict[str, Any]) -> dict[str, Any]:
        from twinstream.ops.deploy import task

        return task(params, switch=True)

    prepare() >> approve_switch >> switch()


deploy_pipeline()
