"""The stack's control logic without services: waiting, failing fast, refusing bad input."""

import os
import subprocess
import sys
from typing import Any

import pytest

from tests.unit.fakes import FakeClock
from twinstream.platform.settings import load_settings
from twinstream.stack import core, health
from twinstream.stack.layout import Layout
from twinstream.stack.supervisor import ProcessInfo


class FakeSupervisor:
    def __init__(self, states):
        self.states = states
        self.started: list[tuple[str, bool]] = []

    def start(self, name: str, wait: bool = True) -> None:
        self.started.append((name, wait))

    def processes(self):
        return [ProcessInfo(n, n, s, 1, "", 0.0) for n, s in self.states.items()]


def fake_supervisor(states) -> Any:
    return FakeSupervisor(states)


@pytest.fixture
def settings(tmp_path):
    return load_settings(state_dir=tmp_path, startup_timeout_s=30)


def test_waiting_reports_progress_and_each_service_as_it_turns_healthy(settings, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(health, "zookeeper", lambda s: (clock.now >= 3, "zk detail"))
    monkeypatch.setattr(
        health, "kafka_brokers", lambda s, **_: {1: "h:1"} if clock.now >= 12 else {}
    )
    lines: list[str] = []
    core.wait_until_healthy(
        settings,
        Layout.of(settings),
        fake_supervisor({"zookeeper": "RUNNING", "kafka-1": "RUNNING"}),
        lines.append,
        ["zookeeper", "kafka-1"],
        clock=clock,
        sleep=clock.sleep,
    )
    assert lines[0] == "  waiting for zookeeper, kafka-1"
    assert lines[1].split()[:2] == ["zookeeper", "healthy"]
    assert any("waiting for kafka-1" in line for line in lines[2:])
    assert lines[-1].split()[:2] == ["kafka-1", "healthy"]


def test_waiting_says_once_what_it_waits_for_then_only_changes_and_a_short_heartbeat(
    settings, monkeypatch
):
    """Details whose numbers move every poll (an engine's lag) print no line; a detail
    that changes its words does, once; the heartbeat names who is pending, no details."""
    clock = FakeClock()

    def zookeeper(_settings):
        if clock.now < 5:
            return False, f"no answer on h:2181: refused (try {clock.now:.0f})"
        if clock.now < 25:
            return False, f"not serving: {clock.now:.0f} ms behind"
        return True, "serving, mode standalone"

    monkeypatch.setattr(health, "zookeeper", zookeeper)
    lines: list[str] = []
    core.wait_until_healthy(
        settings,
        Layout.of(settings),
        fake_supervisor({"zookeeper": "RUNNING"}),
        lines.append,
        ["zookeeper"],
        clock=clock,
        sleep=clock.sleep,
    )
    assert lines[0] == "  waiting for zookeeper"
    changes = [line for line in lines if "not serving" in line]
    assert len(changes) == 1, lines
    heartbeats = [line for line in lines if line.lstrip().startswith("...")]
    assert [h.split() for h in heartbeats] == [
        ["...", "10s,", "still", "waiting", "for", "zookeeper"],
        ["...", "20s,", "still", "waiting", "for", "zookeeper"],
    ]
    assert lines[-1].split()[:2] == ["zookeeper", "healthy"]
    assert len(lines) == 5, lines


def test_a_service_supervisord_gave_up_on_fails_at_once_with_its_log(settings, monkeypatch):
    clock = FakeClock()
    layout = Layout.of(settings)
    layout.logs.mkdir(parents=True)
    layout.log_file("zookeeper").write_text("boot\nNoClassDefFoundError: com/x/Y\n")
    monkeypatch.setattr(health, "zookeeper", lambda s: (False, "refused"))
    with pytest.raises(core.StackError, match="supervisord gave up") as err:
        core.wait_until_healthy(
            settings,
            layout,
            fake_supervisor({"zookeeper": "FATAL"}),
            lambda _line: None,
            ["zookeeper"],
            clock=clock,
            sleep=clock.sleep,
        )
    assert "NoClassDefFoundError: com/x/Y" in str(err.value)
    assert clock.now == 0.0


def test_a_service_that_never_turns_healthy_times_out_naming_it(settings, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(health, "zookeeper", lambda s: (False, "ruok answered b''"))
    with pytest.raises(core.StackError, match="not healthy within 30s") as err:
        core.wait_until_healthy(
            settings,
            Layout.of(settings),
            fake_supervisor({"zookeeper": "RUNNING"}),
            lambda _line: None,
            ["zookeeper"],
            clock=clock,
            sleep=clock.sleep,
        )
    assert "zookeeper: ruok answered b''" in str(err.value)


def test_missing_jars_name_the_install_step(tmp_path):
    settings = load_settings(state_dir=tmp_path, jars_dir=tmp_path / "nojars")
    with pytest.raises(core.StackError, match="make install"):
        core.check_jars(settings)


def _cli(args, env_overrides, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TWINSTREAM_")}
    env.update({"TWINSTREAM_STATE_DIR": str(tmp_path), **env_overrides})
    return subprocess.run(
        [sys.executable, "-m", "twinstream.stack.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_cli_refuses_a_bad_setting_with_exit_2_and_the_variable_named(tmp_path):
    result = _cli(["up"], {"TWINSTREAM_KAFKA_PORTS": "9092,abc,9094"}, tmp_path)
    assert result.returncode == 2
    assert "TWINSTREAM_KAFKA_PORTS" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "supervisor").exists(), "nothing may be started or written"


def test_cli_status_and_down_of_a_stack_that_is_not_running(tmp_path):
    status = _cli(["status"], {}, tmp_path)
    assert status.returncode == 3
    assert "not running" in status.stdout
    down = _cli(["down"], {}, tmp_path)
    assert down.returncode == 0
    assert "not running" in down.stdout


def test_airflow_db_is_migrated_once_then_skipped_by_its_stamp(settings, monkeypatch):
    """`make up`'s airflow-db step: the migration runs with the stack's Airflow environment,
    and a second `make up` skips it without starting Airflow's CLI."""
    from twinstream.stack import launch

    calls: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(subprocess, "run", lambda argv, env, **_: calls.append((argv, env)))
    assert launch.migrate_airflow_db(settings, echo=lambda _line: None)
    [(argv, env)] = calls
    assert argv[1:] == ["db", "migrate"]
    assert env["AIRFLOW_HOME"] == str(Layout.of(settings).airflow_home)
    assert not launch.migrate_airflow_db(settings, echo=lambda _line: None)
    assert len(calls) == 1


def test_up_starts_the_engines_apart_and_without_waiting_for_each():
    """`_start_stopped` starts what is stopped among the programs asked for, and each start
    returns at once (wait_until_healthy watches them)."""
    supervisor = fake_supervisor(
        {"zookeeper": "EXITED", "airflow": "EXITED", "engine-a": "STOPPED", "engine-b": "FATAL"}
    )
    engines = ["engine-a", "engine-b"]
    later = [*engines, "airflow"]
    assert core._start_stopped(supervisor, lambda _line: None, exclude=later) == ["zookeeper"]
    assert core._start_stopped(supervisor, lambda _line: None, only=engines) == engines
    assert supervisor.started == [("zookeeper", False), ("engine-a", False), ("engine-b", False)]


def test_supervisord_starts_the_engines_only_when_up_asks(settings):
    """autostart=false for the engines, the keeper of their warm spares and Airflow
    alone (`up` starts Airflow once the engines run): supervisord still restarts them on
    exit."""
    from twinstream.stack import render

    conf = render.supervisord_conf(settings, Layout.of(settings), "/usr/bin")
    sections = {block.split("]", 1)[0]: block for block in conf.split("[program:")[1:]}
    assert any(name.startswith("engine-") for name in sections), sorted(sections)
    for name, block in sections.items():
        engine = name.startswith("engine-") or name in ("spares", "airflow")
        assert f"autostart={'false' if engine else 'true'}" in block, name
        assert "autorestart=true" in block, name


def test_up_names_each_engine_that_runs_older_code_than_its_files_and_restarts_none(settings):
    """`make up` after a change of a pipeline's code: the engines keep the code they
    started with, and `up` says which, never silently."""
    from tests.unit.fakes import server_info
    from twinstream.engine.client import EngineError
    from twinstream.platform import registry

    pipelines = registry.stack(settings)
    answers = {
        "a": server_info(pipeline_version="1+aaaaaaaaaaaa", code_on_disk="aaaaaaaaaaaa"),
        "b": server_info(
            pipeline_version="1+aaaaaaaaaaaa", code_on_disk="bbbbbbbbbbbb", stale=True
        ),
    }

    def server(pipeline, engine_id):
        if engine_id not in answers:
            raise EngineError(engine_id, "GET /server", None, "connection refused")
        return answers[engine_id]

    stale = core.stale_engines(pipelines, server)
    assert stale == [
        "engine b (hostmetrics) runs 1+aaaaaaaaaaaa; the pipeline's files are now bbbbbbbbbbbb"
    ]
    text = core.stale_text(stale)
    assert text.startswith("CODE CHANGED")
    assert "engine b (hostmetrics)" in text
    assert "`twinstream deploy PIPELINE`" in text
    assert core.stale_engines(pipelines, lambda p, e: answers["a"]) == []


def test_up_starts_airflow_only_once_the_engines_run():
    """ZooKeeper and Kafka first, the engines once Kafka is provisioned, Airflow once the
    engines are healthy: each step waited for before the next starts."""
    supervisor = fake_supervisor(
        {
            "zookeeper": "STOPPED",
            "kafka-1": "STOPPED",
            "airflow": "STOPPED",
            "engine-a": "STOPPED",
            "engine-b": "STOPPED",
        }
    )
    steps: list[object] = []
    real_start = supervisor.start

    def start(name: str, wait: bool = True) -> None:
        steps.append(("start", name))
        real_start(name, wait)

    supervisor.start = start
    started = core.start_in_order(
        supervisor,
        lambda _line: None,
        services=["zookeeper", "kafka-1"],
        engines=["engine-a", "engine-b"],
        wait=lambda names: steps.append(("wait", tuple(names))),
        provision=lambda: steps.append("provision"),
    )
    assert steps == [
        ("start", "zookeeper"),
        ("start", "kafka-1"),
        ("wait", ("zookeeper", "kafka-1")),
        "provision",
        ("start", "engine-a"),
        ("start", "engine-b"),
        ("wait", ("engine-a", "engine-b")),
        ("start", "airflow"),
        ("wait", ("airflow",)),
    ]
    assert started == ["zookeeper", "kafka-1", "engine-a", "engine-b", "airflow"]
