"""Shared by every test directory.

Airflow configuration for every test in this process, set before Airflow is imported:
Airflow reads its configuration once, on import. DagBag parsing needs no database, and the
DAG runs of the integration tests (`dag.test()`) use a SQLite database of their own in a
temporary AIRFLOW_HOME: never ~/airflow, never a running stack's.

The stack fixtures: a real stack (ZooKeeper, three KRaft brokers, Airflow) on its own ports
and state folder, started once per test session through the same code as `make up`, shared
by tests/integration and tests/chaos, and stopped by pid after. Unit tests never ask for it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from devkit import pace, spares
from devkit.harness import Pipeline, example_pipeline, wait_for
from twinstream.ops.deploy import token_client
from twinstream.ops.overview import pipeline_view
from twinstream.platform import registry
from twinstream.platform.settings import REPO_ROOT, Settings
from twinstream.stack import core
from twinstream.stack.layout import Layout
from twinstream.stack.supervisor import Supervisor, at_once

os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="twinstream-airflow-test-"))
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(REPO_ROOT / "dags"))

# Ports apart from the defaults, so a developer's running `make up` stack is left alone.
TEST_ENV = {
    "TWINSTREAM_ZK_PORT": "22181",
    "TWINSTREAM_KAFKA_PORTS": "29092,29093,29094",
    "TWINSTREAM_KAFKA_CONTROLLER_PORTS": "29192,29193,29194",
    "TWINSTREAM_KAFKA_BROKER_PORTS": "29292,29293,29294",
    "TWINSTREAM_AIRFLOW_PORT": "28080",
    "TWINSTREAM_DAGS_PAUSED": "true",  # tests trigger DAGs: no scheduled run may disturb them
    "TWINSTREAM_ENGINE_ADMIN_PORTS": "28701,28702",
    "TWINSTREAM_PUBLISHER_METRICS_PORTS": "28811,28812",
    # Both examples run on the test stack, as on `make up`; payments on 28703 and 28704.
    "TWINSTREAM_PIPELINES_FILE": str(REPO_ROOT / "tests" / "stack-pipelines.toml"),
    # The pipelines file's folder is tests/: the examples import from the repository root.
    "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
    ),
    # Non-default retentions prove they come from configuration.
    "TWINSTREAM_INBOUND_RETENTION_MS": str(3 * 24 * 3600 * 1000),
    "TWINSTREAM_OUTBOUND_RETENTION_MS": str(2 * 24 * 3600 * 1000),
    "TWINSTREAM_DLQ_RETENTION_MS": str(5 * 24 * 3600 * 1000),
    # A warm-up costs every engine start seconds of a cold JVM (11 s alone) that most tests
    # spend on their first batch anyway: on where a test says so (the warm-up's own tests).
    "TWINSTREAM_WARM_UP_RECORDS": "0",
    # Spark's JVMs here live a minute or two on two shared cores: the optimising JIT (C2)
    # compiles code no test runs long enough to gain from. The quick compiler alone
    # changes no result, only speed: three engine tests took 120 s against 154 s, the
    # stack's start 59 s against 78 s (2026-11-26). Production engines, `make up` and the
    # benchmarks keep the JVM's default, which pays off over an engine's life.
    "TWINSTREAM_SPARK_CONF": "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1",
}


def pytest_configure(config: pytest.Config) -> None:
    # Measured before any service starts, so that the stack's own load never loosens a
    # bound; a subprocess (an engine, a DAG run) inherits the session's figure.
    os.environ.setdefault(pace.ENV, f"{pace.measure():.2f}")


def pytest_report_header(config: pytest.Config) -> str:
    return (
        f"pace {pace.pace():.2f}: time bounds x{pace.pace():.2f} "
        f"(devkit/pace.py; {pace.ENV} to set it)"
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    """`chaos_only` scenarios (every test of tests/chaos) run in `make chaos`
    (TWINSTREAM_CHAOS_FULL=1), not in `make test`'s 40 minutes: each module names what make
    test proves of its guarantee."""
    if item.get_closest_marker("chaos_only") and os.environ.get("TWINSTREAM_CHAOS_FULL") != "1":
        pytest.skip("a scenario of minutes: make chaos runs it")


# The states of the shared stack's engines a test asks for by fixture, in the order a run
# passes through them: every engine as `up` left it, then the hostmetrics pair running under
# supervisord (on which tests/chaos/test_chaos.py's scenarios run, still warm: a restart of
# both costs about a minute on two cores), then all of them stopped to free the cores for
# engines of a test's own. Each fixture re-establishes its state, so any test run alone or
# out of this order still passes, only slower (a stopped engine's Spark start).
ENGINE_STATES = ("up_engines", "stack_engines", "quiet_stack_engines")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Unit and DAG tests first; then each integration and chaos module whole, in the order
    of the first of ENGINE_STATES any of its tests asks for (a module's tests share its
    module-scoped fixtures and run in their file's order); modules that ask for none of
    them after those: once the engines are stopped, no idle pair shares the two cores with
    their Spark. A new module needs no entry anywhere: its fixtures place it. Tests marked
    `stack_teardown` stop the shared stack, so they run after all others."""

    def state(item: pytest.Item) -> int:
        names = getattr(item, "fixturenames", ())
        return next(
            (i + 1 for i, name in enumerate(ENGINE_STATES) if name in names),
            len(ENGINE_STATES) + 1,
        )

    def late(item: pytest.Item) -> bool:
        # Deleting SCRAM users goes after every test that restarts a broker: in three full
        # runs a broker restarted after such a deletion refused valid SCRAM logins for
        # minutes (not root-caused; see the remove-pipeline test).
        return item.get_closest_marker("after_broker_restarts") is not None

    def teardown(item: pytest.Item) -> bool:
        return item.get_closest_marker("stack_teardown") is not None

    module_state: dict[Path, int] = {}
    for item in items:
        if not late(item) and not teardown(item):
            module_state[item.path] = min(module_state.get(item.path, 99), state(item))

    def order(item: pytest.Item) -> tuple[bool, bool, int]:
        path = item.path.as_posix()
        if "/tests/unit/" in path or "/tests/dags/" in path:
            return False, False, 0
        return teardown(item), late(item), module_state.get(item.path, len(ENGINE_STATES) + 1)

    # Stable: within a place, modules and their tests keep the order pytest collected them in.
    items.sort(key=order)


# Where the test stack's payments adapters follow their source (issue 37): a folder in the
# stack's state, named in the pipelines file `stack_env` writes there.
PAYMENTS_SOURCES = "payments-sources"


@pytest.fixture(scope="session")
def stack_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    state = tmp_path_factory.mktemp("stack")
    # tests/stack-pipelines.toml, and payments' publisher adapters as `make up` runs them
    # when a pipeline's entry asks for them: two, following a folder of JSON-lines files.
    sources = state / PAYMENTS_SOURCES
    sources.mkdir()
    pipelines = state / "pipelines.toml"
    pipelines.write_text(
        (REPO_ROOT / "tests" / "stack-pipelines.toml").read_text()
        + f'publishers = {{ source = "{sources}", count = 2, pattern = "*.jsonl" }}\n'
    )
    env = {
        **TEST_ENV,
        "TWINSTREAM_STATE_DIR": str(state),
        "TWINSTREAM_PIPELINES_FILE": str(pipelines),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield env
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def settings(stack_env: dict[str, str]) -> Settings:
    """The stack's own pipeline (hostmetrics) as the stack runs it: the environment plus
    its entry in the pipelines file (three partitions)."""
    return example_pipeline()


@pytest.fixture(scope="session")
def stack(settings: Settings) -> Iterator[core.UpReport]:
    try:
        report = core.up(settings)
        # Warm spares for the tests' own engines from now on (devkit/spares.py): an engine
        # a test starts skips its JVM's and Spark session's start.
        spares.POOL = spares.Keeper(
            Path(tempfile.mkdtemp(prefix="ts-spares-")), spares.POOL_SIZE, dict(os.environ)
        )
        spares.POOL.fill()
        yield report
    finally:
        if spares.POOL is not None:
            spares.POOL.close()
            spares.POOL = None
        core.down(settings)


def untroubled(settings: Settings) -> bool:
    """True once `twinstream status` would name no problem of the pipeline, else False."""
    view = pipeline_view(settings.pipeline, settings, token_client, with_history=False)
    return not view.problems


def settled(settings: Settings) -> str | None:
    """The pipeline's active engine once its election has settled (one active, every other
    engine standby), else None."""
    roles = core.engine_roles(settings)
    active = [e for e, role in roles.items() if role == "active"]
    standby = [e for e, role in roles.items() if role == "standby"]
    return active[0] if len(active) == 1 and len(standby) == len(roles) - 1 else None


@pytest.fixture(scope="module")
def up_engines(stack, settings) -> None:
    """Every engine of every pipeline on the stack running under its supervisord, each
    pipeline with one active and its other engines standby that could take over (no problem
    in `twinstream status`): the stopped engines started again, and waited for until each
    standby is in sync."""
    supervisor = Supervisor(Layout.of(settings))
    # All at once: supervisord's start returns only after the program's `startsecs`.
    at_once(supervisor.start, [f"engine-{e}" for e in registry.engines(settings)])
    for each in registry.stack(settings).values():
        # Spark's start on two shared cores: minutes when four engines start at once.
        wait_for(partial(settled, each), 300, f"{each.pipeline}: one active engine")
        # A standby restarted with its pipeline is in sync only once it has caught up: a
        # problem in status until then (issue 49), which a test of status must not take
        # for the stack's.
        wait_for(partial(untroubled, each), 300, f"{each.pipeline}: no problem in status")


@pytest.fixture(scope="module")
def quiet_stack_engines(stack, settings) -> None:
    """The stack's own engines idle on another pipeline; stopping them leaves the two
    cores to the engines under test. They stay stopped until a module that needs them
    (`stack_engines`) starts them: restarting them after each module cost about a minute
    of Spark start-up per module, only for the next module to stop them again."""
    supervisor = Supervisor(Layout.of(settings))
    # All at once: each stop waits for its engine's shutdown (the batch in flight, leaving
    # the election, Spark), seconds each, and one after the other added them up.
    at_once(supervisor.stop, [f"engine-{e}" for e in registry.engines(settings)])


@pytest.fixture(scope="module")
def stack_engines(stack, settings) -> str:
    """The stack's hostmetrics engines running under its supervisord, one of them active;
    the active's id. (Payments' engines stay as they are: stopped once a module quieted
    them.)"""
    supervisor = Supervisor(Layout.of(settings))
    # Both at once: supervisord's start returns only after the program's `startsecs` (10 s
    # for an engine), and the second JVM's start need not wait for the first's.
    at_once(supervisor.start, [f"engine-{e}" for e in settings.engine_ids])
    # Spark's start on two shared cores: up to a few minutes when both start at once.
    active: str = wait_for(
        lambda: settled(settings), 300, "one active engine and the others standby"
    )
    return active


@pytest.fixture
def pipeline(stack_env, tmp_path, request: pytest.FixtureRequest) -> Iterator[Pipeline]:
    """A pipeline of the test's own on the stack; its inbound partitions by indirect
    parametrization (`@pytest.mark.parametrize("pipeline", [3], indirect=True)`), else 1."""
    p = Pipeline(stack_env, tmp_path, partitions=getattr(request, "param", 1))
    request.node.twinstream_pipeline = p
    try:
        yield p
    finally:
        p.discard()


@pytest.fixture(scope="module")
def module_pipeline(
    stack_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pipeline]:
    """A pipeline of the module's own on the stack, shared by its tests so that every test
    after the first finds its engines warm; discarded (by pid) after the module's last test.
    A test that needs its engines in some state brings them there itself, so that it also
    runs alone or out of order."""
    p = Pipeline(stack_env, tmp_path_factory.mktemp("module-pipeline"))
    try:
        yield p
    finally:
        p.discard()


def _test_pipeline(item: pytest.Item) -> Pipeline | None:
    """The pipeline with engines of its own that a test used: its `pipeline` fixture's, or
    a Pipeline among its fixtures' values (`module_pipeline`, or a fixture made from it)."""
    p = getattr(item, "twinstream_pipeline", None)
    if isinstance(p, Pipeline):
        return p
    values = getattr(item, "funcargs", {}).values()
    return next((v for v in values if isinstance(v, Pipeline)), None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """A failed test with engines of its own reports what each engine logged: CI keeps only
    its printout, and the temporary folder with the logs is gone by the time anyone looks."""
    report = yield
    p = _test_pipeline(item)
    if report.failed and p is not None:
        for path in sorted(p.workdir.glob("engine-*.log")):
            report.sections.append((f"twinstream log {path.name}", engine_log_tail(path)))
    return report


def engine_log_tail(path: Path, lines: int = 40) -> str:
    """The engine's own INFO and above (not Spark's, not its progress bars), last lines."""
    text = path.read_text(errors="replace").replace("\r", "\n")
    own = [line for line in text.splitlines() if " engine=" in line[:60]]
    return "\n".join(own[-lines:])


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """A migrated SQLite metadata database for `dag.test()` in the AIRFLOW_HOME that
    tests/conftest.py set for this process (not the stack's Airflow)."""
    import subprocess
    import sys
    from pathlib import Path

    airflow = Path(sys.executable).with_name("airflow")
    subprocess.run([str(airflow), "db", "migrate"], check=True, capture_output=True, timeout=300)


@pytest.fixture
def dag_run_env(monkeypatch: pytest.MonkeyPatch, airflow_db: None) -> Callable[[Pipeline], None]:
    """Point this process's TWINSTREAM_* settings and engine connections at a pipeline, as
    the stack does for Airflow's task processes."""
    import json
    import sys
    from pathlib import Path

    from twinstream.platform.kafka import connection
    from twinstream.stack.launch import engine_connections

    def use(pipeline: Pipeline) -> None:
        kafka = {"conn_type": "kafka", "extra": connection(pipeline.settings).librdkafka()}
        spark = {"conn_type": "spark", "host": "local[2]"}
        for key, value in {
            **pipeline.env,
            **engine_connections(pipeline.settings),
            "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(kafka),
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(spark),
            # SparkSubmitOperator calls spark-submit from PATH, as the stack's Airflow does.
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
            # The driver JVM of a job SparkSubmitOperator submits (the audit) is
            # spark-submit's own, which takes its options from here, not from the
            # pipeline's Spark settings: the engines' quick compiler (TEST_ENV's
            # TWINSTREAM_SPARK_CONF) for it too. Each audit's JVM lives under a minute.
            "SPARK_SUBMIT_OPTS": pipeline.settings.spark_conf.get(
                "spark.driver.extraJavaOptions", ""
            ),
        }.items():
            monkeypatch.setenv(key, value)

    return use
