"""How an engine recomputes a gap: msg_ids that no buffer held at a takeover.

Guarantee: a plan starts at or before the gap's first msg_id and only from state this
engine can replay: a batch of its own checkpoint history, else a valid snapshot whose next
offset Kafka still holds. No plan (None) means the gap cannot be recomputed; the gate then
reports it as uncovered instead of publishing anything out of order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from twinstream.core import checkpoint
from twinstream.engine import snapshot
from twinstream.platform.settings import Settings

Plan = checkpoint.RewindPoint | snapshot.Manifest


def plan(
    settings: Settings,
    engine_id: str,
    partition: int,
    first: int,
    log_starts: Callable[[], Mapping[int, int]],
) -> Plan | None:
    """The newest batch of the engine's checkpoint history that ends at or before `first`
    in `partition`, else the newest valid snapshot that continues at or before it there and,
    in every partition, after Kafka's log start (`log_starts()`; when Kafka does not
    answer, no snapshot is trusted)."""
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
        return positions.get(partition, 0) <= first and all(
            starts.get(p, 0) <= offset for p, offset in positions.items()
        )

    candidates = [
        s.manifest
        for s in snapshot.list_snapshots(settings.snapshot_dir, settings.pipeline)
        if s.valid and s.manifest is not None and usable(s.manifest)
    ]
    return max(candidates, key=lambda m: m.positions().get(partition, 0), default=None)


def apply(settings: Settings, engine_id: str, chosen: Plan) -> tuple[str, dict[int, int]]:
    """Rewind the (stopped) query's checkpoint to the plan; returns what it came from and
    the msg_id of each partition the query continues at."""
    ckpt = settings.checkpoint_dir(engine_id)
    if isinstance(chosen, checkpoint.RewindPoint):
        checkpoint.rewind(ckpt, chosen)
        return f"its checkpoint's batch {chosen.batch_id}", chosen.next_offsets
    snapshot.install(settings.snapshot_dir, chosen, ckpt)
    return f"snapshot {chosen.snapshot_id}", chosen.positions()
