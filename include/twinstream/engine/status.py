"""How an engine reports itself: the gate's status, its standing and its quarantine as the
admin API's `PipelineInfo` (GET /pipeline, the operator page, `twinstream status`). A pure
mapping: what the engine is, it decides (twinstream.engine.app); this only says it."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from twinstream.core.agreement import AgreementStatus
from twinstream.core.agreement import Difference as CoreDifference
from twinstream.core.election import Standing
from twinstream.core.gate import GateStatus
from twinstream.core.rows import Output, split_record_id
from twinstream.engine.api import (
    AgreementInfo,
    BufferedRow,
    Difference,
    LagTrend,
    PipelineInfo,
    QuarantinedOffset,
    RepairInfo,
    ShadowInfo,
    StandbyCover,
    TakeoverInfo,
    UncoveredRange,
)
from twinstream.engine.readiness import Cover


def pipeline_info(
    state: str,
    reason: str,
    status: GateStatus,
    standing: Standing,
    trend: LagTrend | None,
    quarantined: dict[int, str],
    events_per_s: float | None,
    restored_from: str | None,
    agreement: AgreementStatus | None = None,
    lag_s: float | None = None,
    cover: Cover | None = None,
    now: float | None = None,
    read_up_to: dict[int, int] | None = None,
    from_spare: bool = False,
) -> PipelineInfo:
    """The engine's pipeline as GET /pipeline answers it; `quarantined` maps record ids
    (twinstream.core.rows.record_id) to reasons; `from_spare`: the engine's process was a
    warm spare (its takeovers say so)."""
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
        read_up_to=read_up_to or {},
        takeovers=[
            TakeoverInfo(
                epoch=t.epoch,
                at=datetime.fromtimestamp(t.at, UTC).isoformat(timespec="milliseconds"),
                fence_and_read_s=round(t.fence_and_read_s, 3),
                first_commit_s=None if t.first_commit_s is None else round(t.first_commit_s, 3),
                from_spare=from_spare,
            )
            for t in status.takeovers
        ],
        agreement=AgreementInfo() if agreement is None else agreement_info(agreement),
        lag_s=lag_s,
        standbys=None
        if cover is None
        else standby_cover(cover, time.time() if now is None else now),
    )


def standby_cover(cover: Cover, now: float) -> StandbyCover:
    """The active's view of its standbys as GET /pipeline says it."""
    since = cover.since
    return StandbyCover(
        ready=list(cover.ready),
        not_ready=dict(cover.not_ready),
        unprotected_since=None
        if since is None
        else datetime.fromtimestamp(since, UTC).isoformat(timespec="seconds"),
        unprotected_s=cover.unprotected_s(now),
    )


def agreement_info(status: AgreementStatus) -> AgreementInfo:
    """The agreement check's status as GET /pipeline says it."""
    found, shadow = status.difference, status.shadow
    return AgreementInfo(
        state=status.state,
        checked=status.checked,
        ranges_agreed=status.ranges_agreed,
        ranges_unchecked=status.ranges_unchecked,
        overridden=status.overridden,
        difference=None if found is None else difference_info(found),
        shadow=None
        if shadow is None
        else ShadowInfo(
            active_version=shadow.active_version,
            version=shadow.version,
            ranges_compared=shadow.ranges_compared,
            ranges_differing=shadow.ranges_differing,
            rows_compared=shadow.rows_compared,
            ranges_read_back=shadow.ranges_read_back,
            msg_ids_differing=shadow.msg_ids_differing,
            examples=[difference_info(d) for d in shadow.examples],
        ),
    )


def difference_info(found: CoreDifference) -> Difference:
    """A difference as the admin API says it: where, and both sides' rows."""

    def rows(outputs: list[Output]) -> list[BufferedRow]:
        return [
            BufferedRow(
                msg_id=o.msg_id, kind=o.kind, key=o.key, value=o.value, partition=o.partition
            )
            for o in outputs
        ]

    return Difference(
        partition=found.range_.partition,
        msg_id=found.msg_id,
        first=found.range_.first,
        last=found.range_.last,
        epoch=found.range_.epoch,
        active_rows=rows(found.active_rows),
        engine_rows=rows(found.engine_rows),
        found_at=datetime.fromtimestamp(found.found_at, UTC).isoformat(timespec="seconds"),
    )
