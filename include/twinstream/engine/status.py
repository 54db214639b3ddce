"""How an engine reports itself: the gate's status, its standing and its quarantine as the
admin API's `PipelineInfo` (GET /pipeline, the operator page, `twinstream status`). A pure
mapping: what the engine is, it decides (twinstream.engine.app); this only says it."""

from __future__ import annotations

from datetime import UTC, datetime

from twinstream.core.election import Standing
from twinstream.core.gate import GateStatus
from twinstream.core.rows import split_record_id
from twinstream.engine.api import (
    LagTrend,
    PipelineInfo,
    QuarantinedOffset,
    RepairInfo,
    TakeoverInfo,
    UncoveredRange,
)


def pipeline_info(
    state: str,
    reason: str,
    status: GateStatus,
    standing: Standing,
    trend: LagTrend | None,
    quarantined: dict[int, str],
    events_per_s: float | None,
    restored_from: str | None,
) -> PipelineInfo:
    """The engine's pipeline as GET /pipeline answers it; `quarantined` maps record ids
    (twinstream.core.rows.record_id) to reasons."""
    return PipelineInfo(
        state=state,
        reason=reason,
        last_msg_id_processed=status.last_msg_id_processed,
        last_msg_id_published=status.last_msg_id_published,
        lag=standing.lag,
        buffer_fill=status.buffer_fill,
        buffer_size=status.buffer_size,
        buffer_fills=status.buffer_fills,
        lag_trend=trend,
        in_sync=standing.in_sync,
        uncovered_ranges=[
            UncoveredRange(partition=u.partition, first=u.first, last=u.last)
            for u in status.uncovered_ranges
        ],
        unpublished=status.unpublished,
        paused=status.paused,
        quarantined=[
            QuarantinedOffset(msg_id=offset, reason=r, partition=partition)
            for (partition, offset), r in sorted(
                (split_record_id(o), r) for o, r in quarantined.items()
            )
        ],
        repairs=[
            RepairInfo(first=r.first, last=r.last, seconds=r.seconds, partition=r.partition)
            for r in status.repairs
        ],
        events_per_s=events_per_s,
        restored_from=restored_from,
        processed=status.processed,
        published=status.published,
        takeovers=[
            TakeoverInfo(
                epoch=t.epoch,
                at=datetime.fromtimestamp(t.at, UTC).isoformat(timespec="milliseconds"),
                fence_and_read_s=round(t.fence_and_read_s, 3),
                first_commit_s=None if t.first_commit_s is None else round(t.first_commit_s, 3),
            )
            for t in status.takeovers
        ],
    )
