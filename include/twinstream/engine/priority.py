"""An engine's CPU priority: the active's output before a standby's catch-up.

Guarantee: an engine adopted from a warm spare (a restart, a deploy's restart on a new
version, the replacement of a killed engine) keeps the spare's low priority
(`SPARE_NICENESS`) while it catches up, and is raised to the engines' own (niceness 0) once,
at the first of: it is in sync, it leads, or `niced_s` have passed since its adoption (so
that a standby starved on a busy machine still catches up). Once raised it is never lowered
again while it runs, and an engine started cold is never lowered while it runs. An engine
that ends while it does not lead (a deploy's or a restart's stop of a standby) lowers itself
first: its shutdown paused the active's output 3 s in a deploy on two cores.

Why: on two cores a restarted standby's catch-up batches (20,000 records each) took the
cores from the active as its equal, and the active's output paused 7-9 s during every
deploy (bench.deploy, README "Change a running pipeline"). A catch-up can wait; an output
cannot. The cost is a slower catch-up while the machine is busy, bounded by `niced_s`.

Linux keeps a niceness per thread and a new thread inherits its creator's: the raise walks
every thread of this process and of its children (Spark's JVM, its Python workers).
Raising needs root or CAP_SYS_NICE; without it the engine stays niced and says so.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from twinstream.engine.spare import SPARE_NICENESS

log = logging.getLogger(__name__)


def _threads() -> list[int]:
    """Every thread of this process and of its children (Spark's JVM, its Python workers)."""
    import psutil

    me = psutil.Process()
    found: list[int] = []
    for process in (me, *me.children(recursive=True)):
        try:
            found.extend(t.id for t in process.threads())
        except psutil.Error:
            continue
    return found


def _renice_every_thread(niceness: int, *, lowering: bool) -> int:
    """Every thread of this process and of its children to `niceness`, only those above it
    (`lowering`) or only those below (raising): a thread is never moved the other way.
    Returns how many were moved. Raising needs root or CAP_SYS_NICE: where it is not
    allowed the threads stay, and it is logged."""
    moved = 0
    for tid in _threads():
        try:
            now = os.getpriority(os.PRIO_PROCESS, tid)
            if (now < niceness) if lowering else (now > niceness):
                os.setpriority(os.PRIO_PROCESS, tid, niceness)
                moved += 1
        except ProcessLookupError:
            continue  # a thread that ended meanwhile
        except PermissionError:
            log.warning(
                "the engine keeps its spare's low CPU priority: raising it needs root or "
                "CAP_SYS_NICE (or start spares without `nice`)"
            )
            return moved
    return moved


def raise_every_thread() -> int:
    """Every thread of this process and of its children back to niceness 0; how many."""
    return _renice_every_thread(0, lowering=False)


def lower_every_thread(niceness: int) -> int:
    """Every thread of this process and of its children down to `niceness`; how many. For
    an engine that ends while it does not lead. (`twinstream.stack.launch.lower_priority`
    lowers the calling thread alone, before it starts the processes that inherit it.)"""
    return _renice_every_thread(niceness, lowering=True)


class Priority:
    """When an engine is raised or lowered (the module's guarantee). `update` is the
    engine's main loop's, once a second; `ending` its shutdown's; `niced` is a read."""

    def __init__(
        self,
        niced: bool,
        niced_s: float,
        *,
        raise_: Callable[[], int] = raise_every_thread,
        lower: Callable[[int], int] = lower_every_thread,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # niced_s 0: raised at the first update, as an adopted spare was before.
        self._niced = niced
        self._until = clock() + niced_s
        self._raise = raise_
        self._lower = lower
        self._clock = clock

    @property
    def niced(self) -> bool:
        return self._niced

    def update(self, in_sync: bool, leads: bool) -> str | None:
        """Raise the engine when it is time; why it was raised (for the log), else None."""
        if not self._niced:
            return None
        if leads:
            why = "it leads"
        elif in_sync:
            why = "it is in sync"
        elif self._clock() >= self._until:
            why = "its catch-up took longer than TWINSTREAM_CATCH_UP_NICED_S"
        else:
            return None
        self._niced = False
        threads = self._raise()
        return f"{why} ({threads} threads raised to niceness 0)"

    def ending(self, leads: bool) -> int:
        """The engine's process ends: below the engines that go on unless it leads (an
        active's stop leaves the election first, and a standby takes over meanwhile).
        How many threads were lowered."""
        if leads:
            return 0
        self._niced = True
        return self._lower(SPARE_NICENESS)
