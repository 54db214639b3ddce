"""Entry point supervisord runs for programs that need more than a command line.

``python -m twinstream.stack.launch airflow`` builds Airflow's environment from the
TWINSTREAM_* settings (connections as AIRFLOW_CONN_* JSON, ports, folders) and replaces
itself with ``airflow standalone``, so supervisord supervises Airflow's own pid.
``... spark-master`` and ``... spark-worker`` replace themselves with the Spark standalone
master's or worker's JVM, as the stack renders them (compose's spark-cluster profile).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from twinstream import registry
from twinstream.config import Settings, load_settings
from twinstream.kafka import client_config
from twinstream.stack.layout import Layout


def airflow_environment(settings: Settings, base: Mapping[str, str]) -> dict[str, str]:
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
            "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(
                {"conn_type": "kafka", "extra": client_config(settings)}
            ),
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
            **engine_connections(settings),
            # Spark's Python workers must run the virtualenv's interpreter, not the system's.
            "PYSPARK_PYTHON": sys.executable,
        }
    )
    return env


def engine_connections(settings: Settings) -> dict[str, str]:
    """AIRFLOW_CONN_TWINSTREAM_ENGINE_<ID>: the admin API of each engine of every pipeline
    of the stack (engine ids are the stack's), its token as password."""
    token = settings.secret("admin_token")
    conns = {}
    engines = [(p, e) for p in registry.stack(settings).values() for e in p.engine_ids]
    # https with a private CA: the client verifies the engines against it.
    ca = {"extra": {"ca": settings.admin_tls_cafile}} if settings.admin_tls_cafile else {}
    for pipeline, engine_id in engines:
        url = urlsplit(pipeline.engine_admin_url(engine_id))
        conns[f"AIRFLOW_CONN_{settings.engine_conn_id(engine_id).upper()}"] = json.dumps(
            {
                "conn_type": "http",
                "host": url.hostname,
                "port": url.port,
                "schema": url.scheme,
                "password": token,
                **ca,
            }
        )
    return conns


SPARK = ("spark-master", "spark-worker")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in ("airflow", *SPARK):
        sys.exit(
            "usage: python -m twinstream.stack.launch airflow|spark-master|spark-worker "
            f"(got {args})"
        )
    settings = load_settings()
    if args[0] in SPARK:
        # Compose runs them so: the same command and environment supervisord gives them.
        from twinstream.stack.render import spark_standalone

        programs = spark_standalone(settings, Layout.of(settings), os.environ)
        (program,) = [p for p in programs if p.name == args[0]]
        os.execvpe(program.command[0], list(program.command), dict(program.environment))  # noqa: S606
    env = airflow_environment(settings, os.environ)
    Layout.of(settings).airflow_home.mkdir(parents=True, exist_ok=True)
    airflow = str(Path(sys.executable).parent / "airflow")
    # Replace this process so that supervisord's pid is Airflow's own.
    os.execve(airflow, [airflow, "standalone"], env)  # noqa: S606 - fixed argv, no shell


if __name__ == "__main__":
    main()
