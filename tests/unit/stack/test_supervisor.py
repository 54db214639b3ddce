"""twinstream.stack.supervisor.at_once: supervisord's starts and stops of several engines at
the same time, every error surfaced."""

from __future__ import annotations

import threading

import pytest

from twinstream.stack.supervisor import at_once


def test_every_action_runs_at_the_same_time():
    # Each action waits for all the others: one after the other, the first would time out.
    names = ["engine-a", "engine-b", "engine-c"]
    barrier = threading.Barrier(len(names), timeout=5)
    done: list[str] = []

    def action(name: str) -> None:
        barrier.wait()
        done.append(name)

    at_once(action, names)
    assert sorted(done) == names


def test_an_error_is_raised_once_every_action_has_ended():
    ended: list[str] = []

    def action(name: str) -> None:
        if name == "engine-a":
            raise RuntimeError(f"{name} would not stop")
        ended.append(name)

    with pytest.raises(RuntimeError, match="engine-a would not stop"):
        at_once(action, ["engine-a", "engine-b"])
    assert ended == ["engine-b"]


def test_no_names_is_nothing_to_do():
    at_once(lambda _name: pytest.fail("called"), [])
