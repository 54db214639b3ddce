"""The hostmetrics example's logic in plain Python: advance one host's rolling window by
one event and compute that event's output.

`pipelines.hostmetrics.pipeline` runs it inside Spark's stateful operator, per host, in
msg_id order. Everything here is deterministic: the output for a msg_id depends only on the
inbound records up to it, never on batch boundaries, wall-clock time or which engine
computes it (the contract's one rule, `twinstream.contract`).

Inbound value (JSON object)::

    {"host": "web-1", "ts": "2026-11-22T10:00:00.000Z", "cpu_user": 12.5,
     "cpu_system": 3.0, "mem_used_mb": 2048, "mem_free_mb": 6144}

Outbound value: the input fields, then ``msg_id``, ``window_count``, ``cpu_user_avg20``
and ``mem_used_sum20`` over the host's last 20 events (fewer after a gap in the host's
event time longer than the window retention, which starts a fresh window).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from twinstream.core.rows import Output, encode

WINDOW_SIZE = 20
# The inbound record, in output order (the framework validates it: twinstream.engine.pipeline).
SCHEMA = (
    "host STRING, ts STRING, cpu_user DOUBLE, cpu_system DOUBLE, mem_used_mb BIGINT, "
    "mem_free_mb BIGINT"
)
FIELDS = ("host", "ts", "cpu_user", "cpu_system", "mem_used_mb", "mem_free_mb")
# The output carries memory figures as 64-bit integers (what a JVM or SQL consumer reads).
INT64 = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class Event:
    msg_id: int
    host: str
    ts: str  # as received, so the output repeats it byte for byte
    ts_ms: int
    cpu_user: float
    cpu_system: float
    mem_used_mb: int
    mem_free_mb: int


@dataclass(frozen=True)
class Window:
    """One host's state: its last events' values, oldest first, and its latest event time."""

    cpu_user: tuple[float, ...]
    mem_used_mb: tuple[int, ...]
    last_ts_ms: int


class Overflow(ArithmeticError):
    """The window's arithmetic with this event leaves the output's range."""


def parse_time(text: str) -> int:
    """RFC 3339 in UTC ('Z' or +00:00) to epoch milliseconds; ValueError otherwise."""
    if len(text) < 20 or text[10] not in "Tt ":
        raise ValueError("not an RFC 3339 date-time")
    parsed = datetime.fromisoformat(text[:-1] + "Z" if text.endswith("z") else text)
    if parsed.utcoffset() != timedelta(0):
        raise ValueError("not UTC")
    # Integer arithmetic: a float timestamp would round sub-millisecond parts unevenly.
    whole_seconds = int(parsed.replace(microsecond=0).timestamp())
    return whole_seconds * 1000 + parsed.microsecond // 1000


def step(window: Window | None, event: Event, retention_ms: int) -> tuple[Window, Output]:
    """Advance a host's window by one event and compute that event's output; raises
    Overflow, leaving `window` as it was, when the output could not carry the result."""
    if window is not None and event.ts_ms - window.last_ts_ms > retention_ms:
        window = None  # the host's state expired in event time: start afresh
    cpu = (*(window.cpu_user if window else ()), event.cpu_user)[-WINDOW_SIZE:]
    mem = (*(window.mem_used_mb if window else ()), event.mem_used_mb)[-WINDOW_SIZE:]
    last_ts = max(window.last_ts_ms, event.ts_ms) if window else event.ts_ms
    try:
        cpu_avg = math.fsum(cpu) / len(cpu)
    except OverflowError:
        raise Overflow("overflow: cpu_user_avg20 leaves the range of a double") from None
    mem_sum = sum(mem)
    if not INT64[0] <= mem_sum <= INT64[1]:
        raise Overflow("overflow: mem_used_sum20 does not fit 64 bits")
    value: dict[str, Any] = {
        "host": event.host,
        "ts": event.ts,
        "cpu_user": event.cpu_user,
        "cpu_system": event.cpu_system,
        "mem_used_mb": event.mem_used_mb,
        "mem_free_mb": event.mem_free_mb,
        "msg_id": event.msg_id,
        "window_count": len(cpu),
        "cpu_user_avg20": cpu_avg,
        "mem_used_sum20": mem_sum,
    }
    return Window(cpu, mem, last_ts), Output(event.msg_id, "out", event.host, encode(value))
