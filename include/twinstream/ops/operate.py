"""What the operating DAGs do, as plain functions: persist a standby, restore and resync an
engine, watch the engines. The DAG files only wire these into tasks, and the unit tests
drive them with fake engines, without Airflow. An engine is spoken to through its one
protocol, `twinstream.engine.api.EngineApi` (an EngineClient from its Airflow connection,
or a fake), and seen as the operator's `twinstream.ops.overview.EngineView`.

Every refusal is an OperateError whose message says what was found and what to do.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from twinstream.core.rows import positions_text, range_text, record_id, record_text, span
from twinstream.edge.reader import Record
from twinstream.engine import snapshot
from twinstream.engine.api import AgreementInfo, BufferedRow, EngineApi
from twinstream.engine.client import EngineClient, EngineError
from twinstream.ops.overview import WORKING, EngineView, engine_view, unanswered_view
from twinstream.platform import registry
from twinstream.platform.settings import (
    CommonSettings,
    Connections,
    TaskSettings,
    load,
)

log = logging.getLogger(__name__)

COLD = "cold"
LATEST = "latest"
# The newest snapshot taken by an engine that agreed with the active (Manifest.proven):
# what a restore after a disagreement, and watch_engines, ask for.
PROVEN = snapshot.PROVEN


class OperateError(Exception):
    """The operation must not go on; the message says why and what to do."""


@contextmanager
def refusals_fail_fast() -> Iterator[None]:
    """In an Airflow task: a refusal fails the task at once. Retrying cannot change the
    answer; retries are for the network."""
    try:
        yield
    except OperateError as exc:
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(str(exc)) from exc


def observe(engine: EngineApi, pipeline: str) -> EngineView:
    """The engine as its admin API answers now, as `twinstream status` would show it. One
    that does not answer has the whole error as its problem (the request and the HTTP
    status too): describe() puts it in the task's log."""
    try:
        server = engine.server()
        info = engine.pipeline()
    except EngineError as exc:
        return unanswered_view(pipeline, engine.engine_id, exc, problem=str(exc))
    return engine_view(pipeline, engine.engine_id, server, info)


# -- persist_standby_state --------------------------------------------------------------


def zk_leader(settings: CommonSettings) -> str | None:
    """The engine id holding the election (the first contender), read with the pipeline's
    ZooKeeper credentials; None when nobody holds it."""
    from twinstream.core.election import zk_session

    with zk_session(settings.zookeeper()) as client:
        contenders = client.Election(settings.election_path).contenders()
        return str(contenders[0]) if contenders else None


def pick_standby(views: Iterable[EngineView], leader: str | None) -> str:
    """An engine that ZooKeeper does not name as the leader and that says itself it is an
    in-sync standby: both sources must agree, so a stale view can never pick the active.
    Never one whose rows disagree with the published ones (overridden or not: its state is
    the suspect one), nor a shadow (it runs other code than the active: its state is
    another version's), and one that agrees before one not yet checked: its snapshot is the
    one a restore can trust (Manifest.proven; the engine writes its agreement there)."""
    views = list(views)
    candidates = [
        view
        for view in views
        if view.problem is None
        and view.engine_id != leader
        and view.role == "standby"
        and view.state == "running"
        and view.in_sync
        # A shadow runs other code than the active: its state is another version's.
        and view.agreement.state not in ("disagrees", "shadow")
    ]
    # Stable: among equals, the configured order as before.
    candidates.sort(key=lambda v: v.agreement.state != "agrees")
    if candidates:
        return candidates[0].engine_id
    seen = "; ".join(v.describe() for v in views)
    raise OperateError(
        f"no in-sync standby that does not disagree to persist from (ZooKeeper leader: "
        f"{leader}; {seen}). The active is never persisted, nor a standby whose rows differ "
        "from the published ones; restore or resync a standby (restore_and_resync) and rerun."
    )


def persist_from(engine: EngineApi) -> dict[str, Any]:
    """The manifest of the snapshot the engine wrote, as JSON (an XCom)."""
    manifest = engine.persist()
    log.info(
        "engine %s: snapshot %s, next inbound offset %s, %s bytes",
        engine.engine_id,
        manifest.snapshot_id,
        manifest.next_offset,
        manifest.size_bytes,
    )
    dumped: dict[str, Any] = manifest.model_dump(mode="json")
    return dumped


def verify_persisted(settings: CommonSettings, manifest: Mapping[str, Any]) -> str:
    """Re-read the snapshot from shared storage, check every checksum, and check that it is
    the one the engine reported."""
    snapshot_id = str(manifest["snapshot_id"])
    try:
        on_disk = snapshot.verify(settings.snapshot_dir / snapshot_id, settings.pipeline)
    except snapshot.SnapshotError as exc:
        raise OperateError(f"the snapshot just persisted does not verify: {exc}") from exc
    # Compared as JSON: the reply came through an XCom, where next_offsets' partition keys
    # are strings.
    if on_disk.model_dump(mode="json") != dict(manifest):
        raise OperateError(f"snapshot {snapshot_id}: the manifest on disk differs from the reply")
    log.info("snapshot %s: %s files verified", snapshot_id, len(on_disk.files))
    return snapshot_id


def prune(settings: CommonSettings, keep: int) -> list[str]:
    deleted = snapshot.prune(settings.snapshot_dir, settings.pipeline, keep)
    left = snapshot.snapshot_ids(settings.snapshot_dir)
    log.info("pruned %s snapshot(s) %s; kept %s", len(deleted), deleted, left)
    return deleted


# -- restore_and_resync -----------------------------------------------------------------


def assess(view: EngineView, force: bool) -> str:
    """Refuse to touch an engine that is doing its job, unless forced. A standby whose rows
    disagree with the published ones is not doing it, in sync or not: it does not heal by
    itself, so it is restored without `force`."""
    if view.problem is not None:
        raise OperateError(
            f"{view.describe()}: its admin API must answer before it can be restored; start "
            "its process (make up / docker compose up -d) and rerun"
        )
    if view.role == "active" and view.state in WORKING:
        raise OperateError(
            f"{view.describe()}: this engine is the active; restoring it would stop the "
            "pipeline's output. Stop it first so that a standby takes over."
        )
    if view.state in WORKING and view.in_sync and not view.disagrees and not force:
        raise OperateError(
            f"{view.describe()}: healthy and in sync, nothing to restore (set force to restore "
            "it anyway)"
        )
    log.info("%s: will be restored", view.describe())
    return view.describe()


def inbound_log_starts(settings: CommonSettings) -> dict[int, int]:
    """The log-start offset of every partition of the inbound topic."""
    from twinstream.engine.positions import InboundWatermarks
    from twinstream.platform.kafka import connection

    marks = InboundWatermarks(connection(settings), settings.topics(), "airflow")
    try:
        return marks.log_starts()
    finally:
        marks.close()


def choose_snapshot(
    settings: CommonSettings,
    requested: str,
    log_starts: Mapping[int, int],
    layout: str | None = None,
    version: str = "",
) -> str:
    """The snapshot id to restore (or `cold`), checked before the engine is touched: its
    checksums, that its state layout is the pipeline's `layout` (`Pipeline.state_layout`),
    that an engine of the restored engine's `version` took it (snapshot.other_code), and
    that Kafka still holds, in every partition, the offset it continues at.

    `proven` (the newest snapshot an agreeing engine took) falls back to `cold` when there is
    none Kafka can still replay, saying why: it is what watch_engines asks for, unattended,
    and a cold rebuild recomputes the state from the inbound topic alone, so it proves as
    much; an unproven snapshot may hold the very state that disagrees."""
    if requested == COLD:
        log.info("cold rebuild: replay from the inbound offset at now - window retention")
        return COLD
    try:
        manifest = snapshot.choose(
            settings.snapshot_dir, settings.pipeline, requested, layout, version
        )
    except snapshot.SnapshotError as exc:
        if requested == PROVEN:
            log.warning(
                "pipeline %s: %s; a cold rebuild instead (replay from the inbound offset at "
                "now - window retention)",
                settings.pipeline,
                exc,
            )
            return COLD
        raise OperateError(f"cannot restore {requested!r}: {exc}") from exc
    positions = manifest.positions()
    behind = {p: o for p, o in positions.items() if o < log_starts.get(p, 0)}
    if behind:
        where = ", ".join(
            f"{positions_text({p: o})} where it starts at {log_starts.get(p, 0)}"
            for p, o in sorted(behind.items())
        )
        if requested == PROVEN:
            log.warning(
                "pipeline %s: the newest proven snapshot %s continues at inbound offset %s "
                "(Kafka's log of %s): retention has deleted what it would replay; a cold "
                "rebuild instead",
                settings.pipeline,
                manifest.snapshot_id,
                where,
                settings.inbound_topic,
            )
            return COLD
        raise OperateError(
            f"snapshot {manifest.snapshot_id} continues at inbound offset {where} "
            f"(Kafka's log of {settings.inbound_topic}): retention has deleted what it would "
            "replay; restore a newer snapshot or 'cold'"
        )
    log.info(
        "snapshot %s: taken by engine %s at %s, continues at inbound offset %s (log start %s)",
        manifest.snapshot_id,
        manifest.engine_id,
        manifest.created_at,
        positions_text(positions),
        positions_text(dict(log_starts)),
    )
    return manifest.snapshot_id


def start_restore(
    engine: EngineApi, pipeline: str, snapshot_id: str, force: bool
) -> dict[str, Any]:
    """Restore `snapshot_id` on the engine of `pipeline`, stopping it first only when
    forced (it may have started since assess()) or when its rows disagree with the
    published ones: that is why it is restored."""
    view = observe(engine, pipeline)
    if view.state in WORKING:
        if not force and not view.disagrees:
            raise OperateError(f"{view.describe()}: it started meanwhile; rerun with force")
        why = "it disagrees" if view.disagrees else "forced"
        log.warning(
            "engine %s of pipeline %s: stopping it for the restore (%s): %s",
            engine.engine_id,
            pipeline,
            why,
            view.describe(),
        )
        engine.stop()
    report = engine.restore(snapshot_id)
    log.info(
        "engine %s: restoring %s from inbound offset %s; lag %s",
        engine.engine_id,
        report.snapshot,
        report.next_offset,
        report.pipeline.lag,
    )
    return {**report.model_dump(mode="json"), "started_at": time.time()}


@dataclass
class SyncCheck:
    done: bool
    message: str
    # The engine was restarting its own query (state recovering), and the caller let it.
    recovering: bool = False


def sync_check(
    engine: EngineApi,
    started_at: float,
    wait_s: float,
    now: float,
    since: str = "the restore",
    recovering_ok: bool = False,
) -> SyncCheck:
    """One look at a restoring (or restarted) engine: done when in sync; OperateError when
    it failed, when its rows disagree with the published ones again, or when the wait is
    over. The message is the progress line for the sensor's log, with the engine's
    agreement. `recovering_ok`: an engine restarting its own query (twinstream.engine.
    recovery, after a backoff of seconds) is progress, not a failure; the caller bounds
    how long it lets that last."""
    info = engine.pipeline()
    elapsed = now - started_at
    rate = info.events_per_s
    agreement = info.agreement
    line = (
        f"engine {engine.engine_id}: {info.state}, lag {info.lag}, "
        f"{'-' if rate is None else rate} events/s, agreement {agreement.state} "
        f"({agreement.ranges_agreed} ranges agreed), {elapsed:.0f} s since {since}"
    )
    if info.state == "recovering" and recovering_ok and elapsed <= wait_s:
        return SyncCheck(False, f"{line}: {info.reason}", recovering=True)
    if info.state not in WORKING:
        raise OperateError(f"{line}: the pipeline is {info.state}: {info.reason}")
    if not agreement.eligible and not found_before(agreement, started_at):
        at = "" if agreement.difference is None else f" at {agreement.difference.text()}"
        raise OperateError(
            f"{line}: it disagrees with the published output again{at}. The snapshot it was "
            "restored from carries the difference, or the pipeline's transform is not "
            "deterministic: restore it with snapshot 'cold' (restore_and_resync), and if it "
            "disagrees again, look for what the transform reads besides its input (clock, "
            "randomness, another service)"
        )
    if info.in_sync:
        return SyncCheck(True, f"{line}: in sync")
    if elapsed > wait_s:
        raise OperateError(f"{line}: not in sync after the {wait_s:.0f} s allowed")
    return SyncCheck(False, line)


def found_before(agreement: AgreementInfo, started_at: float) -> bool:
    """Whether the engine found its difference before `started_at` (the restore): the one
    the restore is curing, not a new one. Unknown (no time said): not before."""
    found = agreement.difference.found_at if agreement.difference is not None else ""
    try:
        return bool(found) and datetime.fromisoformat(found).timestamp() < started_at
    except ValueError:
        return False


@dataclass
class Comparison:
    compared: int
    # The lowest partition's compared msg_ids; `ranges` names every partition's.
    first_msg_id: int | None
    last_msg_id: int | None
    mismatches: list[str] = field(default_factory=list)
    ranges: list[str] = field(default_factory=list)


def compare_buffer(
    buffered: Sequence[BufferedRow],
    published: Mapping[int, Sequence[tuple[str, str | None, str]]],
    partition: int = 0,
) -> Comparison:
    """The engine's buffered rows against the records already published for the same
    msg_ids: same topic kind, key and value, byte for byte, every row of a msg_id (a
    fan-out has several). A coverage row (an input without output) matches no record."""
    last_published = max(published) if published else None
    mine: dict[int, list[tuple[str, str | None, str]]] = {}
    for row in buffered:
        rows = mine.setdefault(row.msg_id, [])
        if row.kind != "none":
            rows.append((row.kind, row.key, row.value))
    result = Comparison(0, None, None)
    for msg_id, rows in mine.items():
        if last_published is None or msg_id > last_published:
            continue  # not published yet: the active is behind this standby
        result.first_msg_id = msg_id if result.first_msg_id is None else result.first_msg_id
        result.last_msg_id = msg_id
        result.compared += 1
        theirs = list(published.get(msg_id, []))
        if rows and not theirs:
            result.mismatches.append(
                f"msg_id {record_text(record_id(partition, msg_id))}: buffered, "
                "but not in the outbound topics"
            )
        elif theirs != rows:
            result.mismatches.append(
                f"msg_id {record_text(record_id(partition, msg_id))}: buffered "
                f"{rows}, published {theirs}"
            )
    return result


def published_since(
    settings: TaskSettings, first_msg_id: int, timeout_s: float = 60.0, partition: int = 0
) -> dict[int, list[tuple[str, str | None, str]]]:
    """msg_id -> [(kind, key, value), ...] of the committed records with msg_id >=
    first_msg_id in `partition` of the outbound and dead-letter topics, in the order they
    were published."""
    found: dict[int, list[tuple[str, str | None, str]]] = {}
    for kind, r in committed_since(
        settings, first_msg_id, timeout_s, kinds=("out", "dlq"), partition=partition
    ):
        if r.msg_id is not None:
            found.setdefault(r.msg_id, []).append((kind, r.key, r.value))
    return found


def committed_since(
    settings: TaskSettings,
    first_msg_id: int,
    timeout_s: float = 60.0,
    kinds: Sequence[str] = ("out", "dlq", "progress"),
    partition: int = 0,
) -> list[tuple[str, Record]]:
    """(kind, record) of every committed record with msg_id >= first_msg_id (or none) in
    the outbound ("out"), dead-letter ("dlq") and progress ("progress") topics of `kinds`,
    duplicates included; a progress record whose range reaches first_msg_id counts. Reads back
    from the end of each topic in growing spans: outbound offsets are not msg_ids
    (transaction markers take offsets too)."""
    from confluent_kafka import Consumer, TopicPartition

    from twinstream.edge.reader import read_committed
    from twinstream.platform.kafka import consumer_config

    found: list[tuple[str, Record]] = []
    consumer = Consumer(consumer_config(settings, f"twinstream-ops-{uuid.uuid4()}"))
    try:
        topics = {
            "out": settings.outbound_topic,
            "dlq": settings.dlq_topic,
            "progress": settings.progress_topic,
        }
        for kind in kinds:
            topic = topics[kind]
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout_s
            )
            span = 1024
            while True:
                start = max(low, high - span)
                records = list(
                    read_committed(settings, topic, start, idle_timeout_s=5.0, partition=partition)
                )
                ids = [r.msg_id for r in records if r.msg_id is not None]
                if start == low or (ids and min(ids) < first_msg_id):
                    break
                span *= 4
            found.extend((kind, r) for r in records if r.msg_id is None or r.msg_id >= first_msg_id)
    finally:
        consumer.close()
    return found


def check_buffer(engine: EngineApi, settings: TaskSettings, last: int) -> Comparison:
    """The engine's last `last` buffered rows against what is published for the same
    msg_ids, partition by partition."""
    buffered = engine.buffer(last)
    if not buffered:
        raise OperateError(f"engine {engine.engine_id}: its buffer is empty; nothing to compare")
    result = Comparison(0, None, None)
    groups: dict[int, list[BufferedRow]] = {}
    for row in buffered:
        groups.setdefault(row.partition, []).append(row)
    for partition, rows in sorted(groups.items()):
        published = published_since(settings, rows[0].msg_id, partition=partition)
        part = compare_buffer(rows, published, partition)
        result.compared += part.compared
        result.mismatches += part.mismatches
        if part.first_msg_id is not None and part.last_msg_id is not None:
            result.ranges.append(range_text(partition, part.first_msg_id, part.last_msg_id))
            if result.first_msg_id is None:
                result.first_msg_id, result.last_msg_id = part.first_msg_id, part.last_msg_id
    if result.mismatches:
        shown = "\n".join(result.mismatches[:20])
        raise OperateError(
            f"engine {engine.engine_id}: {len(result.mismatches)} of {result.compared} buffered "
            f"outputs differ from the published ones:\n{shown}"
        )
    if result.compared == 0:
        raise OperateError(
            f"engine {engine.engine_id}: none of its {len(buffered)} buffered outputs "
            f"(msg_id {span(buffered)}) is published yet"
        )
    log.info(
        "engine %s: %s buffered outputs (msg_id %s) equal the published ones",
        engine.engine_id,
        result.compared,
        ", ".join(result.ranges),
    )
    return result


# -- audit_output_topic: agreement -------------------------------------------------------


def agreement_task(settings: TaskSettings, run_id: str) -> str:
    """audit_output_topic's `agreement` task: every engine's word, recorded as the run's
    `agreement` (twinstream.ops.audit_runs); a disagreement fails the task at once."""
    from twinstream.ops.audit_runs import outcome_of

    with outcome_of(settings.audit_dir, run_id, "agreement") as say, refusals_fail_fast():
        summary = agreement_verdict(settings.pipeline, observe_engines(settings))
        say(summary)
        return summary


def agreement_verdict(pipeline: str, views: Sequence[EngineView]) -> str:
    """Whether every engine of `pipeline` that answers agrees with the published output (or
    has not compared yet): OperateError naming each disagreement's msg_id, the active's
    transaction it lies in and both sides' rows, else a one-line summary. An engine that
    does not answer is logged, not a failure: watch_engines restores one that stays down."""
    for view in views:
        if view.problem is not None:
            log.info(
                "engine %s of pipeline %s: agreement not known, it does not answer (%s); "
                "watch_engines restores an engine that stays down",
                view.engine_id,
                pipeline,
                view.problem,
            )
    found = [text for v in views if (text := v.disagreement()) is not None]
    if found:
        raise OperateError("; ".join(found))
    answered = [v for v in views if v.problem is None]
    summary = (
        f"pipeline {pipeline}: no engine disagrees with the published output ("
        + (", ".join(f"{v.engine_id} {v.agreement_text()}" for v in answered) or "none answers")
        + ")"
    )
    log.info("%s", summary)
    return summary


# -- watch_engines ----------------------------------------------------------------------


@dataclass
class Incident:
    """An engine seen down, stopped or disagreeing since `since`; `triggered` once a restore
    started."""

    since: float
    triggered: bool = False
    what: str = ""
    # Past its restore cap (RestoreCap): said once per incident, not at every look.
    capped: bool = False


@dataclass(frozen=True)
class RestoreCap:
    """At most `restores` restores of one engine within `window_s`, whatever their cause:
    an engine a restore does not heal (its code differs, its disk is broken) is never
    restored in a loop, each restore replaying the retained input again."""

    restores: int = 2
    window_s: float = 3600.0


def engines_to_restore(
    views: Iterable[EngineView],
    incidents: Mapping[str, Mapping[str, Any]],
    now: float,
    grace_s: float,
    restored: dict[str, list[float]] | None = None,
    cap: RestoreCap = RestoreCap(),
) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Which engines to restore now, and the incidents to remember for the next look. An
    engine is restored once per incident: after the grace period, and not again until it
    has been seen healthy. A running standby whose rows disagree with the published ones is
    restored at once: it does not heal by itself (and it takes no part in the election, so
    the pipeline has one standby fewer until it is restored), unless it runs other code
    than the active (a restore brings back state, not code). `restored` (engine -> when its
    restores were triggered, kept by the caller across looks and updated here) bounds the
    restores of an engine by `cap`; one past it is said, with the reason, and not made."""
    restored = {} if restored is None else restored
    views = list(views)
    actives = {v.pipeline: v for v in views if v.role == "active" and v.problem is None}
    remembered = {k: Incident(**v) for k, v in incidents.items()}
    to_restore = []
    current: dict[str, Incident] = {}
    for engine_id in list(restored):
        restored[engine_id] = [t for t in restored[engine_id] if now - t < cap.window_s]
        if not restored[engine_id]:
            del restored[engine_id]
    for view in views:
        if view.healthy:
            if view.engine_id in remembered:
                log.info("%s: healthy again; incident closed", view.describe())
            continue
        incident = remembered.get(view.engine_id) or Incident(since=now, what=view.describe())
        incident.what = view.describe()
        down_for = now - incident.since
        disagrees = view.disagrees and view.state == "running" and view.role != "active"
        active = actives.get(view.pipeline)
        other_code = (
            active is not None
            and bool(active.pipeline_version and view.pipeline_version)
            and active.pipeline_version != view.pipeline_version
        )
        capped = len(restored.get(view.engine_id, [])) >= cap.restores
        if incident.triggered:
            log.info("%s: restore already triggered for this incident", view.describe())
        elif disagrees and other_code:
            assert active is not None
            log.warning(
                "engine %s of pipeline %s disagrees with the active and runs other code (%s, "
                "the active %s): not restoring it, since a restore brings back state, not "
                "code; its rows differ because its code does",
                view.engine_id,
                view.pipeline,
                view.pipeline_version,
                active.pipeline_version,
            )
        elif (disagrees or down_for >= grace_s) and capped and incident.capped:
            log.info("%s: still past its restore cap; not restoring it", view.describe())
        elif (disagrees or down_for >= grace_s) and capped:
            incident.capped = True
            log.error(
                "%s: not restoring it again: restored %d times in the last %.0f min (at most "
                "%d), and it is still not healthy, so another restore would not heal it "
                "either. Read its log and `twinstream status`; trigger restore_and_resync by "
                "hand to try once more",
                view.describe(),
                len(restored[view.engine_id]),
                cap.window_s / 60,
                cap.restores,
            )
        elif disagrees:
            incident.triggered = True
            to_restore.append(view.engine_id)
            restored.setdefault(view.engine_id, []).append(now)
            log.warning(
                "engine %s of pipeline %s: triggering restore_and_resync (snapshot %s) at once: %s",
                view.engine_id,
                view.pipeline,
                PROVEN,
                view.disagreement(),
            )
        elif down_for >= grace_s:
            incident.triggered = True
            to_restore.append(view.engine_id)
            restored.setdefault(view.engine_id, []).append(now)
            log.warning("%s for %.0f s: triggering restore_and_resync", view.describe(), down_for)
        else:
            log.info("%s for %.0f s (grace %.0f s)", view.describe(), down_for, grace_s)
        current[view.engine_id] = incident
    return to_restore, {k: asdict(v) for k, v in current.items()}


def restore_conf(engine_id: str) -> dict[str, Any]:
    """The restore_and_resync run watch_engines triggers for an engine: from the newest
    proven snapshot (choose_snapshot falls back to a cold rebuild when there is none), so
    that a restore never brings back state an engine that disagreed had persisted."""
    return {"engine": engine_id, "snapshot": PROVEN}


def engine_settings(params: Mapping[str, Any]) -> TaskSettings:
    """The settings of the pipeline whose engine the run's `engine` Param names
    (restore_and_resync: engine ids are the stack's, so an engine names its pipeline).
    Reads the environment and the pipelines file only."""
    return registry.for_engine(load(TaskSettings), str(params["engine"]))


def airflow_engine(engine_id: str, settings: Connections) -> EngineClient:
    """The engine's client from its Airflow connection (inside a task only)."""
    from airflow.sdk import Connection

    return engine_client_factory(settings, Connection.get)(engine_id)


def observe_engines(settings: TaskSettings) -> list[EngineView]:
    """Every configured engine, through its Airflow connection (inside a task only)."""
    views = []
    for engine_id in settings.engine_ids:
        with airflow_engine(engine_id, settings) as engine:
            views.append(observe(engine, settings.pipeline))
    return views


def engine_client_factory(
    settings: Connections, connection: Callable[[str], Any]
) -> Callable[[str], EngineClient]:
    """engine id -> EngineClient, from the Airflow connection `connection(conn_id)` returns
    (anything with host, port, schema and password)."""

    def make(engine_id: str) -> EngineClient:
        if engine_id not in settings.engine_ids:
            raise OperateError(
                f"unknown engine {engine_id!r}; configured: {', '.join(settings.engine_ids)}"
            )
        conn = connection(settings.engine_conn_id(engine_id))
        return EngineClient.from_connection(
            engine_id,
            conn.host,
            conn.port,
            conn.schema,
            conn.password,
            # A private CA's file, for an https engine (the "ca" key).
            extra=getattr(conn, "extra_dejson", None),
        )

    return make
