"""Reading and rewinding a Spark Structured Streaming checkpoint of a query on a Kafka
topic: `offsets/N` (batch N planned, with the next offset after it in each partition),
`commits/N` (batch N done), `sources/0/0` (where the query started), each with a `.N.crc`
beside it. Positions are partition -> offset.

Guarantee: the functions that change a checkpoint only remove the log entries of batches
after a point, so Spark plans those batches afresh on the next start, from the state
version that point left (Spark keeps `spark.sql.streaming.minBatchesToRetain` of them), or
narrow the last batch if it was never committed (Spark runs it again with the offsets its
entry names, from the state of the batch before); they are only called on a stopped query.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from twinstream.platform.storage import Location, rename


def numbered(folder: Location) -> list[int]:
    """The batch ids that have a file in `folder`, in order."""
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def end_offsets(path: Location, topic: str) -> dict[int, int] | None:
    """Each partition's offset of `topic` in one of Spark's offset files (`offsets/N`: a
    version line, batch metadata, a JSON line per source; `sources/0/0`: a version line,
    then the source's JSON)."""
    for line in path.read_text().splitlines()[1:]:
        with contextlib.suppress(ValueError):
            offsets = json.loads(line)
            if isinstance(offsets, dict) and topic in offsets:
                return {int(p): int(o) for p, o in offsets[topic].items()}
    return None


def batch_end(checkpoint: Location, batch_id: int, topic: str) -> dict[int, int] | None:
    """The next inbound offset of each partition after batch `batch_id`."""
    path = checkpoint / "offsets" / str(batch_id)
    return end_offsets(path, topic) if path.exists() else None


def batch_start(checkpoint: Location, batch_id: int, topic: str) -> dict[int, int] | None:
    """The first inbound offset of each partition in batch `batch_id`: where the batch
    before it ended, or, for a query's first batch, where the query started
    (`sources/0/0`, the offsets Spark resolved its starting offsets to)."""
    if batch_id > 0:
        before = batch_end(checkpoint, batch_id - 1, topic)
        if before is not None:
            return before
    path = checkpoint / "sources" / "0" / "0"
    return end_offsets(path, topic) if path.exists() else None


def resume_point(checkpoint: Location, topic: str) -> dict[int, int] | None:
    """Where a query started on `checkpoint` takes its first record of each partition: after
    its last committed batch (a planned batch without its commit is run again from there),
    or where it started (`sources/0/0`) before any commit; None while Spark has written
    neither."""
    committed = numbered(checkpoint / "commits")
    if committed:
        return batch_end(checkpoint, committed[-1], topic)
    path = checkpoint / "sources" / "0" / "0"
    return end_offsets(path, topic) if path.exists() else None


def unread(checkpoint: Location, topic: str, high_watermarks: Mapping[int, int]) -> int:
    """Inbound records a query restarted on `checkpoint` reads before it is level with
    `high_watermarks`: from the end of its last planned batch (Spark replays a planned
    batch that was not committed, so its records count as read), every partition whole
    without one."""
    batches = numbered(checkpoint / "offsets")
    position = (batch_end(checkpoint, batches[-1], topic) if batches else None) or {}
    return sum(max(0, hwm - position.get(p, 0)) for p, hwm in high_watermarks.items())


def forget_batches(checkpoint: Location, after: int, logs: tuple[str, ...] = ("offsets",)) -> None:
    """Remove the entries of every batch after `after` from the named logs."""
    for log in logs:
        folder = checkpoint / log
        for batch in numbered(folder):
            if batch > after:
                for name in (str(batch), f".{batch}.crc"):
                    (folder / name).unlink(missing_ok=True)


def narrow_batch(checkpoint: Location, batch_id: int, topic: str, ends: Mapping[int, int]) -> None:
    """Make the uncommitted batch `batch_id` end at `ends` (an offset for each partition the
    batch names): its entry is rewritten with them for every source reading `topic`, the
    rest of it (batch metadata, other sources) kept, and its checksum file removed, since
    Hadoop's local file system checks a file against one if present and reads it unchecked
    if not."""
    if batch_id in numbered(checkpoint / "commits"):
        raise ValueError(f"batch {batch_id} is committed; only an uncommitted one is narrowed")
    path = checkpoint / "offsets" / str(batch_id)
    lines = path.read_text().splitlines()
    narrowed = 0
    # Every source that reads the topic: a plan that reads it in two branches (the
    # transform's and the dead letters') has a line for each, and Spark runs both.
    for i, line in enumerate(lines[1:], start=1):
        try:
            offsets = json.loads(line)
        except ValueError:
            continue
        if isinstance(offsets, dict) and topic in offsets:
            named = sorted(int(p) for p in offsets[topic])
            if named != sorted(ends):
                raise ValueError(
                    f"batch {batch_id} reads partitions {named} of {topic}, not {sorted(ends)}"
                )
            offsets[topic] = {str(p): int(o) for p, o in sorted(ends.items())}
            lines[i] = json.dumps(offsets, separators=(",", ":"))
            narrowed += 1
    if not narrowed:
        raise ValueError(f"batch {batch_id} does not read {topic}")
    (checkpoint / "offsets" / f".{batch_id}.crc").unlink(missing_ok=True)
    written = path.with_name(f".{batch_id}.narrowing")
    written.write_text("\n".join(lines))
    # Atomic on a local disk and HDFS: a crash leaves the old entry or the new one. (An
    # object store's rename is a copy: its file is whole either way; the temporary name is
    # not a batch id, so Spark ignores a leftover.)
    rename(written, path)


@dataclass(frozen=True)
class RewindPoint:
    """A committed batch to rewind to, and the inbound offset of each partition the query
    continues at."""

    batch_id: int
    next_offsets: dict[int, int] = field(default_factory=dict)


def rewind_point(
    checkpoint: Location, topic: str, partition: int, first: int
) -> RewindPoint | None:
    """The newest committed batch that ends at or before inbound offset `first` of
    `partition`, among those whose state Spark still keeps (not the oldest retained entry,
    whose state version may be purged first); None if the history does not reach back that
    far. (The other partitions replay from that batch too: the gate drops what they
    published already.)"""
    committed = set(numbered(checkpoint / "commits"))
    planned = [b for b in numbered(checkpoint / "offsets") if b in committed]
    for batch in reversed(planned[1:]):
        ends = batch_end(checkpoint, batch, topic)
        if ends is not None and ends.get(partition, 0) <= first:
            return RewindPoint(batch, ends)
    return None


def rewind(checkpoint: Location, point: RewindPoint) -> None:
    """Make the query continue after `point` on its next start: later batches are planned
    and computed again from the state `point` left."""
    forget_batches(checkpoint, point.batch_id, logs=("commits", "offsets"))
