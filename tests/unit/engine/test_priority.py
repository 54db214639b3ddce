"""When an adopted spare's engine is raised to the engines' CPU priority
(twinstream.engine.priority)."""

from __future__ import annotations

import os

from twinstream.engine.priority import Priority, raise_every_thread


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def priority(niced: bool = True, niced_s: float = 120.0) -> tuple[Priority, list[int], Clock]:
    calls: list[int] = []
    clock = Clock()

    def raise_() -> int:
        calls.append(1)
        return 7

    return Priority(niced, niced_s, raise_=raise_, clock=clock), calls, clock


def test_an_adopted_engine_stays_niced_while_it_catches_up() -> None:
    p, calls, clock = priority()
    for _ in range(60):
        clock.now += 1
        assert p.update(in_sync=False, leads=False) is None
    assert p.niced
    assert calls == []


def test_it_is_raised_once_when_in_sync_and_never_again() -> None:
    p, calls, _ = priority()
    why = p.update(in_sync=True, leads=False)
    assert why == "it is in sync (7 threads raised to niceness 0)"
    assert not p.niced
    assert p.update(in_sync=True, leads=True) is None
    assert p.update(in_sync=False, leads=False) is None
    assert calls == [1]


def test_it_is_raised_at_once_when_it_leads_though_behind() -> None:
    p, calls, _ = priority()
    assert p.update(in_sync=False, leads=True) == "it leads (7 threads raised to niceness 0)"
    assert calls == [1]


def test_a_starved_catch_up_is_raised_after_its_bound() -> None:
    p, calls, clock = priority(niced_s=120)
    clock.now += 119.9
    assert p.update(in_sync=False, leads=False) is None
    clock.now += 0.1
    why = p.update(in_sync=False, leads=False)
    assert why is not None
    assert "TWINSTREAM_CATCH_UP_NICED_S" in why
    assert calls == [1]


def test_a_bound_of_0_raises_at_the_first_look() -> None:
    p, calls, _ = priority(niced_s=0)
    assert p.update(in_sync=False, leads=False) is not None
    assert calls == [1]


def test_an_engine_started_cold_is_never_touched() -> None:
    p, calls, clock = priority(niced=False)
    clock.now += 1000
    assert p.update(in_sync=True, leads=True) is None
    assert calls == []


def test_an_ending_standby_is_lowered_and_an_ending_active_is_not() -> None:
    lowered: list[int] = []

    def lower(niceness: int) -> int:
        lowered.append(niceness)
        return 3

    standby = Priority(False, 0, raise_=lambda: 0, lower=lower)
    assert standby.ending(leads=False) == 3
    assert lowered == [10]
    assert standby.niced
    active = Priority(False, 0, raise_=lambda: 0, lower=lower)
    assert active.ending(leads=True) == 0
    assert lowered == [10]


def test_raise_every_thread_raises_a_niced_thread_of_this_process() -> None:
    import threading

    seen: dict[str, int] = {}
    go = threading.Event()
    done = threading.Event()

    def niced() -> None:
        os.setpriority(os.PRIO_PROCESS, 0, 5)  # this thread only, on Linux
        go.set()
        done.wait(10)
        seen["after"] = os.getpriority(os.PRIO_PROCESS, 0)

    thread = threading.Thread(target=niced, name="niced")
    thread.start()
    assert go.wait(10)
    try:
        raised = raise_every_thread()
    finally:
        done.set()
        thread.join(10)
    if os.geteuid() == 0:
        assert raised >= 1
        assert seen["after"] == 0
    else:  # raising needs root or CAP_SYS_NICE: it stays, and says so
        assert seen["after"] == 5


def test_lower_every_thread_lowers_every_thread_and_raises_none() -> None:
    import subprocess
    import sys

    # In a child process of its own: this one's niceness must not change.
    code = (
        "import os, threading\n"
        "from twinstream.engine.priority import lower_every_thread\n"
        "seen = {}\n"
        "go, done = threading.Event(), threading.Event()\n"
        "def lower_already():\n"
        "    os.setpriority(os.PRIO_PROCESS, 0, 15)\n"
        "    go.set(); done.wait(10)\n"
        "    seen['niced'] = os.getpriority(os.PRIO_PROCESS, 0)\n"
        "t = threading.Thread(target=lower_already); t.start(); go.wait(10)\n"
        "lowered = lower_every_thread(10)\n"
        "done.set(); t.join(10)\n"
        "print(lowered, os.getpriority(os.PRIO_PROCESS, 0), seen['niced'])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    lowered, main, niced = (int(x) for x in out)
    assert lowered >= 1
    assert main == 10  # the main thread, at 0, went down
    assert niced == 15  # the thread already below stayed where it was
