"""How fast this machine runs now, against the machine the tests' time bounds were set on.

The guarantee a bound guards is the same on any machine; the seconds are not. The same code
here ran `make check` in 1 min 15 s one day and 2 min 35 s the next, and CI's `make test`
took 1,700 s on one run and 3,547 s on the next, where a takeover bounded at 5 s took 7.25 s
and a double kill bounded at 30 s took 41.6 s. A test that bounds a transition's seconds
multiplies its bound by the pace measured once at the session's start, before any service
runs (so that the stack's own load never loosens a bound): a slow hour fails no test that a
fast one passes, and a regression that costs more than the drift still fails. The pace is
at least 1 (a fast machine never tightens a bound) and at most MAX_PACE, and every run
prints it in pytest's header.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import time

# The environment variable that holds the session's pace: set once by tests/conftest.py,
# read by every bound; a developer may set it to reproduce another machine's bounds.
ENV = "TWINSTREAM_TEST_PACE"
# The workload's median seconds on a machine at the speed the bounds were set on: it measured
# 0.10-0.135 s here on 2026-11-29, when `make check` ran at half its speed of the day before
# (2 min 35 s against 1 min 15 s), the day CI's make test passed every bound in 1,700 s.
REFERENCE_S = 0.06
# Past this the machine is too slow for the bounds to mean anything: the test fails, as it
# should, rather than waiting for ever.
MAX_PACE = 2.5


def workload() -> float:
    """Seconds for a fixed mix of interpreted Python and hashing (both what the engines' and
    the tests' own processes spend their CPU on)."""
    started = time.perf_counter()
    total = 0
    for i in range(1_000_000):
        total += i * i % 7
    hashlib.sha256(b"x" * 10_000_000).digest()
    return time.perf_counter() - started


def measure(repeat: int = 9) -> float:
    """This machine's pace now: the workload's median over `repeat` runs against
    REFERENCE_S, within [1, MAX_PACE]."""
    median = statistics.median(workload() for _ in range(repeat))
    return min(max(median / REFERENCE_S, 1.0), MAX_PACE)


def pace() -> float:
    """The session's pace (ENV), 1 when none was measured (a test run outside the suite)."""
    text = os.environ.get(ENV, "")
    try:
        value = float(text) if text else 1.0
    except ValueError as exc:
        raise ValueError(f"{ENV}={text!r} is not a number: unset it or give e.g. 1.5") from exc
    return min(max(value, 1.0), MAX_PACE)


def bound(seconds: float) -> float:
    """A time bound set on the reference machine, scaled to this session's pace."""
    return seconds * pace()
