"""The engine's lifecycle (twinstream.engine.lifecycle): every move of its table is allowed
and logged once with its reason, any other is refused and leaves the state; the engine logs a
refusal and goes on."""

from __future__ import annotations

import logging

import pytest

from twinstream.core.logs import EngineLog
from twinstream.engine.lifecycle import TRANSITIONS, Lifecycle, State, TransitionRefused

ALLOWED = [(was, to) for was, targets in TRANSITIONS.items() for to in sorted(targets)]
REFUSED = [
    (was, to) for was in State for to in State if to is not was and to not in TRANSITIONS[was]
]


def at(state: State) -> Lifecycle:
    """A lifecycle in `state`, reached along the table from stopped."""
    lifecycle = Lifecycle(logging.getLogger("test"))
    path = {
        State.STOPPED: [],
        State.RUNNING: [State.RUNNING],
        State.RESTORING: [State.RESTORING],
        State.PERSISTING: [State.RUNNING, State.PERSISTING],
        State.RECOVERING: [State.RUNNING, State.RECOVERING],
    }[state]
    for step in path:
        lifecycle.move(step, "on the way")
    assert lifecycle.state is state
    return lifecycle


def test_the_table_names_every_state_and_a_way_into_each_but_the_first() -> None:
    assert set(TRANSITIONS) == set(State)
    reachable = {to for targets in TRANSITIONS.values() for to in targets}
    assert reachable == set(State)
    assert [s.value for s in State] == [
        "stopped",
        "running",
        "restoring",
        "persisting",
        "recovering",
    ]


@pytest.mark.parametrize(("was", "to"), ALLOWED, ids=[f"{a}->{b}" for a, b in ALLOWED])
def test_an_allowed_move_changes_the_state_and_is_logged_once(
    was: State, to: State, caplog: pytest.LogCaptureFixture
) -> None:
    lifecycle = at(was)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="test"):
        assert lifecycle.move(to, "because")
    assert (lifecycle.state, lifecycle.reason) == (to, "because")
    assert [r.getMessage() for r in caplog.records] == [f"{was} -> {to} (because)"]


@pytest.mark.parametrize(("was", "to"), REFUSED, ids=[f"{a}->{b}" for a, b in REFUSED])
def test_a_move_the_table_does_not_allow_is_refused_and_the_state_stays(
    was: State, to: State
) -> None:
    lifecycle = at(was)
    with pytest.raises(TransitionRefused, match=f"cannot go from {was} to {to}"):
        lifecycle.move(to, "impossible")
    assert (lifecycle.state, lifecycle.reason) == (
        was,
        "on the way" if was is not State.STOPPED else "not started",
    )


def test_the_same_state_only_changes_the_reason_unlogged(caplog: pytest.LogCaptureFixture) -> None:
    lifecycle = at(State.STOPPED)
    with caplog.at_level(logging.INFO, logger="test"):
        assert lifecycle.move(State.STOPPED, "no checkpoint; restore a snapshot")
    assert lifecycle.reason == "no checkpoint; restore a snapshot"
    assert not caplog.records


def test_only_from_moves_nothing_when_the_state_is_another() -> None:
    lifecycle = at(State.STOPPED)  # a stop came first
    assert not lifecycle.move(State.RUNNING, "", only_from=State.RESTORING)
    assert lifecycle.state is State.STOPPED


def test_a_move_is_logged_with_the_engine_and_the_pipeline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lifecycle = Lifecycle(EngineLog(logging.getLogger("test"), "a", "hostmetrics"))
    with caplog.at_level(logging.INFO, logger="test"):
        lifecycle.move(State.RUNNING, "")
    (record,) = caplog.records
    assert record.getMessage() == "engine a pipeline hostmetrics: stopped -> running"
    assert (record.engine, record.pipeline) == ("a", "hostmetrics")  # type: ignore[attr-defined]


def test_the_engine_logs_a_refused_move_and_goes_on(engine, caplog) -> None:
    """A persisting engine cannot start a restore: both hold the engine's lock."""
    engine.lifecycle.move(State.PERSISTING, "writing a snapshot")
    assert engine._become(State.RESTORING, "restoring cold") is False
    assert engine.lifecycle.state is State.PERSISTING
    assert "cannot go from persisting to restoring (restoring cold)" in caplog.text
    assert "This is a bug of the engine: report it" in caplog.text


def test_a_status_read_never_moves_the_lifecycle(engine) -> None:
    engine.lifecycle.move(State.STOPPED, "stopped")
    engine.lifecycle.move(State.RESTORING, "replaying")
    engine.election.zk_state = "CONNECTED"
    engine.pipeline()
    engine.metrics()
    engine.server()
    assert engine.lifecycle.state is State.RESTORING
