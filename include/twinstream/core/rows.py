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
from dataclasses import dataclass
from typing import Any

# Room in a dead letter for everything but the raw bytes: msg_id, the reason (capped at
# MAX_REASON_CHARS, each character up to 6 bytes once JSON-escaped), the length and hash,
# field names, and the record's headers and batch overhead in Kafka.
MAX_REASON_CHARS = 500
_DEAD_LETTER_OVERHEAD = 6 * MAX_REASON_CHARS + 1024


OUT = "out"
DLQ = "dlq"
NONE = "none"


@dataclass(frozen=True)
class Output:
    msg_id: int
    kind: str  # OUT, DLQ or NONE
    key: str | None
    value: str


def covered(msg_id: int) -> Output:
    """The coverage row of a record that produced no output."""
    return Output(msg_id, NONE, None, "")


def encode(value: dict[str, Any]) -> str:
    # Fixed member order and separators: every engine emits the same bytes.
    return json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False)


def clean_reason(reason: str) -> str:
    """A reason that is valid UTF-8 (exception texts may quote lone surrogates) and short."""
    text = reason.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def dead_letter(msg_id: int, reason: str, raw: bytes, max_message_bytes: int) -> Output:
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
    return Output(msg_id, "dlq", None, encode(value))


def fits(output: Output, max_message_bytes: int) -> bool:
    """Whether the row can be published as one Kafka message (key and value, UTF-8)."""
    try:
        size = len(output.value.encode("utf-8"))
        size += len(output.key.encode("utf-8")) if output.key is not None else 0
    except UnicodeEncodeError:
        return False
    return size <= max_message_bytes - 1024
