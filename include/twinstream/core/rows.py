"""The rows the failover core moves, each carrying the msg_id of the inbound record it came
from: an output row (to the outbound topic), a dead letter (to the dead-letter topic), or a
coverage row: the record was consumed and produced no output (a filter, an alert that did
not fire). A record has one or more output rows, or its dead letter, or one coverage row;
rows of one msg_id are published in one transaction, and coverage rows are never published
themselves: each transaction's progress record states the msg_id range it covers.

Guarantee: a dead letter built here always fits in one Kafka message of at most
`max_message_bytes`: the raw bytes it carries are cut to a prefix when they would not,
and the dead letter then also carries their full length and sha256, so nothing about the
record is lost but bytes that no consumer could have received anyway. Every function is
deterministic, so every engine builds the same bytes for the same record.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

# Room in a dead letter for everything but the raw bytes: msg_id, the reason (capped at
# MAX_REASON_CHARS, each character up to 6 bytes once JSON-escaped), the length and hash,
# field names, and the record's headers and batch overhead in Kafka.
MAX_REASON_CHARS = 500
_DEAD_LETTER_OVERHEAD = 6 * MAX_REASON_CHARS + 1024


# Inside a pipeline's plan one long column, msg_id, identifies a record: its offset, with
# its partition in the bits above the 48 an offset may use (2.8e14 records a partition;
# 32,767 partitions). On partition 0 it is the offset itself. A key's records share a
# partition, so ordering a key's records by it orders them by offset.
PARTITION_SHIFT = 48
_OFFSET_MASK = (1 << PARTITION_SHIFT) - 1


def record_id(partition: int, offset: int) -> int:
    return (partition << PARTITION_SHIFT) | offset


def split_record_id(value: int) -> tuple[int, int]:
    """(partition, offset) of a plan's msg_id."""
    return value >> PARTITION_SHIFT, value & _OFFSET_MASK


OUT = "out"
DLQ = "dlq"
NONE = "none"


@dataclass(frozen=True)
class Output:
    """One row. Its record's identity is (partition, msg_id): msg_id is the record's offset
    in that partition of the inbound topic, and the row goes to the same partition of the
    outbound or dead-letter topic."""

    msg_id: int
    kind: str  # OUT, DLQ or NONE
    key: str | None
    value: str
    partition: int = 0

    @property
    def position(self) -> tuple[int, int]:
        """(partition, msg_id): the order rows are kept and published in."""
        return (self.partition, self.msg_id)


def range_text(partition: int, first: int, last: int) -> str:
    """msg_id first..last of a partition, for logs: `13..16` on partition 0, `2:13..2:16`
    on another (as `span` writes them)."""
    return f"{first}..{last}" if partition == 0 else f"{partition}:{first}..{partition}:{last}"


def positions_text(positions: Mapping[int, int]) -> str:
    """`1234` for partition 0 alone, `0:1234, 1:1200` for several (logs and reasons)."""
    if list(positions) == [0]:
        return str(positions[0])
    return ", ".join(f"{p}:{o}" for p, o in sorted(positions.items()))


def record_text(record: int | None) -> str:
    """A record id as logs write a msg_id: `1234` on partition 0, `2:1234` on another."""
    if record is None:
        return "none"
    partition, offset = split_record_id(record)
    return str(offset) if partition == 0 else f"{partition}:{offset}"


class Positioned(Protocol):
    """A row that names its record: an Output, or the admin API's BufferedRow."""

    @property
    def partition(self) -> int: ...

    @property
    def msg_id(self) -> int: ...


def span(rows: Sequence[Positioned]) -> str:
    """The msg_ids of rows in msg_id order, for logs: `3..7` on partition 0 alone,
    `0:3..0:7, 2:10..2:12` across partitions."""
    ranges: list[tuple[int, int, int]] = []
    for row in rows:
        if ranges and ranges[-1][0] == row.partition:
            ranges[-1] = (row.partition, ranges[-1][1], row.msg_id)
        else:
            ranges.append((row.partition, row.msg_id, row.msg_id))
    if len(ranges) == 1 and ranges[0][0] == 0:
        return f"{ranges[0][1]}..{ranges[0][2]}"
    return ", ".join(f"{p}:{first}..{p}:{last}" for p, first, last in ranges)


def covered(msg_id: int, partition: int = 0) -> Output:
    """The coverage row of a record that produced no output."""
    return Output(msg_id, NONE, None, "", partition)


def with_offsets_without_records(
    rows: Sequence[Output], starts: Mapping[int, int], ends: Mapping[int, int]
) -> list[Output]:
    """A batch's rows (in (partition, msg_id) order) and a coverage row for each offset of
    the batch's range [starts, ends) that brought no record: a transaction's commit or abort
    marker, or a record of an aborted transaction (a read_committed consumer skips them). An
    inbound topic a transactional producer writes (the publisher adapters) has such offsets
    after every transaction: covered, once, by the batch that read past them, the offsets
    stay contiguous for the gate (a hole looked like a gap to recompute, for ever) and each
    is accounted for in a published transaction. A partition whose records fill its range,
    as a plain producer's do, costs one comparison."""
    present: dict[int, set[int]] = {}
    for row in rows:
        present.setdefault(row.partition, set()).add(row.msg_id)
    missing: list[Output] = []
    for partition, end in ends.items():
        start = starts.get(partition, end)
        found = present.get(partition, set())
        if len(found) >= end - start:
            continue
        missing.extend(covered(o, partition) for o in range(start, end) if o not in found)
    if not missing:
        return list(rows)
    return sorted([*rows, *missing], key=lambda r: (r.partition, r.msg_id))


def encode(value: dict[str, Any]) -> str:
    # Fixed member order and separators: every engine emits the same bytes.
    return json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False)


def clean_reason(reason: str) -> str:
    """A reason that is valid UTF-8 (exception texts may quote lone surrogates) and short."""
    text = reason.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def dead_letter(
    msg_id: int, reason: str, raw: bytes, max_message_bytes: int, partition: int = 0
) -> Output:
    """The dead letter of one inbound record: `{"msg_id", "reason", "raw"}` with the raw
    bytes base64-encoded; when they would make it larger than `max_message_bytes`, a prefix
    of them and `"truncated": true, "raw_bytes": <full length>, "raw_sha256": <hex>`."""
    room = max(0, (max_message_bytes - _DEAD_LETTER_OVERHEAD) * 3 // 4)
    value: dict[str, Any] = {
        "msg_id": msg_id,
        "reason": clean_reason(reason),
        "raw": base64.b64encode(raw[:room]).decode("ascii"),
    }
    if len(raw) > room:
        value["truncated"] = True
        value["raw_bytes"] = len(raw)
        value["raw_sha256"] = hashlib.sha256(raw).hexdigest()
    return Output(msg_id, DLQ, None, encode(value), partition)


def fits(output: Output, max_message_bytes: int) -> bool:
    """Whether the row can be published as one Kafka message (key and value, UTF-8)."""
    try:
        size = len(output.value.encode("utf-8"))
        size += len(output.key.encode("utf-8")) if output.key is not None else 0
    except UnicodeEncodeError:
        return False
    return size <= max_message_bytes - 1024
