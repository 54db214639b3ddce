"""`twinstream restart ENGINE` (twinstream.stack.restart) with a fake supervisord: which
program it stops and starts, that it waits for the engine's probe, what it says, and the
errors that name the fix (an unknown engine, a stack that is not running)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from twinstream.ops import cli
from twinstream.platform.settings import Settings, SettingsError, load_settings
from twinstream.stack import restart
from twinstream.stack.core import StackError
from twinstream.stack.layout import Layout
from twinstream.stack.supervisor import ProcessInfo


class FakeSupervisor:
    def __init__(self, programs: dict[str, str], running: bool = True) -> None:
        self.states = programs  # program -> state
        self.running = running
        self.calls: list[tuple[str, ...]] = []
        self.pids = {name: 100 + i for i, name in enumerate(programs)}

    def is_running(self) -> bool:
        return self.running

    def process(self, name: str) -> ProcessInfo:
        if name not in self.states:
            raise KeyError(name)
        state = self.states[name]
        return ProcessInfo(name, name, state, self.pids[name] if state == "RUNNING" else 0, "")

    def processes(self) -> list[ProcessInfo]:
        return [self.process(name) for name in self.states]

    def stop(self, name: str) -> None:
        self.calls.append(("stop", name))
        self.states[name] = "STOPPED"

    def start(self, name: str, wait: bool = True) -> None:
        self.calls.append(("start", name, str(wait)))
        self.states[name] = "RUNNING"
        self.pids[name] += 1000


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # The repository's pipelines file: hostmetrics on a and b, payments on c and d.
    return load_settings(admin_token="t", state_dir=tmp_path)


def _restart(
    settings: Settings, engine: str, supervisor: FakeSupervisor, roles: dict[str, str], **kw: Any
) -> tuple[list[str], list[list[str]]]:
    lines: list[str] = []
    waited: list[list[str]] = []

    def wait(_s: Settings, layout: Layout, sup: Any, echo: Any, names: Iterable[str]) -> None:
        assert sup is supervisor
        waited.append(list(names))
        echo(f"  {waited[-1][0]} healthy after 20.0s: ...")

    restart.restart_engine(
        settings,
        engine,
        echo=lines.append,
        supervisor=supervisor,
        wait=wait,
        role=lambda s, e: roles[e],
        **kw,
    )
    return lines, waited


def test_a_standby_is_stopped_started_and_awaited_until_healthy(settings: Settings) -> None:
    supervisor = FakeSupervisor({"engine-a": "RUNNING", "engine-b": "RUNNING"})
    lines, waited = _restart(settings, "b", supervisor, {"b": "standby"})
    # Started without waiting for startsecs: the probe says when it is back.
    assert supervisor.calls == [("stop", "engine-b"), ("start", "engine-b", "False")]
    assert waited == [["engine-b"]]
    assert lines[0] == (
        "restarting engine b of pipeline hostmetrics (standby, engine-b RUNNING, pid 101)"
    )
    assert not any("takes over" in line for line in lines)
    assert lines[-1].startswith("engine b restarted in ")
    assert "(pid 1101)" in lines[-1]


def test_the_active_is_said_to_fail_over(settings: Settings) -> None:
    supervisor = FakeSupervisor({"engine-c": "RUNNING", "engine-d": "STOPPED"})
    lines, _ = _restart(settings, "c", supervisor, {"c": "active"}, pipeline="payments")
    assert "a standby takes over now" in lines[1]
    # A stopped program is started, without asking a probe for its role.
    lines, _ = _restart(settings, "d", supervisor, {})
    assert lines[0] == "restarting engine d of pipeline payments (none, engine-d STOPPED)"
    assert ("start", "engine-d", "False") in supervisor.calls


@pytest.mark.parametrize(
    ("engine", "pipeline", "says"),
    [
        ("z", None, "no engine 'z' on this stack"),
        ("z", None, "its engines are a (hostmetrics), b (hostmetrics), c (payments), d (payments)"),
        (
            "a",
            "payments",
            "engine a runs pipeline hostmetrics, not payments (whose engines are c, d)",
        ),
        ("a", "shop", "no pipeline 'shop' on this stack (hostmetrics, payments)"),
    ],
)
def test_an_engine_the_stack_does_not_run_is_refused_naming_those_it_does(
    settings: Settings, engine: str, pipeline: str | None, says: str
) -> None:
    supervisor = FakeSupervisor({"engine-a": "RUNNING"})
    with pytest.raises(SettingsError) as caught:
        _restart(settings, engine, supervisor, {}, pipeline=pipeline)
    assert says in str(caught.value)
    assert supervisor.calls == []


def test_a_stack_that_is_not_running_or_lacks_the_program_is_an_error_naming_the_fix(
    settings: Settings,
) -> None:
    with pytest.raises(StackError, match="the local stack is not running") as caught:
        _restart(settings, "a", FakeSupervisor({}, running=False), {})
    assert "start it with `make up`" in str(caught.value)
    assert "docker compose restart engine-a" in str(caught.value)
    with pytest.raises(StackError, match="has no program engine-c") as caught:
        _restart(settings, "c", FakeSupervisor({"engine-a": "RUNNING"}), {})
    assert "run `make up`" in str(caught.value)


def test_an_engine_that_does_not_come_back_says_why_with_its_log(settings: Settings) -> None:
    class Failing(FakeSupervisor):
        def start(self, name: str, wait: bool = True) -> None:
            super().start(name, wait)
            self.states[name] = "FATAL"  # supervisord gave up on it

    log = Layout.of(settings).log_file("engine-a")
    log.parent.mkdir(parents=True)
    log.write_text("py4j.protocol.Py4JError: the JVM went away\n")
    lines: list[str] = []
    with pytest.raises(StackError, match="engine-a keeps failing to start") as caught:
        # The real wait, as `make up`'s.
        restart.restart_engine(
            settings,
            "a",
            echo=lines.append,
            supervisor=Failing({"engine-a": "RUNNING"}),
            role=lambda s, e: "standby",
        )
    assert "the JVM went away" in str(caught.value)
    assert "  waiting for engine-a" in lines


def test_the_cli_restarts_the_engine_it_is_given_with_the_stacks_settings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    seen: dict[str, Any] = {}

    def fake(settings: Settings, engine_id: str, *, pipeline: str | None, echo: Any) -> None:
        seen.update(engine=engine_id, pipeline=pipeline, settings=settings.pipeline)
        echo("done")

    real = restart.restart_engine
    monkeypatch.setattr(restart, "restart_engine", fake)
    assert cli.main(["restart", "c", "--pipeline", "payments"]) == 0
    # The stack's settings (no pipeline chosen), not payments': the engines are looked up
    # among the stack's.
    assert seen == {"engine": "c", "pipeline": "payments", "settings": ""}
    assert capsys.readouterr().out == "done\n"
    monkeypatch.setattr(restart, "restart_engine", real)
    monkeypatch.setenv("TWINSTREAM_STATE_DIR", str(tmp_path))
    assert cli.main(["restart", "z"]) == 2
    err = capsys.readouterr().err
    assert "twinstream restart: no engine 'z' on this stack" in err
    assert "Traceback" not in err


def test_a_deploys_engine_start_waits_until_its_api_answers_and_names_a_failure(settings):
    """twinstream.ops.deploy's processes on the local stack: an engine waiting for its
    restore does not pass `make up`'s probe, so a start waits for its admin API only."""
    from tests.unit.fakes import FakeClock

    supervisor = FakeSupervisor({"engine-a": "RUNNING", "engine-b": "RUNNING"})
    clock = FakeClock()
    answers = iter(["connection refused"] * 25 + [None])
    lines: list[str] = []
    processes = restart.EngineProcesses(
        settings,
        answers=lambda e: next(answers),
        timeout_s=settings.startup_timeout_s,
        echo=lines.append,
        supervisor=supervisor,
        clock=clock,
        sleep=clock.sleep,
    )
    processes.stop("b")
    processes.start("b")
    assert supervisor.calls == [("stop", "engine-b"), ("start", "engine-b", "False")]
    assert "  engine-b: 10 s, not answering yet (connection refused)" in lines
    assert lines[-1] == "  engine-b answers after 12.5 s"

    supervisor.states["engine-b"] = "FATAL"
    supervisor.start = lambda name, wait=True: None  # type: ignore[method-assign]
    failing = restart.EngineProcesses(
        settings,
        answers=lambda e: "refused",
        timeout_s=settings.startup_timeout_s,
        supervisor=supervisor,
        clock=clock,
        sleep=clock.sleep,
    )
    with pytest.raises(StackError, match=r"keeps failing to start .* read .*engine-b"):
        failing.start("b")
    with pytest.raises(StackError, match="make up"):
        restart.EngineProcesses(
            settings, lambda e: None, 60.0, supervisor=FakeSupervisor({}, running=False)
        )
