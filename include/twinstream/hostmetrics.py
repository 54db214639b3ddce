"""The example pipeline's logic in plain Python: parse and validate one inbound record, and
advance one host's rolling window by one event.

The Spark pipeline (``twinstream.pipeline``) runs exactly these functions inside its
stateful operator, and tests run them directly as the reference. Everything here is
deterministic: the output for a msg_id depends only on the inbound records up to it, never
on batch boundaries, wall-clock time or which engine computes it.

Inbound value (JSON object)::

    {"host": "web-1", "ts": "2026-11-22T10:00:00.000Z", "cpu_user": 12.5,
     "cpu_system": 3.0, "mem_used_mb": 2048, "mem_free_mb": 6144}

Outbound value: the input fields, then ``msg_id``, ``window_count``, ``cpu_user_avg20``
and ``mem_used_sum20`` over the host's last 20 events (fewer after a gap in the host's
event time longer than the window retention, which starts a fresh window).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from twinstream.core.rows import Output, clean_reason, dead_letter, encode, fits
from twinstream.guard import Limits, Rejected, load_json

WINDOW_SIZE = 20
# Field -> accepted JSON types, in output order.
FIELDS: dict[str, tuple[type, ...]] = {
    "host": (str,),
    "ts": (str,),
    "cpu_user": (int, float),
    "cpu_system": (int, float),
    "mem_used_mb": (int,),
    "mem_free_mb": (int,),
}
# The output carries memory figures as 64-bit integers (what a JVM or SQL consumer reads).
INT64 = (-(2**63), 2**63 - 1)
# Dead letters are capped to this size unless the caller says otherwise (Kafka's default
# message limit is 1 MB).
DEFAULT_MAX_MESSAGE_BYTES = 1_000_000


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
class Rejection:
    """Why a record cannot be used. `reason` starts with a code: those of
    `twinstream.guard`, and missing_field, wrong_type, out_of_range, bad_time, overflow
    (the window's arithmetic), error (anything unforeseen, with the exception)."""

    msg_id: int
    reason: str
    raw: bytes


@dataclass(frozen=True)
class Window:
    """One host's state: its last events' values, oldest first, and its latest event time."""

    cpu_user: tuple[float, ...]
    mem_used_mb: tuple[int, ...]
    last_ts_ms: int


class Overflow(ArithmeticError):
    """The window's arithmetic with this event leaves the output's range."""


def as_limits(limits: Limits | int) -> Limits:
    """The guard's limits; an int is the byte limit alone, the others at their defaults."""
    return Limits(max_bytes=limits) if isinstance(limits, int) else limits


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


def parse(
    msg_id: int, raw: bytes | None, limits: Limits | int, key: str | None = None
) -> Event | Rejection:
    """Validate one inbound record. `key` is the host the record was grouped under, if any;
    a record whose parsed host differs is rejected. `limits` as an int: the byte limit."""
    data = raw or b""
    obj = load_json(data, as_limits(limits))
    if isinstance(obj, Rejected):
        return Rejection(msg_id, obj.reason, data)
    if not isinstance(obj, dict):
        kind = "null" if obj is None else type(obj).__name__
        return Rejection(msg_id, f"not_json: a JSON {kind}, not an object", data)
    missing = [name for name in FIELDS if name not in obj]
    if missing:
        return Rejection(msg_id, f"missing_field: {', '.join(missing)}", data)
    for name, types in FIELDS.items():
        value = obj[name]
        # bool is an int in Python, never a number in a metric.
        if isinstance(value, bool) or not isinstance(value, types):
            want = " or ".join(t.__name__ for t in types)
            return Rejection(
                msg_id, f"wrong_type: {name} is {type(value).__name__}, want {want}", data
            )
        if isinstance(value, float) and not math.isfinite(value):
            return Rejection(msg_id, f"out_of_range: {name} is not finite", data)
        if isinstance(value, int) and not INT64[0] <= value <= INT64[1]:
            return Rejection(msg_id, f"out_of_range: {name} does not fit 64 bits", data)
        if isinstance(value, int) and float in types and not math.isfinite(float(value)):
            return Rejection(msg_id, f"out_of_range: {name} is not finite", data)
    if not obj["host"]:
        return Rejection(msg_id, "wrong_type: host is empty", data)
    if key is not None and obj["host"] != key:
        return Rejection(msg_id, "wrong_type: host is ambiguous (duplicate member)", data)
    try:
        ts_ms = parse_time(obj["ts"])
    except (ValueError, OverflowError):
        return Rejection(msg_id, f"bad_time: {obj['ts'][:64]!r} is not RFC 3339 UTC", data)
    return Event(
        msg_id=msg_id,
        host=obj["host"],
        ts=obj["ts"],
        ts_ms=ts_ms,
        cpu_user=float(obj["cpu_user"]),
        cpu_system=float(obj["cpu_system"]),
        mem_used_mb=obj["mem_used_mb"],
        mem_free_mb=obj["mem_free_mb"],
    )


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


def process_record(
    window: Window | None,
    msg_id: int,
    raw: bytes | None,
    retention_ms: int,
    limits: Limits,
    key: str | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> tuple[Window | None, Output]:
    """One record through parse and step, guarded: whatever it raises, the record becomes
    a dead letter with a reason and the window stays as it was (a rejected record never
    touches the state)."""
    data = raw or b""
    try:
        parsed = parse(msg_id, data, limits, key)
        if isinstance(parsed, Rejection):
            return window, dead_letter(msg_id, parsed.reason, data, max_message_bytes)
        new_window, output = step(window, parsed, retention_ms)
        if not fits(output, max_message_bytes):
            return window, dead_letter(
                msg_id, "oversize: the output would not fit one message", data, max_message_bytes
            )
        return new_window, output
    except Overflow as exc:
        return window, dead_letter(msg_id, str(exc), data, max_message_bytes)
    except Exception as exc:  # the guard's last line: never a failed batch
        reason = clean_reason(f"error: {type(exc).__name__}: {exc}")
        return window, dead_letter(msg_id, reason, data, max_message_bytes)


def process_host(
    window: Window | None,
    records: Iterable[tuple[int, bytes | None]],
    retention_ms: int,
    limits: Limits | int,
    key: str | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> tuple[Window | None, list[Output]]:
    """Run one host's records (in msg_id order) through the guarded parse and step."""
    limits = as_limits(limits)
    outputs = []
    for msg_id, raw in records:
        window, output = process_record(
            window, msg_id, raw, retention_ms, limits, key, max_message_bytes
        )
        outputs.append(output)
    return window, outputs


def reference(
    records: Iterable[tuple[int, bytes | None]],
    retention_ms: int,
    limits: Limits | int,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> Iterator[Output]:
    """What the pipeline must produce for these inbound records, computed without Spark."""
    limits = as_limits(limits)
    windows: dict[str, Window] = {}
    for msg_id, raw in sorted(records, key=lambda r: r[0]):
        parsed = parse(msg_id, raw, limits)
        host = parsed.host if isinstance(parsed, Event) else None
        window, output = process_record(
            windows.get(host) if host is not None else None,
            msg_id,
            raw,
            retention_ms,
            limits,
            max_message_bytes=max_message_bytes,
        )
        if host is not None and window is not None:
            windows[host] = window
        yield output
