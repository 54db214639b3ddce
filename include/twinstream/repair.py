"""How an engine recomputes a gap: msg_ids that no buffer held at a takeover.

Guarantee: a plan starts at or before the gap's first msg_id and only from state this
engine can replay: a batch of its own checkpoint history, else a valid snapshot whose next
offset Kafka still holds. No plan (None) means the gap cannot be recomputed; the gate then
reports it as uncovered instead of publishing anything out of order.
"""

from __future__ import annotations

from collections.abc import Callable

from twinstream import snapshot
from twinstream.config import Settings
from twinstream.core import checkpoint

Plan = checkpoint.RewindPoint | snapshot.Manifest


def plan(
    settings: Settings, engine_id: str, first: int, log_start: Callable[[], int]
) -> Plan | None:
    """The newest batch of the engine's checkpoint history that ends at or before `first`,
    else the newest valid snapshot that continues at or before it and after Kafka's log
    start (`log_start()`; when Kafka does not answer, no snapshot is trusted)."""
    ckpt = settings.checkpoint_dir(engine_id)
    point = checkpoint.rewind_point(ckpt, settings.inbound_topic, first)
    if point is not None:
        return point
    try:
        start = log_start()
    except Exception:
        start = first + 1  # unknown: no snapshot can be trusted to replay
    usable = [
        s.manifest
        for s in snapshot.list_snapshots(settings.snapshot_dir, settings.pipeline)
        if s.valid and s.manifest is not None and start <= s.manifest.next_offset <= first
    ]
    return max(usable, key=lambda m: m.next_offset, default=None)


def apply(settings: Settings, engine_id: str, chosen: Plan) -> tuple[str, int]:
    """Rewind the (stopped) query's checkpoint to the plan; returns what it came from and
    the msg_id the query continues at."""
    ckpt = settings.checkpoint_dir(engine_id)
    if isinstance(chosen, checkpoint.RewindPoint):
        checkpoint.rewind(ckpt, chosen)
        return f"its checkpoint's batch {chosen.batch_id}", chosen.next_offset
    snapshot.install(settings.snapshot_dir, chosen, ckpt)
    return f"snapshot {chosen.snapshot_id}", chosen.next_offset
