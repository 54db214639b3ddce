"""Entry point supervisord runs for programs that need more than a command line.

``python -m twinstream.stack.launch airflow`` builds Airflow's environment from the
TWINSTREAM_* settings alone (Kafka's and Spark's connections as AIRFLOW_CONN_* JSON, ports,
folders, whether new DAGs start paused) and replaces itself with ``airflow standalone``, so
supervisord supervises Airflow's own pid. Nothing in it depends on the pipelines file: the
engines' connections are in a file Airflow's LocalFilesystemBackend reads at every lookup
(render.airflow_connections, rewritten by `up`), so adding a pipeline restarts no Airflow.
``... spark-master`` and ``... spark-worker`` replace themselves with the Spark standalone
master's or worker's JVM, as the stack renders them (compose's spark-cluster profile).
``... airflow-db`` creates Airflow's database ahead of `up` (the Makefile runs it beside the
Maven fetch and the class archive), so that Airflow's own start finds it at its version.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path

from twinstream.platform.kafka import connection
from twinstream.platform.settings import Settings, load_settings
from twinstream.stack.layout import Layout

LOCAL_FILESYSTEM_BACKEND = "airflow.secrets.local_filesystem.LocalFilesystemBackend"


def airflow_environment(
    settings: Settings, base: Mapping[str, str], connections: bool = True
) -> dict[str, str]:
    """Airflow's environment; without `connections` the Kafka connection is left out,
    for the database migration, which runs before `up` has made Kafka's credentials."""
    layout = Layout.of(settings)
    venv_bin = str(Path(sys.executable).parent)
    # A test process runs Airflow in unit-test mode; the stack it starts must not inherit
    # that (other heartbeats and intervals, and a scheduler that busies a core).
    env = {k: v for k, v in base.items() if k != "AIRFLOW__CORE__UNIT_TEST_MODE"}
    env.update(
        {
            # `airflow standalone` starts its components by calling `airflow` from PATH.
            "PATH": os.pathsep.join([venv_bin, base.get("PATH", "/usr/bin:/bin")]),
            "AIRFLOW_HOME": str(layout.airflow_home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(settings.dags_dir),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(settings.plugins_dir),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            # LocalExecutor forks one worker per parallelism slot (32 by default): far more
            # than two cores can use, at ~100 MB each.
            "AIRFLOW__CORE__PARALLELISM": "4",
            # SQLite wants an absolute path (four slashes).
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{layout.airflow_home}/airflow.db",
            "AIRFLOW__API__HOST": settings.bind_host,
            "AIRFLOW__API__PORT": str(settings.airflow_port),
            # Task processes report back to the api-server; its default assumes port 8080.
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{settings.airflow_url}/execution/",
            "AIRFLOW__API__BASE_URL": settings.airflow_url,
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
            # Every engine's connection, from the file `up` rewrites: Airflow's own secrets
            # backend parses it at every lookup (no cache: [secrets] use_cache is off, and
            # concerns DAG parsing only), in the API server and in every task process (a
            # worker falls back to [secrets] backend), so a new pipeline's engines are
            # found without a restart (Airflow 3.3.2: airflow.secrets.local_filesystem,
            # airflow.sdk.execution_time.context._get_connection).
            "AIRFLOW__SECRETS__BACKEND": LOCAL_FILESYSTEM_BACKEND,
            "AIRFLOW__SECRETS__BACKEND_KWARGS": json.dumps(
                {"connections_file_path": str(layout.airflow_connections)}
            ),
            # A DAG seen for the first time runs on its schedule unless the settings say
            # otherwise (the tests' stack: TWINSTREAM_DAGS_PAUSED).
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": str(settings.dags_paused),
            # Spark's Python workers must run the virtualenv's interpreter, not the system's.
            "PYSPARK_PYTHON": sys.executable,
        }
    )
    if connections:
        env["AIRFLOW_CONN_KAFKA_DEFAULT"] = json.dumps(
            {"conn_type": "kafka", "extra": connection(settings).librdkafka()}
        )
    return env


def engine_connections(settings: Settings) -> dict[str, str]:
    """AIRFLOW_CONN_TWINSTREAM_ENGINE_<ID>: the connections of render.engine_connections as
    environment variables, for an Airflow that is not the stack's (the tests' `dag.test()`
    runs; compose sets its own in docker-compose.yaml)."""
    from twinstream.stack.render import engine_connections as connections

    return {
        f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(fields)
        for conn_id, fields in connections(settings).items()
    }


SPARK = ("spark-master", "spark-worker")
# Written next to Airflow's database once `airflow db migrate` has brought it to the
# installed Airflow's version: a second `make up` then skips the migration without
# importing Airflow (seconds of its own).
MIGRATED_STAMP = ".migrated-to"


def migrate_airflow_db(settings: Settings, echo: Callable[[str], None] = print) -> bool:
    """Bring the stack's Airflow database to the installed Airflow's schema, unless the
    stamp says it is there or the stack runs (its Airflow migrated the database as it
    started, and a second writer on SQLite would only contend with it). On a fresh
    machine this takes the migration (tens of seconds of CPU) out of `up`, where it would
    run beside the JVMs' starts on the same cores. Returns True when it migrated."""
    from twinstream.stack.supervisor import Supervisor

    layout = Layout.of(settings)
    stamp = layout.airflow_home / MIGRATED_STAMP
    version = metadata.version("apache-airflow")
    if stamp.is_file() and stamp.read_text().strip() == version:
        return False
    if Supervisor(layout).is_running():
        return False
    layout.airflow_home.mkdir(parents=True, exist_ok=True)
    echo(f"== creating Airflow's database in {layout.airflow_home} (Airflow {version})")
    started = time.monotonic()
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run(
        [airflow, "db", "migrate"],
        env=airflow_environment(settings, os.environ, connections=False),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    stamp.write_text(version + "\n")
    echo(f"   Airflow's database ready in {time.monotonic() - started:.0f} s")
    return True


def lower_priority(niceness: int) -> None:
    """This process, and so every process it starts (Airflow's scheduler, workers, task
    processes and their Spark JVMs, which inherit it), at `niceness` below the engines:
    on two cores the first audits and persists after `make up` otherwise ran beside four
    starting engines as their equals (load 38, engines' Python workers too slow to
    connect back to Spark, issue 52). Lowering one's own priority needs no privilege;
    one already lower is kept. Linux sets it for the calling thread, whose children
    inherit it: call it on the thread that starts them."""
    if niceness > os.getpriority(os.PRIO_PROCESS, 0):
        os.setpriority(os.PRIO_PROCESS, 0, niceness)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in ("airflow", "airflow-db", *SPARK):
        sys.exit(
            "usage: python -m twinstream.stack.launch "
            f"airflow|spark-master|spark-worker|airflow-db (got {args})"
        )
    settings = load_settings()
    if args[0] == "airflow-db":
        migrate_airflow_db(settings)
        return
    if args[0] in SPARK:
        # Compose runs them so: the same command and environment supervisord gives them.
        from twinstream.stack.render import spark_standalone

        programs = spark_standalone(settings, Layout.of(settings), os.environ)
        (program,) = [p for p in programs if p.name == args[0]]
        os.execvpe(program.command[0], list(program.command), dict(program.environment))  # noqa: S606
    env = airflow_environment(settings, os.environ)
    Layout.of(settings).airflow_home.mkdir(parents=True, exist_ok=True)
    airflow = str(Path(sys.executable).parent / "airflow")
    lower_priority(settings.airflow_niceness)
    # Replace this process so that supervisord's pid is Airflow's own.
    os.execve(airflow, [airflow, "standalone"], env)  # noqa: S606 - fixed argv, no shell


if __name__ == "__main__":
    main()
