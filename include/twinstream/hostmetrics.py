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

import base64
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

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
    """Why a record cannot be used. `reason` starts with a code: not_json, missing_field,
    wrong_type, bad_time, oversize."""

    msg_id: int
    reason: str
    raw: bytes


@dataclass(frozen=True)
class Window:
    """One host's state: its last events' values, oldest first, and its latest event time."""

    cpu_user: tuple[float, ...]
    mem_used_mb: tuple[int, ...]
    last_ts_ms: int


@dataclass(frozen=True)
class Output:
    msg_id: int
    kind: str  # "out" or "dlq"
    key: str | None
    value: str


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
    msg_id: int, raw: bytes | None, max_bytes: int, key: str | None = None
) -> Event | Rejection:
    """Validate one inbound record. `key` is the host the record was grouped under, if any;
    a record whose parsed host differs (duplicate "host" members) is rejected."""
    data = raw or b""
    if len(data) > max_bytes:
        return Rejection(msg_id, f"oversize: {len(data)} bytes > {max_bytes}", data)
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        return Rejection(msg_id, "not_json: not UTF-8", data)
    except json.JSONDecodeError as exc:
        return Rejection(msg_id, f"not_json: {exc.msg} at char {exc.pos}", data)
    if not isinstance(obj, dict):
        return Rejection(msg_id, f"not_json: a JSON {type(obj).__name__}, not an object", data)
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
            return Rejection(msg_id, f"wrong_type: {name} is not finite", data)
    if not obj["host"]:
        return Rejection(msg_id, "wrong_type: host is empty", data)
    if key is not None and obj["host"] != key:
        return Rejection(msg_id, "wrong_type: host is ambiguous (duplicate member)", data)
    try:
        ts_ms = parse_time(obj["ts"])
    except ValueError:
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
    """Advance a host's window by one event and compute that event's output."""
    if window is not None and event.ts_ms - window.last_ts_ms > retention_ms:
        window = None  # the host's state expired in event time: start afresh
    cpu = (*(window.cpu_user if window else ()), event.cpu_user)[-WINDOW_SIZE:]
    mem = (*(window.mem_used_mb if window else ()), event.mem_used_mb)[-WINDOW_SIZE:]
    last_ts = max(window.last_ts_ms, event.ts_ms) if window else event.ts_ms
    value: dict[str, Any] = {
        "host": event.host,
        "ts": event.ts,
        "cpu_user": event.cpu_user,
        "cpu_system": event.cpu_system,
        "mem_used_mb": event.mem_used_mb,
        "mem_free_mb": event.mem_free_mb,
        "msg_id": event.msg_id,
        "window_count": len(cpu),
        "cpu_user_avg20": math.fsum(cpu) / len(cpu),
        "mem_used_sum20": sum(mem),
    }
    return Window(cpu, mem, last_ts), Output(event.msg_id, "out", event.host, encode(value))


def dead_letter(rejection: Rejection) -> Output:
    value = {
        "msg_id": rejection.msg_id,
        "reason": rejection.reason,
        "raw": base64.b64encode(rejection.raw).decode("ascii"),
    }
    return Output(rejection.msg_id, "dlq", None, encode(value))


def encode(value: dict[str, Any]) -> str:
    # Fixed member order and separators: every engine emits the same bytes.
    return json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False)


def process_host(
    window: Window | None,
    records: Iterable[tuple[int, bytes | None]],
    retention_ms: int,
    max_bytes: int,
    key: str | None = None,
) -> tuple[Window | None, list[Output]]:
    """Run one host's records (in msg_id order) through parse and step."""
    outputs = []
    for msg_id, raw in records:
        parsed = parse(msg_id, raw, max_bytes, key)
        if isinstance(parsed, Rejection):
            outputs.append(dead_letter(parsed))
        else:
            window, output = step(window, parsed, retention_ms)
            outputs.append(output)
    return window, outputs


def reference(
    records: Iterable[tuple[int, bytes | None]], retention_ms: int, max_bytes: int
) -> Iterator[Output]:
    """What the pipeline must produce for these inbound records, computed without Spark."""
    windows: dict[str, Window] = {}
    for msg_id, raw in sorted(records, key=lambda r: r[0]):
        parsed = parse(msg_id, raw, max_bytes)
        if isinstance(parsed, Rejection):
            yield dead_letter(parsed)
            continue
        window, output = step(windows.get(parsed.host), parsed, retention_ms)
        windows[parsed.host] = window
        yield output
