"""The Kafka retention guard: can every engine still be restored, and is the topic shape
the one the failover protocol relies on?

A restore replays the inbound topic from a snapshot's next offset, so Kafka must keep the
inbound records for longer than the window retention (state older than that is rebuilt by
a cold restore) plus the persist interval (the newest snapshot may be that old) plus a
margin for the restore itself. `evaluate` is a pure function of the topic configs and the
measured facts; each check is a named result with the setting, the current and the
required value, and the `kafka-configs` command that fixes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twinstream.platform.settings import TaskSettings

FAIL = "fail"
WARN = "warn"
OK = "ok"

# Kafka's default for a setting a topic does not override.
UNLIMITED = -1


@dataclass(frozen=True)
class TopicFacts:
    name: str
    configs: dict[str, str]
    partitions: int
    replication_factor: int

    def number(self, key: str, default: int) -> int:
        value = self.configs.get(key)
        return default if value in (None, "") else int(str(value))


@dataclass(frozen=True)
class Facts:
    """What the check knows: the topics, the intervals, the measured input."""

    inbound: TopicFacts
    outbound: TopicFacts
    window_retention_ms: int
    persist_interval_ms: int
    restore_margin_ms: int
    audit_interval_ms: int
    # Measured input rate; None when the topic is idle (the bytes rule is then unknowable).
    inbound_bytes_per_s: float | None
    single_broker_dev: bool
    bootstrap_servers: str
    # Partition 0's; `inbound_log_starts` and `newest_snapshot_next_offsets` have every
    # partition's (when set, they are what the snapshot check compares).
    inbound_log_start: int
    newest_snapshot: str | None = None
    newest_snapshot_next_offset: int | None = None
    inbound_log_starts: dict[int, int] = field(default_factory=dict)
    newest_snapshot_next_offsets: dict[int, int] = field(default_factory=dict)
    # The partitions the settings give the pipeline's topics.
    partitions: int = 1


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok, warn or fail
    setting: str
    current: str
    required: str
    message: str
    fix: str = ""

    def line(self) -> str:
        text = f"[{self.status.upper()}] {self.name}: {self.message}"
        if self.status != OK:
            text += f" (current {self.setting}={self.current}, required {self.required})"
            if self.fix:
                text += f"; fix: {self.fix}"
        return text


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status == WARN]


def required_retention_ms(facts: Facts) -> int:
    return facts.window_retention_ms + facts.persist_interval_ms + facts.restore_margin_ms


def configs_command(bootstrap: str, topic: str, setting: str, value: int | str) -> str:
    return (
        f"kafka-configs.sh --bootstrap-server {bootstrap} --entity-type topics "
        f"--entity-name {topic} --alter --add-config {setting}={value}"
    )


def _human(ms: int) -> str:
    if ms < 0:
        return "unlimited"
    hours = ms / 3_600_000
    return f"{ms} ms ({hours:.2f} h)"


def evaluate(facts: Facts) -> Report:
    report = Report()
    add = report.checks.append
    inbound, outbound = facts.inbound, facts.outbound
    need_ms = required_retention_ms(facts)
    bootstrap = facts.bootstrap_servers

    # 1. Time: strictly longer than window + persist interval + margin.
    retention_ms = inbound.number("retention.ms", 7 * 24 * 3_600_000)
    time_ok = retention_ms == UNLIMITED or retention_ms > need_ms
    add(
        Check(
            "inbound retention.ms",
            OK if time_ok else FAIL,
            "retention.ms",
            _human(retention_ms),
            f"> {_human(need_ms)} = window {facts.window_retention_ms} + persist interval "
            f"{facts.persist_interval_ms} + restore margin {facts.restore_margin_ms}",
            "Kafka keeps inbound records long enough for any restore"
            if time_ok
            else "Kafka may delete inbound records a restore still needs to replay",
            ""
            if time_ok
            else configs_command(bootstrap, inbound.name, "retention.ms", need_ms + 1),
        )
    )

    # 2. Bytes: whole segments are deleted, so only retention.bytes - segment.bytes is sure
    # to be kept; at the measured rate that must still span the required time.
    retention_bytes = inbound.number("retention.bytes", UNLIMITED)
    segment_bytes = inbound.number("segment.bytes", 1 << 30)
    if retention_bytes == UNLIMITED:
        add(
            Check(
                "inbound retention.bytes",
                OK,
                "retention.bytes",
                "unlimited",
                "unlimited, or enough for the required time",
                "no size limit",
            )
        )
    elif not facts.inbound_bytes_per_s:
        add(
            Check(
                "inbound retention.bytes",
                WARN,
                "retention.bytes",
                str(retention_bytes),
                "unknown: no input to measure",
                "no input was measured, so whether the size limit cuts below the required "
                "time cannot be told",
            )
        )
    else:
        kept_bytes = retention_bytes - segment_bytes
        need_bytes = int(facts.inbound_bytes_per_s * need_ms / 1000) + segment_bytes
        covers = kept_bytes > 0 and kept_bytes / facts.inbound_bytes_per_s * 1000 > need_ms
        add(
            Check(
                "inbound retention.bytes",
                OK if covers else FAIL,
                "retention.bytes",
                str(retention_bytes),
                f">= {need_bytes} (required time at {facts.inbound_bytes_per_s:.0f} B/s, "
                f"plus one segment of {segment_bytes} B)",
                "the size limit keeps more than the required time at the measured rate"
                if covers
                else "at the measured input rate the size limit deletes records a restore needs",
                ""
                if covers
                else configs_command(bootstrap, inbound.name, "retention.bytes", need_bytes),
            )
        )

    # 3. Segments: deletion happens segment by segment, one segment late at most.
    segment_ms = inbound.number("segment.ms", 7 * 24 * 3_600_000)
    segment_ok = retention_ms == UNLIMITED or segment_ms <= retention_ms
    add(
        Check(
            "inbound segment.ms",
            OK if segment_ok else FAIL,
            "segment.ms",
            _human(segment_ms),
            f"<= retention.ms ({_human(retention_ms)})",
            "segments roll at least as often as records expire"
            if segment_ok
            else "a segment lives longer than the retention: deletion is delayed by more than "
            "the retention itself, so the retention setting no longer says what is kept",
            ""
            if segment_ok
            else configs_command(bootstrap, inbound.name, "segment.ms", retention_ms),
        )
    )

    # 4. Shape: the configured partitions (msg_id = partition and offset), replication, no
    # unclean election.
    shaped = inbound.partitions == outbound.partitions == facts.partitions
    add(
        Check(
            "inbound partitions",
            OK if shaped else FAIL,
            "partitions (inbound / outbound)",
            f"{inbound.partitions} / {outbound.partitions}",
            str(facts.partitions),
            "the topics have the configured partitions: an output goes to its record's"
            if shaped
            else "an output goes to its record's partition number, so the topics need "
            "TWINSTREAM_PARTITIONS partitions each; recreate them, or set the count the "
            "topics have",
        )
    )
    for topic in (inbound, outbound):
        replicated = topic.replication_factor >= 3
        min_isr = topic.number("min.insync.replicas", 1)
        durable = replicated and min_isr >= 2
        soft = WARN if facts.single_broker_dev else FAIL
        add(
            Check(
                f"{topic.name} replication",
                OK if durable else soft,
                "replication.factor / min.insync.replicas",
                f"{topic.replication_factor} / {min_isr}",
                ">= 3 / >= 2",
                "survives a broker loss without losing acknowledged records"
                if durable
                else "a broker loss can lose acknowledged records"
                + (" (single-broker dev setup: a warning only)" if facts.single_broker_dev else ""),
                ""
                if durable or replicated
                else "kafka-reassign-partitions.sh to add replicas, then "
                + configs_command(bootstrap, topic.name, "min.insync.replicas", 2),
            )
        )
        unclean = topic.configs.get("unclean.leader.election.enable", "false")
        add(
            Check(
                f"{topic.name} unclean.leader.election.enable",
                OK if unclean == "false" else FAIL,
                "unclean.leader.election.enable",
                unclean,
                "false",
                "only in-sync replicas become leader"
                if unclean == "false"
                else "an out-of-sync replica may become leader and drop committed records",
                ""
                if unclean == "false"
                else configs_command(
                    bootstrap, topic.name, "unclean.leader.election.enable", "false"
                ),
            )
        )

    # 5. The outbound topic must outlive two audits, or an audit can miss what it checks.
    out_ms = outbound.number("retention.ms", 7 * 24 * 3_600_000)
    out_need = 2 * facts.audit_interval_ms
    out_ok = out_ms == UNLIMITED or out_ms >= out_need
    add(
        Check(
            "outbound retention.ms",
            OK if out_ok else FAIL,
            "retention.ms",
            _human(out_ms),
            f">= {_human(out_need)} (twice the audit interval)",
            "every output is still there for the next audit"
            if out_ok
            else "outputs may expire before the next audit reads them",
            "" if out_ok else configs_command(bootstrap, outbound.name, "retention.ms", out_need),
        )
    )

    # 6. The newest valid snapshot must still be restorable.
    if facts.newest_snapshot is None or facts.newest_snapshot_next_offset is None:
        add(
            Check(
                "newest snapshot restorable",
                WARN,
                "snapshot",
                "none",
                "a valid snapshot",
                "no valid snapshot yet: a failed engine can only be rebuilt cold "
                "(persist_standby_state makes one)",
            )
        )
    else:
        nexts = facts.newest_snapshot_next_offsets or {0: facts.newest_snapshot_next_offset}
        starts = facts.inbound_log_starts or {0: facts.inbound_log_start}
        short = sorted(p for p, o in nexts.items() if o < starts.get(p, 0))
        restorable = not short
        single = list(nexts) == [0]
        add(
            Check(
                "newest snapshot restorable",
                OK if restorable else FAIL,
                "next offset of snapshot " + facts.newest_snapshot,
                str(nexts[0]) if single else _positions(nexts),
                f">= inbound log-start offset {starts.get(0, 0)}"
                if single
                else f">= inbound log-start offsets {_positions(starts)}",
                "Kafka still holds everything the newest snapshot replays"
                if restorable
                else "Kafka has deleted records the newest snapshot needs"
                + ("" if single else f" (partition {', '.join(map(str, short))})")
                + ": run persist_standby_state now, and raise the inbound retention",
            )
        )
    return report


# -- gathering the facts and fixing (Kafka I/O; the DAG's task calls these) ---------------


def topic_facts(admin: Any, topic: str) -> TopicFacts:
    from twinstream.platform.kafka import describe_topic_configs

    meta = admin.list_topics(topic=topic, timeout=30).topics.get(topic)
    if meta is None or meta.error is not None:
        raise LookupError(f"topic {topic} does not exist ({getattr(meta, 'error', None)})")
    partitions = list(meta.partitions.values())
    return TopicFacts(
        name=topic,
        configs=describe_topic_configs(admin, topic),
        partitions=len(partitions),
        replication_factor=min((len(p.replicas) for p in partitions), default=0),
    )


def _positions(positions: dict[int, int]) -> str:
    return ", ".join(f"{p}:{o}" for p, o in sorted(positions.items()))


def measure_inbound(
    settings: TaskSettings, window_s: float = 3600.0
) -> tuple[float | None, dict[int, int]]:
    """(bytes/s over the last `window_s`, from the records' count over every partition and
    a sample of their sizes; None when nothing arrived), and each inbound partition's
    log-start offset."""
    import time
    import uuid

    from confluent_kafka import Consumer, TopicPartition

    from twinstream.edge.reader import read_committed
    from twinstream.platform.kafka import consumer_config

    topic = settings.inbound_topic
    consumer = Consumer(consumer_config(settings, f"twinstream-retention-{uuid.uuid4()}"))
    marks: dict[int, tuple[int, int]] = {}
    try:
        meta = consumer.list_topics(topic, timeout=15).topics[topic]
        partitions = sorted(meta.partitions) or [0]
        for p in partitions:
            marks[p] = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)
        since_ms = int((time.time() - window_s) * 1000)
        found = consumer.offsets_for_times(
            [TopicPartition(topic, p, since_ms) for p in partitions], timeout=15
        )
    finally:
        consumer.close()
    log_starts = {p: int(low) for p, (low, _) in marks.items()}
    count = 0
    for tp in found:
        low, high = marks[tp.partition]
        first = tp.offset if tp.offset >= 0 else high
        count += high - max(first, low)
    if count <= 0:
        return None, log_starts
    # Record sizes sampled from partition 0: producers spread a stream's records evenly.
    low, high = marks[partitions[0]]
    sample = list(
        read_committed(settings, topic, max(low, high - 200), idle_timeout_s=5.0, max_records=200)
    )
    # Key, value and about 70 bytes of record and batch overhead per record.
    size = sum(len(r.raw) + len(r.key or "") + 70 for r in sample) / max(1, len(sample))
    return count * size / window_s, log_starts


def gather(
    settings: TaskSettings, admin: Any, persist_interval_ms: int, audit_interval_ms: int
) -> Facts:
    from twinstream.engine import snapshot

    rate, log_starts = measure_inbound(settings)
    # The newest that verifies: checksums are read only down to the first valid snapshot.
    try:
        newest: snapshot.Manifest | None = snapshot.choose(
            settings.snapshot_dir, settings.pipeline, "latest"
        )
    except snapshot.SnapshotError:
        newest = None
    return Facts(
        inbound=topic_facts(admin, settings.inbound_topic),
        outbound=topic_facts(admin, settings.outbound_topic),
        window_retention_ms=settings.window_retention_ms,
        persist_interval_ms=persist_interval_ms,
        restore_margin_ms=settings.restore_margin_s * 1000,
        audit_interval_ms=audit_interval_ms,
        inbound_bytes_per_s=rate,
        single_broker_dev=settings.single_broker_dev,
        bootstrap_servers=settings.bootstrap_servers,
        inbound_log_start=log_starts.get(0, 0),
        newest_snapshot=newest.snapshot_id if newest else None,
        newest_snapshot_next_offset=newest.next_offset if newest else None,
        inbound_log_starts=log_starts,
        newest_snapshot_next_offsets=newest.positions() if newest else {},
        partitions=settings.partitions,
    )


def retention_fixes(facts: Facts, report: Report) -> dict[str, dict[str, str]]:
    """The retention settings to change, per topic, for the failed retention checks (the
    shape checks need an operator: partitions and replicas are not a config change)."""
    fixes: dict[str, dict[str, str]] = {}
    need_ms = required_retention_ms(facts)
    for check in report.failed:
        if check.name == "inbound retention.ms":
            fixes.setdefault(facts.inbound.name, {})["retention.ms"] = str(need_ms + 1)
        elif check.name == "inbound retention.bytes":
            fixes.setdefault(facts.inbound.name, {})["retention.bytes"] = str(UNLIMITED)
        elif check.name == "inbound segment.ms":
            retention_ms = facts.inbound.number("retention.ms", 7 * 24 * 3_600_000)
            target = max(need_ms + 1, retention_ms)
            fixes.setdefault(facts.inbound.name, {})["segment.ms"] = str(min(target, 86_400_000))
        elif check.name == "outbound retention.ms":
            out_need = 2 * facts.audit_interval_ms
            fixes.setdefault(facts.outbound.name, {})["retention.ms"] = str(out_need)
    return fixes


def apply_fixes(admin: Any, fixes: dict[str, dict[str, str]]) -> list[str]:
    """Set the retention configs; returns one `topic setting: before -> after` per change,
    read back from the broker."""
    from twinstream.platform.kafka import alter_topic_configs, describe_topic_configs

    changes = []
    for topic, configs in fixes.items():
        before = describe_topic_configs(admin, topic)
        alter_topic_configs(admin, topic, configs)
        after = describe_topic_configs(admin, topic)
        changes += [f"{topic} {k}: {before.get(k)} -> {after.get(k)}" for k in sorted(configs)]
    return changes


def dag_interval_ms(dags_dir: Path, dag_id: str) -> int:
    """The schedule interval of a DAG, read from the DAG itself (its file in `dags_dir`),
    so that the number has one source."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(dags_dir / f"{dag_id}.py"))
    if bag.import_errors or dag_id not in bag.dags:
        raise LookupError(f"cannot read the schedule of {dag_id}: {bag.import_errors}")
    delta = getattr(bag.dags[dag_id].timetable, "delta", None)
    if delta is None:
        raise LookupError(f"{dag_id} is not scheduled at a fixed interval")
    return int(delta.total_seconds() * 1000)
