"""Host metrics on the contract: one output per valid input, per-host state in RocksDB.

Inbound value (JSON object)::

    {"host": "web-1", "ts": "2026-11-22T10:00:00.000Z", "cpu_user": 12.5,
     "cpu_system": 3.0, "mem_used_mb": 2048, "mem_free_mb": 6144}

Outbound value: the input fields, then ``msg_id``, ``window_count``, ``cpu_user_avg20``
and ``mem_used_sum20`` over the host's last 20 events (fewer after a gap in the host's
event time longer than TWINSTREAM_WINDOW_RETENTION_MS, which starts a fresh window).

The framework validates the schema and the `BOUNDS` (no negative CPU time or memory in
use); the transform adds what only this pipeline knows: an RFC 3339 UTC time (`bad_time`)
and a window whose sums stay in range (`overflow`). The audit's expectations on the
statistics follow from the same `BOUNDS`, so nothing the guard lets through fails them. The
value is serialised here, by Python's JSON encoder, so that its bytes are those of the
first version of this example (`tests/data/hostmetrics-golden.jsonl.gz`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipelines.hostmetrics.generate import synthetic
from pipelines.hostmetrics.logic import (
    FIELDS,
    SCHEMA,
    WINDOW_SIZE,
    Event,
    Overflow,
    Window,
    parse_time,
    step,
)
from twinstream.contract import Bound, Keyed, Pipeline, Reject
from twinstream.platform.settings import PipelineSettings, load

# What a reading may be: one declaration for the guard (a record outside is dead-lettered,
# `out_of_range: mem_used_mb is below 0`) and the audit (`expectations` below derive from it).
# No upper bound on cpu_user: the first version published any finite one (its golden output,
# tests/data/hostmetrics-golden.jsonl.gz, holds 1.8e308), so the averages expect none either.
BOUNDS = {
    "cpu_user": Bound(min=0),
    "cpu_system": Bound(min=0),
    "mem_used_mb": Bound(min=0),
}

# The window as the step keeps it per host: the last events' values and the latest time.
STATE = "cpu_user ARRAY<DOUBLE>, mem_used_mb ARRAY<BIGINT>, last_ts_ms BIGINT"


def advance(
    window: Window | None, record: Mapping[str, Any], retention_ms: int
) -> tuple[Window | None, str | None, str | None]:
    """One record through the window: (the new window, its output value, a dead letter's
    reason). A rejected record leaves the window as it was."""
    try:
        ts_ms = parse_time(record["ts"])
    except (ValueError, OverflowError):
        return window, None, f"bad_time: {record['ts'][:64]!r} is not RFC 3339 UTC"
    event = Event(
        msg_id=int(record["msg_id"]),
        host=record["host"],
        ts=record["ts"],
        ts_ms=ts_ms,
        cpu_user=float(record["cpu_user"]),
        cpu_system=float(record["cpu_system"]),
        mem_used_mb=int(record["mem_used_mb"]),
        mem_free_mb=int(record["mem_free_mb"]),
    )
    try:
        new_window, output = step(window, event, retention_ms)
    except Overflow as exc:
        return window, None, str(exc)
    return new_window, output.value, None


class HostStep:
    """`Keyed.step` for hostmetrics: one record through its host's window. The window
    retention is read from the settings at the first call, in the process that runs it."""

    retention_ms: int | None = None

    def __call__(
        self, state: tuple[Any, ...] | None, record: dict[str, Any]
    ) -> tuple[tuple[Any, ...] | None, dict[str, Any]]:
        if self.retention_ms is None:
            self.retention_ms = load(PipelineSettings).window_retention_ms
        window = None if state is None else Window(*state)
        new_window, value, reason = advance(window, record, self.retention_ms)
        if reason is not None:
            raise Reject(reason)
        assert new_window is not None
        new_state = (new_window.cpu_user, new_window.mem_used_mb, new_window.last_ts_ms)
        return new_state, {"host": record["host"], "value": value}


def expectations() -> list[Any]:
    """The outbound values: the fields the pipeline writes, typed and in range. The ranges
    come from `BOUNDS`, the ones the guard enforces: an echoed field and a mean keep their
    member's bound, a sum of values >= 0 is >= 0 (`Bound.expectation`)."""
    import great_expectations.expectations as gxe

    return [
        gxe.ExpectColumnPairValuesToBeEqual(column_A="msg_id", column_B="header_msg_id"),
        gxe.ExpectColumnValuesToNotBeNull(column="host"),
        gxe.ExpectColumnValuesToNotBeNull(column="ts"),
        gxe.ExpectColumnValuesToBeBetween(
            column="window_count", min_value=1, max_value=WINDOW_SIZE
        ),
        gxe.ExpectColumnValuesToNotBeNull(column="window_count"),
        *(bound.expectation(member) for member, bound in BOUNDS.items()),
        BOUNDS["cpu_user"].expectation("cpu_user_avg20"),
        gxe.ExpectColumnValuesToNotBeNull(column="cpu_user_avg20"),
        BOUNDS["mem_used_mb"].expectation("mem_used_sum20", of="sum"),
        gxe.ExpectColumnValuesToNotBeNull(column="mem_used_sum20"),
    ]


pipeline = Pipeline(
    name="hostmetrics",
    schema=SCHEMA,
    bounds=BOUNDS,
    checks={"wrong_type: host is empty": "host <> ''"},
    # Per host, in msg_id order: advance the host's window, one output per record.
    keyed=Keyed(step=HostStep(), output="host STRING, value STRING", state=STATE),
    key="host",
    partition_by="host",
    value=["value"],
    value_format="text",
    expectations=expectations,
    value_schema=(
        f"{SCHEMA}, msg_id BIGINT, window_count BIGINT, cpu_user_avg20 DOUBLE, "
        "mem_used_sum20 BIGINT"
    ),
    sample=lambda count, seed, broken_every: synthetic(count, seed=seed, broken_every=broken_every),
    description=__doc__ or "",
)

__all__ = ["FIELDS", "pipeline"]
