"""Persist and restore of one engine's state: its snapshots, its checkpoint's health, and
how a gap is recomputed. The engine (`twinstream.engine.app`) holds the lifecycle around
these (its lock, its state, stopping and starting the query); the snapshot format is
`twinstream.engine.snapshot`.

Guarantees:
- A snapshot is written only from a stopped query, so the buffer and the checkpoint in it
  agree (`write`).
- A restore replays only what Kafka still holds: a snapshot whose next offset is below the
  log start is refused by name, `cold` starts at the window's start or the log start,
  whichever is later (`prepare_restore`).
- A checkpoint the engine cannot resume from (unreadable, behind the log start, or missing
  on a pipeline that ran before) is a reason to stop, never a silent start over
  (`checkpoint_problem`).
- A gap plan starts at or before the gap's first msg_id and only from state this engine
  can replay: a batch of its own checkpoint history, else a valid snapshot whose next
  offset Kafka still holds. No plan (None) means the gap cannot be recomputed; the gate then
  reports it as uncovered instead of publishing anything out of order (`repair_plan`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import twinstream
from twinstream.core import checkpoint
from twinstream.core.rows import Output
from twinstream.engine import snapshot
from twinstream.platform import storage
from twinstream.platform.settings import CommonSettings

Plan = checkpoint.RewindPoint | snapshot.Manifest


def checkpoint_problem(
    settings: CommonSettings,
    engine_id: str,
    log_starts: Callable[[], Mapping[int, int]],
    ran_before: Callable[[], bool],
    keyed: bool = True,
) -> str | None:
    """Why the engine cannot resume from its checkpoint, or None. `ran_before()` says
    whether the pipeline published anything (asked only when there is no checkpoint);
    `keyed`: whether the pipeline keeps keyed state (the checkpoint must then hold it)."""
    ckpt = settings.checkpoint_dir(engine_id)
    topic = settings.inbound_topic
    if ckpt.exists():
        problem = snapshot.checkpoint_problem(ckpt, topic, keyed)
        if problem is not None:
            return f"the checkpoint is unusable: {problem}"
        position = snapshot.checkpoint_position(ckpt, topic)
        starts = log_starts()
        for partition, offset in sorted((position.next_offsets if position else {}).items()):
            if offset < starts.get(partition, 0):
                return (
                    f"the checkpoint continues at inbound offset {offset} of partition "
                    f"{partition}, but Kafka's log of {topic} starts at "
                    f"{starts[partition]} there (retention deleted the rest)"
                )
        return None
    if snapshot.snapshot_ids(settings.snapshot_dir) or ran_before():
        return (
            f"no checkpoint at {ckpt}, but pipeline {settings.pipeline} has "
            "run before (a new or wiped disk)"
        )
    return None


def write(
    settings: CommonSettings,
    engine_id: str,
    state_layout: str,
    buffer: list[Output],
    agreement: str = "unchecked",
    agreed_through: Mapping[int, int] | None = None,
    version: str = "",
) -> snapshot.Manifest:
    """Snapshot the engine's (stopped) checkpoint and its buffer, with its agreement with
    the active then (a snapshot proves good only from an engine that agreed) and the
    version of the code that computed its state (twinstream.platform.versions; the
    framework's own version for an engine that does not know it)."""
    return snapshot.write_snapshot(
        settings.snapshot_dir,
        pipeline=settings.pipeline,
        engine_id=engine_id,
        pipeline_version=version or twinstream.__version__,
        checkpoint=settings.checkpoint_dir(engine_id),
        topic=settings.inbound_topic,
        buffer=buffer,
        state_layout=state_layout,
        agreement=agreement,
        agreed_through=agreed_through,
    )


@dataclass(frozen=True)
class Restoring:
    """A restore made ready: the checkpoint is in place (or removed, for `cold`)."""

    source: str  # the snapshot's id, or "cold"
    next_offsets: dict[int, int]  # where the query continues, per partition
    starting: dict[int, int] | None  # the query's starting offsets (cold only)
    buffer: list[Output]  # the buffer to restore into the gate


def prepare_restore(
    settings: CommonSettings,
    engine_id: str,
    state_layout: str,
    requested: str,
    log_starts: Mapping[int, int],
    offsets_at: Callable[[int], Mapping[int, int]],
    version: str = "",
) -> Restoring:
    """Put snapshot `requested` (an id, `latest`) in place of the checkpoint, or remove the
    checkpoint for `cold` (a rebuild from the window's start: `offsets_at(ms)`). Only a
    snapshot of the engine's own `version` (snapshot.other_code)."""
    ckpt = settings.checkpoint_dir(engine_id)
    if requested == "cold":
        start_ms = int(time.time() * 1000) - settings.window_retention_ms
        at = offsets_at(start_ms)
        starting = {p: max(low, at.get(p, low)) for p, low in log_starts.items()}
        storage.remove_tree(ckpt)
        return Restoring("cold", dict(starting), starting, [])
    manifest = snapshot.choose(
        settings.snapshot_dir, settings.pipeline, requested, state_layout, version
    )
    next_offsets = manifest.positions()
    for partition, offset in sorted(next_offsets.items()):
        if offset < log_starts.get(partition, 0):
            raise snapshot.SnapshotError(
                f"snapshot {manifest.snapshot_id} continues at inbound offset "
                f"{offset} of partition {partition}, but Kafka's log of "
                f"{settings.inbound_topic} starts at {log_starts[partition]} there: "
                "retention has deleted what it would replay; choose a newer snapshot or "
                'restore "cold"'
            )
    buffer = snapshot.install(settings.snapshot_dir, manifest, ckpt)
    return Restoring(manifest.snapshot_id, next_offsets, None, buffer)


def repair_plan(
    settings: CommonSettings,
    engine_id: str,
    partition: int,
    first: int,
    log_starts: Callable[[], Mapping[int, int]],
    version: str = "",
) -> Plan | None:
    """The newest batch of the engine's checkpoint history that ends at or before `first`
    in `partition`, else the newest valid snapshot that continues at or before it there and,
    in every partition, after Kafka's log start (`log_starts()`; when Kafka does not
    answer, no snapshot is trusted), taken by an engine of `version` (snapshot.other_code)."""
    ckpt = settings.checkpoint_dir(engine_id)
    point = checkpoint.rewind_point(ckpt, settings.inbound_topic, partition, first)
    if point is not None:
        return point
    try:
        starts = dict(log_starts())
    except Exception:
        return None  # unknown: no snapshot can be trusted to replay

    def usable(manifest: snapshot.Manifest) -> bool:
        positions = manifest.positions()
        return (
            positions.get(partition, 0) <= first
            and all(starts.get(p, 0) <= offset for p, offset in positions.items())
            and snapshot.other_code(manifest, version) is None
        )

    candidates = [
        s.manifest
        for s in snapshot.list_snapshots(settings.snapshot_dir, settings.pipeline)
        if s.valid and s.manifest is not None and usable(s.manifest)
    ]
    return max(candidates, key=lambda m: m.positions().get(partition, 0), default=None)


def rewind(settings: CommonSettings, engine_id: str, chosen: Plan) -> tuple[str, dict[int, int]]:
    """Rewind the (stopped) query's checkpoint to the plan; returns what it came from and
    the msg_id of each partition the query continues at."""
    ckpt = settings.checkpoint_dir(engine_id)
    if isinstance(chosen, checkpoint.RewindPoint):
        checkpoint.rewind(ckpt, chosen)
        return f"its checkpoint's batch {chosen.batch_id}", chosen.next_offsets
    snapshot.install(settings.snapshot_dir, chosen, ckpt)
    return f"snapshot {chosen.snapshot_id}", chosen.positions()
