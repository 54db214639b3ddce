"""The failover drill as plain functions: the game-day check operators run before they
trust a deployment. The `failover_drill` DAG wires them; unit tests drive them with fake
engines and a fake clock.

Guarantee checked: stopping the active through its admin API hands the output to an
in-sync standby within seconds, and the msg_ids around the handover are each published
exactly once. The drill refuses to start unless a standby is in sync, so it never causes
the outage it is meant to rehearse.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from twinstream.core.rows import positions_text, range_text
from twinstream.engine.api import EngineApi, PipelineInfo
from twinstream.engine.client import EngineError
from twinstream.ops.audit import Findings, format_ranges, window
from twinstream.ops.operate import OperateError
from twinstream.ops.overview import EngineView
from twinstream.platform.settings import TaskSettings

log = logging.getLogger(__name__)

# msg_ids audited before the last one published when the active was stopped: the tail of
# the old epoch, where a takeover would leave a gap or repeat outputs.
AUDIT_BEFORE = 1000


def plan(views: Iterable[EngineView], leader: str | None) -> dict[str, Any]:
    """Who is stopped and who must take over; refused unless exactly one engine is active
    (and ZooKeeper agrees) and at least one standby is in sync."""
    views = list(views)
    seen = "; ".join(v.describe() for v in views)
    actives = [v for v in views if v.problem is None and v.role == "active"]
    if len(actives) != 1 or actives[0].state != "running" or actives[0].zk_state != "CONNECTED":
        raise OperateError(
            f"the drill needs exactly one running active with a live session: {seen}"
        )
    active = actives[0]
    if leader is not None and leader != active.engine_id:
        raise OperateError(
            f"ZooKeeper names {leader} the leader, but {active.engine_id} says it is active "
            f"(a takeover is under way?); rerun when they agree: {seen}"
        )
    # A disagreeing standby takes no part in the election: it could not take over.
    standbys = [
        v.engine_id
        for v in views
        if v.problem is None
        and v.role == "standby"
        and v.state == "running"
        and v.in_sync
        and not v.disagrees
    ]
    if not standbys:
        raise OperateError(
            f"no in-sync standby that may take over (one whose rows disagree with the "
            f"published ones takes no part in the election): stopping the active now would "
            f"stop the output. Restore one (restore_and_resync) first: {seen}"
        )
    log.info("drill: will stop active %s; in-sync standbys %s", active.engine_id, standbys)
    return {"active": active.engine_id, "standbys": standbys}


class EpochTail(Protocol):
    """The outbound topic as a read_committed subscriber sees it: the highest election
    epoch among the records that arrived in the last `poll`."""

    def poll(self, timeout_s: float) -> int | None: ...


@dataclass
class Takeover:
    stopped: str
    old_epoch: int
    last_published_before: int | None
    new_active: str | None = None
    new_epoch: int | None = None
    # From the stop request to: a standby reporting itself active with a live session;
    # the first record of the new epoch visible to a read_committed subscriber.
    role_s: float | None = None
    first_output_s: float | None = None
    # Each inbound partition's last published msg_id before the stop (several partitions:
    # `last_published_before` is None there, as the engines report it).
    published_before: dict[int, int] = field(default_factory=dict)

    @classmethod
    def of(cls, engine_id: str, epoch: int, info: PipelineInfo) -> Takeover:
        """A takeover about to be inflicted on the active `engine_id`, as it reports itself."""
        return cls(
            engine_id, epoch, info.last_msg_id_published, published_before=dict(info.published)
        )

    def before(self) -> dict[int, int]:
        return positions_before(asdict(self))

    def describe(self) -> str:
        def secs(value: float | None) -> str:
            return "not seen" if value is None else f"{value:.3f} s"

        return (
            f"stopped {self.stopped} (epoch {self.old_epoch}, last published msg_id "
            f"{positions_text(self.before()) or None}); {self.new_active} active in "
            f"{secs(self.role_s)} "
            f"(epoch {self.new_epoch}), first output of the new epoch {secs(self.first_output_s)}"
        )


def stop_and_measure(
    active: EngineApi,
    standbys: Mapping[str, EngineApi],
    tail: EpochTail,
    timeout_s: float = 60.0,
    clock: Callable[[], float] = time.monotonic,
) -> Takeover:
    """Stop the active's pipeline and time the takeover. If no standby takes over within
    `timeout_s`, the stopped engine is started again (the pipeline must not stay without
    an active because of a drill) and the drill fails."""
    server = active.server()
    if server.role != "active" or server.zk_state != "CONNECTED":
        raise OperateError(
            f"engine {active.engine_id} is no longer the active ({server.role}, ZooKeeper "
            f"{server.zk_state}): the plan is stale; trigger a new drill"
        )
    result = Takeover.of(active.engine_id, server.epoch, active.pipeline())
    started = clock()
    active.stop()
    log.info("drill: stop of %s acknowledged after %.3f s", active.engine_id, clock() - started)
    measure_takeover(result, standbys, tail, started, timeout_s, clock)
    if result.role_s is None:
        log.error("drill: no takeover; starting %s again", active.engine_id)
        active.start()
        raise OperateError(
            f"no standby of {sorted(standbys)} became active within {timeout_s:.0f} s of "
            f"stopping {active.engine_id}; {active.engine_id} was started again. Look at the "
            "standbys' logs before trusting this deployment"
        )
    return result


def measure_takeover(
    result: Takeover,
    standbys: Mapping[str, EngineApi],
    tail: EpochTail,
    started: float,
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> Takeover:
    """Fill in who took over and when, watching the standbys' admin APIs and the outbound
    topic from `started` (the moment the active was stopped or killed). Waits for the first
    output of the new epoch until `timeout_s`: with no input arriving there is none, which
    is left as None, not failed."""
    next_role_check = 0.0
    # Polled every 0.1 s: a standby that is down for the whole measurement (a benchmark's
    # baseline stops it) would print hundreds of identical warnings, so each is said once
    # per outage.
    unreachable: set[str] = set()
    while clock() - started < timeout_s:
        epoch = tail.poll(0.1)
        if result.first_output_s is None and epoch is not None and epoch > result.old_epoch:
            result.first_output_s = clock() - started
        if result.role_s is None and clock() >= next_role_check:
            next_role_check = clock() + 0.1
            for engine_id, engine in standbys.items():
                try:
                    seen = engine.server()
                except EngineError as exc:
                    if engine_id not in unreachable:
                        unreachable.add(engine_id)
                        log.warning("drill: engine %s: %s (still polled)", engine_id, exc)
                    continue
                if engine_id in unreachable:
                    unreachable.discard(engine_id)
                    log.info("drill: engine %s answers again", engine_id)
                if seen.role == "active" and seen.zk_state == "CONNECTED":
                    result.role_s = clock() - started
                    result.new_active, result.new_epoch = engine_id, seen.epoch
                    break
        if result.role_s is not None and result.first_output_s is not None:
            break
    log.info("takeover: %s", result.describe())
    return result


def audit_window(
    records: Iterable[tuple[str, int | None, str]], first: int, end: int, partition: int = 0
) -> dict[str, Any]:
    """Exactly-once over msg_ids first..end-1 of the committed (kind, msg_id, value)
    records read from one partition; the same check as the scheduled audit, on the
    handover's window only."""
    findings: Findings = window(records, first, end)
    report = {
        "partition": partition,
        "first_msg_id": first,
        "end_msg_id": end,
        "records": findings.rows,
        "missing": findings.missing,
        "duplicated": findings.duplicated,
        "mismatched": findings.mismatched,
        "ok": findings.ok,
    }
    if not findings.ok:
        raise OperateError(
            f"the handover's window msg_id {range_text(partition, first, end - 1)} is not "
            "exactly once: missing "
            f"{format_ranges(findings.missing)}; duplicated {format_ranges(findings.duplicated)}"
            f"; outputs not as their progress record says {format_ranges(findings.mismatched)}"
        )
    log.info("drill: msg_id %s each published exactly once", range_text(partition, first, end - 1))
    return report


def window_bounds(takeover: Mapping[str, Any], last_published_now: int | None) -> tuple[int, int]:
    """The msg_ids to audit in a partition: from AUDIT_BEFORE before the handover to what the
    new active has published since. Refused while the new active has not passed the
    handover point."""
    before = takeover["last_published_before"]
    if before is None:
        raise OperateError("nothing had been published before the drill: nothing to audit")
    if last_published_now is None or last_published_now <= before:
        raise OperateError(
            f"the new active has published nothing after msg_id {before} yet; the handover "
            "cannot be audited without input after it (is the inbound topic receiving?)"
        )
    return max(0, before - AUDIT_BEFORE + 1), last_published_now + 1


def positions_before(takeover: Mapping[str, Any]) -> dict[int, int]:
    """Each partition's last published msg_id before the stop, from a Takeover as a dict
    (through an XCom the partition keys are strings)."""
    per_partition = takeover.get("published_before") or {}
    if per_partition:
        return {int(p): int(o) for p, o in per_partition.items()}
    alone = takeover.get("last_published_before")
    return {} if alone is None else {0: int(alone)}


def audit_handover(
    settings: TaskSettings,
    new_active: EngineApi,
    takeover: Mapping[str, Any],
    timeout_s: float = 120.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Wait (with a progress line) until the new active has published past the handover in
    every partition, then audit the window around it in each, on the committed outbound
    and dead-letter topics. A partition that got no input after the handover by
    `timeout_s` is named in the report, not audited; none at all fails the audit."""
    from twinstream.ops.operate import committed_since

    deadline = clock() + timeout_s
    before = positions_before(takeover)
    while True:
        now = new_active.pipeline().published_positions()
        behind = [p for p in before if now.get(p, -1) <= before[p]]
        if (before and not behind) or clock() >= deadline:
            break  # window_bounds below names what is missing
        log.info(
            "drill: waiting for %s to publish past msg_id %s (at %s)",
            new_active.engine_id,
            positions_text(before) or None,
            positions_text(now) or None,
        )
        sleep(2.0)
    if not before:
        window_bounds({"last_published_before": None}, None)  # raises: nothing to audit
    moved = [p for p in sorted(before) if now.get(p, -1) > before[p]] or sorted(before)[:1]
    reports = {}
    for p in moved:
        first, end = window_bounds({"last_published_before": before[p]}, now.get(p))
        records = committed_since(settings, first, partition=p)
        reports[p] = audit_window(((k, r.msg_id, r.value) for k, r in records), first, end, p)
    if list(reports) == [0] and list(before) == [0]:
        return reports[0]
    lowest = reports[moved[0]]
    return {
        **lowest,
        "records": sum(r["records"] for r in reports.values()),
        "partitions": {str(p): r for p, r in reports.items()},
        "not_audited": sorted(set(before) - set(reports)),
    }


def figures(takeover: Mapping[str, Any], audit: Mapping[str, Any], rejoined: str) -> str:
    """The run's summary line for the log: what operators compare across drills."""
    t = Takeover(**takeover)
    windows = audit.get("partitions") or {"0": audit}
    audited = ", ".join(
        range_text(int(p), int(w["first_msg_id"]), int(w["end_msg_id"]) - 1)
        for p, w in windows.items()
    )
    skipped = audit.get("not_audited") or []
    unaudited = f" (partitions {skipped} had no input after it)" if skipped else ""
    return (
        f"failover drill: {t.describe()}; audit of msg_id {audited}{unaudited}: "
        f"{audit['records']} records, 0 missing, 0 duplicated; {rejoined}"
    )


def as_dict(takeover: Takeover) -> dict[str, Any]:
    return asdict(takeover)


class KafkaEpochTail:
    """EpochTail over every partition of the outbound topic, from their ends when created."""

    def __init__(self, settings: TaskSettings) -> None:
        import uuid

        from confluent_kafka import Consumer, TopicPartition

        from twinstream.platform.kafka import consumer_config

        self._consumer = Consumer(consumer_config(settings, f"twinstream-drill-{uuid.uuid4()}"))
        topic = settings.outbound_topic
        partitions = self._consumer.list_topics(topic, timeout=15).topics[topic].partitions
        ends = []
        for p in sorted(partitions) or [0]:
            _low, high = self._consumer.get_watermark_offsets(TopicPartition(topic, p), 15)
            ends.append(TopicPartition(topic, p, high))
        self._consumer.assign(ends)

    def poll(self, timeout_s: float) -> int | None:
        from twinstream.core.outbound import header

        highest = None
        for msg in self._consumer.consume(500, timeout_s):
            if msg.error() is not None:
                continue
            epoch = header(msg.headers(), "epoch")
            if epoch is not None:
                highest = max(highest or 0, int(epoch))
        return highest

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> KafkaEpochTail:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
