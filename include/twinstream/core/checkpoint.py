"""Reading and rewinding a Spark Structured Streaming checkpoint of a query on one Kafka
partition: `offsets/N` (batch N planned, with the next offset after it), `commits/N` (batch N
done), `sources/0/0` (where the query started), each with a `.N.crc` beside it.

Guarantee: the functions that change a checkpoint only remove the log entries of batches
after a point, so Spark plans those batches afresh on the next start, from the state
version that point left (Spark keeps `spark.sql.streaming.minBatchesToRetain` of them);
they are only called on a stopped query.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path


def numbered(folder: Path) -> list[int]:
    """The batch ids that have a file in `folder`, in order."""
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def end_offset(path: Path, topic: str) -> int | None:
    """Partition 0's offset of `topic` in one of Spark's offset files (`offsets/N`: a
    version line, batch metadata, a JSON line per source; `sources/0/0`: a version line,
    then the source's JSON)."""
    for line in path.read_text().splitlines()[1:]:
        with contextlib.suppress(ValueError):
            offsets = json.loads(line)
            if isinstance(offsets, dict) and topic in offsets:
                return int(offsets[topic]["0"])
    return None


def batch_end(checkpoint: Path, batch_id: int, topic: str) -> int | None:
    """The next inbound offset after batch `batch_id`."""
    path = checkpoint / "offsets" / str(batch_id)
    return end_offset(path, topic) if path.exists() else None


def unread(checkpoint: Path, topic: str, high_watermark: int) -> int:
    """Inbound records a query restarted on `checkpoint` reads before it is level with
    `high_watermark`: from the end of its last planned batch (Spark replays a planned batch
    that was not committed, so its records count as read), the whole topic without one."""
    batches = numbered(checkpoint / "offsets")
    position = batch_end(checkpoint, batches[-1], topic) if batches else None
    return max(0, high_watermark - (position or 0))


def forget_batches(checkpoint: Path, after: int, logs: tuple[str, ...] = ("offsets",)) -> None:
    """Remove the entries of every batch after `after` from the named logs."""
    for log in logs:
        folder = checkpoint / log
        for batch in numbered(folder):
            if batch > after:
                for name in (str(batch), f".{batch}.crc"):
                    (folder / name).unlink(missing_ok=True)


@dataclass(frozen=True)
class RewindPoint:
    """A committed batch to rewind to, and the inbound offset the query continues at."""

    batch_id: int
    next_offset: int


def rewind_point(checkpoint: Path, topic: str, first: int) -> RewindPoint | None:
    """The newest committed batch that ends at or before inbound offset `first`, among
    those whose state Spark still keeps (not the oldest retained entry, whose state
    version may be purged first); None if the history does not reach back that far."""
    committed = set(numbered(checkpoint / "commits"))
    planned = [b for b in numbered(checkpoint / "offsets") if b in committed]
    for batch in reversed(planned[1:]):
        end = batch_end(checkpoint, batch, topic)
        if end is not None and end <= first:
            return RewindPoint(batch, end)
    return None


def rewind(checkpoint: Path, point: RewindPoint) -> None:
    """Make the query continue after `point` on its next start: later batches are planned
    and computed again from the state `point` left."""
    forget_batches(checkpoint, point.batch_id, logs=("commits", "offsets"))
