"""One Twinstream engine: the streaming query, the gate, the election and the admin API,
wired together. `spark_jobs/engine.py` is its command-line entry point."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kazoo.retry import KazooRetry

import twinstream
from twinstream.contract import Pipeline
from twinstream.core.agreement import Agreement, DigestCost
from twinstream.core.checkpoint import batch_end, batch_start, unread
from twinstream.core.election import (
    ForeignNodeError,
    Standing,
)
from twinstream.core.gate import Gate
from twinstream.core.logs import EngineLog
from twinstream.core.outbound import (
    KafkaPublisher,
)
from twinstream.core.quarantine import QuarantineStore, describe
from twinstream.core.rows import Output, positions_text, with_offsets_without_records
from twinstream.engine import persistence, snapshot
from twinstream.engine.api import (
    BufferedRow,
    Conflict,
    PipelineInfo,
    RestoreReport,
    ServerInfo,
    TimelineInfo,
)
from twinstream.engine.arrivals import Arrivals, ArrivalSampler
from twinstream.engine.batching import DrainRate, batch_limit
from twinstream.engine.clients import EngineClients
from twinstream.engine.lag_trend import LagHistory
from twinstream.engine.lifecycle import Lifecycle, State, TransitionRefused
from twinstream.engine.metrics import EngineMetrics
from twinstream.engine.pipeline import rows_of, spark_conf, start_query, warm_up_engine
from twinstream.engine.positions import (
    BatchTimings,
    events_per_s,
    query_position,
)
from twinstream.engine.positions import (
    lag as inbound_lag,
)
from twinstream.engine.priority import Priority
from twinstream.engine.readiness import InSync, Redundancy
from twinstream.engine.recovery import Recovery
from twinstream.engine.spare_keeper import read_status
from twinstream.engine.status import pipeline_info
from twinstream.engine.takeover import Takeover
from twinstream.engine.timeline import Timeline
from twinstream.platform.settings import EngineSettings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)

# How long a query's start (or restart) waits for a suspended ZooKeeper session to come back
# before it fails as ZooKeeper being away (the recovery's backoff takes it from there).
_ZK_READ_DEADLINE_S = 30.0


def engine_session_args(
    settings: EngineSettings, engine_id: str, pipeline: Pipeline | None
) -> tuple[str, None, dict[str, str]]:
    """An engine's session: its name, master (the settings') and settings, as
    `twinstream.engine.spark.session` and `session_conf` take them."""
    return (
        f"twinstream-{settings.pipeline}-{engine_id}",
        None,
        {**spark_conf(pipeline), "spark.driver.memory": settings.engine_heap},
    )


class Engine:
    """One engine of a pipeline, given its clients (`EngineClients.from_settings` builds
    them, a unit test gives fakes). Building it starts nothing; `open` starts its sampler
    thread and prepares a publisher, `start` its query and its part in the election."""

    def __init__(
        self,
        settings: EngineSettings,
        engine_id: str,
        pipeline: Pipeline,
        clients: EngineClients,
        spark: SparkSession | None = None,
    ) -> None:
        settings.engine_admin_port(engine_id)  # an unknown engine id fails here, by name
        self.settings = settings
        self.definition = pipeline
        self.engine_id = engine_id
        # Every line this engine logs says which engine and pipeline (twinstream.core.logs).
        self.log = EngineLog(log, engine_id, settings.pipeline)
        self.meters = EngineMetrics(engine_id, settings.pipeline)
        self.gate = Gate(
            engine_id,
            settings.pipeline,
            settings.num_buffered_msgs,
            self.meters,
            max_buffer_size=settings.max_buffered_msgs,
            # The gate holds its lock here: the takeover only notes the plan.
            on_gap=lambda partition, first, last: self.takeover.on_gap(partition, first, last),
            on_fenced=self._resign,
            on_committed=self._committed,
            log=self.log,
        )
        self.clients = clients
        self.zk = clients.zk
        self.watermarks = clients.watermarks
        # The last 15 minutes of this engine's figures (the operator page's chart): the
        # latency of what it published, from each record's arrival in the inbound topic
        # (sampled high watermarks, twinstream.engine.arrivals) to the commit.
        self.recent = Timeline()
        # What digesting its transactions' rows has cost this engine as the active.
        self.published_digests = DigestCost()
        # The takeover and the repair of a gap it finds (twinstream.engine.takeover).
        self.takeover = Takeover(
            settings,
            engine_id,
            self.gate,
            clients.last_published,
            self._publisher,
            self.watermarks.log_starts,
            self.recent,
            self.log,
            str(clients.version),
        )
        self.election = clients.election(
            on_elected=self.takeover.take_over,
            on_step_down=self._stepped_down,
            on_connection=self.gate.zk_connected,
            standing=self.standing,
            # An engine whose output disagrees with the active's never leads, until
            # restored or overridden (twinstream.core.agreement).
            eligible=lambda: self.agreement.eligible,
        )
        self.quarantine = QuarantineStore(self.zk, settings.quarantine_path)
        # Failures of the query: the quarantine search, the backoff (twinstream.engine.recovery).
        self.recovery = Recovery(settings, engine_id, self.quarantine)
        self._quarantine_seen: tuple[float, dict[int, str]] = (0.0, {})
        # The last batch's id and end offsets (_with_offsets_without_records).
        self._batch_ends: tuple[int, dict[int, int] | None] = (-2, None)
        # Serialises start, stop, persist and restore; status reads never wait for it.
        self._lock = threading.RLock()
        # A warm spare's session when the engine adopted one (twinstream.engine.spare): this
        # process was that spare.
        self._spark: SparkSession | None = spark
        self.from_spare = spark is not None
        # An adopted spare catches up at its low priority (twinstream.engine.priority).
        self.priority = Priority(self.from_spare, settings.catch_up_niced_s)
        self._warmed = False
        self._query: StreamingQuery | None = None
        # stopped, running, restoring, persisting, recovering (twinstream.engine.lifecycle).
        self.lifecycle = Lifecycle(self.log.named(Lifecycle.__module__))
        self._restored_from: str | None = None
        self._restore_started = 0.0
        self._progress_cache: tuple[float, Any, dict[str, Any]] = (0.0, None, {})
        # Built ahead of a takeover, so that winning costs only the fence and the tail read.
        self._last_published = clients.last_published
        # A second reader for the standby's periodic look at the active's position: the
        # takeover's must never wait behind it.
        self._active_position = clients.active_position
        # The agreement check (twinstream.core.agreement): the active's published ranges,
        # followed on the progress topic, against this engine's own rows.
        self.agreement = Agreement(
            engine_id,
            settings.pipeline,
            self.gate.rows_between,
            clients.published_rows,
            self.gate.bound,
            log=self.log,
            version=str(clients.version),
        )
        self._follower = clients.follower
        self._following = False
        self.batch_timings = BatchTimings()
        # What this engine's batches process a second, for the next query's batch size.
        self.drain_rate = DrainRate(settings.engine_dir(engine_id) / "drain-rate.json")
        # The running query's largest batch (its maxOffsetsPerTrigger).
        self._max_offsets = settings.max_offsets_per_trigger
        self._timings_logged = time.monotonic()
        # The lag's recent samples: whether the engine is falling behind
        # (twinstream.engine.lag_trend).
        self.lag_history = LagHistory()
        # Whether this engine could take over now, in seconds of its own rate, with
        # hysteresis; and, while active, which standbys could take over from it
        # (twinstream.engine.readiness). Both change in the main loop only.
        self.sync = InSync(settings.in_sync_s, settings.in_sync_hold_s, settings.in_sync_lag)
        self.redundancy = Redundancy(engine_id, settings.engine_ids)
        self.arrivals = Arrivals()
        self._arrival_marks = clients.arrival_marks
        self._arrival_sampler = ArrivalSampler(
            self.arrivals, lambda: self._arrival_marks.highs(max_age_s=0.0)
        )

    def open(self) -> None:
        """Start what runs beside the query before it starts: the arrival sampler's thread,
        and a publisher prepared for a takeover."""
        self.takeover.prepare_publisher()
        self._arrival_sampler.start()

    # -- the admin API's operations (twinstream.engine.api.EngineApi) -------------------

    def start(self) -> PipelineInfo:
        """Start a stopped or failed pipeline; 409 (Conflict) when it is not stopped, or
        when it does not start (the reason says why and what to do)."""
        state = self.lifecycle.state
        if state is not State.STOPPED:
            raise Conflict(f"the pipeline is already {state}")
        self._start()
        info = self.pipeline()
        if self.lifecycle.state not in (State.RUNNING, State.RESTORING):
            raise Conflict(info.reason)
        return info

    def stop(self) -> PipelineInfo:
        """Stop a running pipeline, leaving the election first; 409 when it is not running."""
        state = self.lifecycle.state
        if state not in (State.RUNNING, State.RESTORING, State.RECOVERING):
            raise Conflict(f"the pipeline is {state}, not running")
        self._stop("stopped through the admin API")
        return self.pipeline()

    def override(self) -> PipelineInfo:
        """Let this engine lead although it disagrees with the active; 409 when it does
        not disagree."""
        if not self.agreement.override():
            raise Conflict("this engine does not disagree with the active: nothing to override")
        self.log.warning(
            "an operator overrode its disagreement; it may lead",
        )
        return self.pipeline()

    # -- lifecycle ----------------------------------------------------------------------

    def _become(self, state: State, reason: str, *, only_from: State | None = None) -> bool:
        """Move the lifecycle (twinstream.engine.lifecycle); a move its table refuses is
        logged and the state stays: the engine goes on rather than crash its caller."""
        try:
            return self.lifecycle.move(state, reason, only_from=only_from)
        except TransitionRefused as exc:
            self.log.error("%s", exc)
            return False

    def _start(self) -> None:
        """Resume from this engine's checkpoint. An unusable checkpoint, or none on a
        pipeline that has run before (a lost disk), leaves the pipeline stopped with the
        reason: starting over from the topic's beginning is a decision for a restore."""
        with self._lock:
            if self.lifecycle.state is not State.STOPPED:
                return
            problem = self._checkpoint_problem()
            if problem is not None:
                reason = (
                    f"{problem}; restore a snapshot: POST /pipeline/restore "
                    '{"snapshot": "latest"} (or "cold")'
                )
                self._become(State.STOPPED, reason)
                self.log.error(
                    "not started: %s",
                    reason,
                )
                return
            self._run(State.RUNNING, "")

    def _run(
        self, state: State, reason: str, starting_offsets: dict[int, int] | None = None
    ) -> None:
        try:
            self.clients.ensure_chroot()
            self._start_query(starting_offsets)
        except ForeignNodeError as exc:
            # Not a crash to restart from: nothing changes until someone deletes the node.
            self._become(State.STOPPED, str(exc))
            self.log.error("%s", exc)
            return
        self._become(state, reason)
        self.gate.joined()
        self.election.start()

    def _start_query(self, starting_offsets: dict[int, int] | None = None) -> None:
        if self._spark is None:
            self._spark = self._new_session()
        if not self._warmed:
            # Once per session; an adopted spare's session too (its warm-up ran no user code).
            self._warmed = True
            warm_up_engine(
                self._spark, self.settings, self.definition, self.engine_id, self._backlog
            )
        self.recovery.excluded = self._read_quarantine()
        self._max_offsets = self._batch_limit()
        self.gate.resume_waits()
        # A batch of the previous query interrupted by its stop raised too; it must not be
        # taken for this query's failure.
        self.recovery.batch_error = None
        self._query = start_query(
            self._spark,
            self.settings,
            self.definition,
            self.engine_id,
            self.process_batch,
            starting_offsets,
            quarantined=self.recovery.excluded,
            max_offsets=self._max_offsets,
        )
        self.log.info(
            "query %s started from %s%s",
            self._query.name,
            self.settings.checkpoint_dir(self.engine_id),
            ""
            if starting_offsets is None
            else f" at inbound offset {positions_text(starting_offsets)}",
        )

    def _batch_limit(self) -> int:
        """The new query's largest batch (twinstream.engine.batching): `max_batch_s` of work at
        the rate this engine measured."""
        limit = batch_limit(
            self.drain_rate.value,
            self.settings.max_batch_s,
            self.settings.min_offsets_per_trigger,
            self.settings.max_offsets_per_trigger,
        )
        self.log.info(
            "batches of at most %s records (%s records/s measured, %.1f s a batch)",
            limit,
            "none" if self.drain_rate.value is None else f"{self.drain_rate.value:,.0f}",
            self.settings.max_batch_s,
        )
        return limit

    def _stop_query_between_batches(self, timeout_s: float = 30.0) -> None:
        """Stop once the batch in flight, if any, has completed. A query that is behind
        starts its next batch at once, so the stop may still cut that one short: then the
        checkpoint has its offsets without its commit, Spark runs it again on restart, and
        the gate drops the rows it already holds."""
        query, self._query = self._query, None
        if query is None:
            return
        progress: Any = query.lastProgress or {}
        started_in = progress.get("batchId")
        deadline = time.monotonic() + timeout_s
        while query.isActive and query.status.get("isTriggerActive"):
            progress = query.lastProgress or {}
            if progress.get("batchId") != started_in:
                break  # the batch in flight completed; the next one has barely begun
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        query.stop()

    def _checkpoint_problem(self) -> str | None:
        def ran_before() -> bool:
            published = self._last_published.last_msg_ids(
                [self.settings.outbound_topic, self.settings.dlq_topic],
                self._last_published.partitions(),
            )
            return any(v is not None for v in published.values())

        return persistence.checkpoint_problem(
            self.settings,
            self.engine_id,
            self.watermarks.log_starts,
            ran_before,
            keyed=self.definition.keyed is not None,
        )

    def _stop(self, reason: str) -> None:
        with self._lock:
            if self.lifecycle.state is State.STOPPED:
                return
            self.recovery.search = None
            # Leave the election first: a standby takes over while this query winds down.
            self.election.stop()
            self.gate.step_down(reason, rejoin=False)
            self.gate.abandon_waits()
            if self._query is not None:
                try:
                    self._query.stop()
                except Exception as exc:
                    # On SIGTERM to the process group the JVM's shutdown hook may stop the
                    # SparkContext first; the query is gone either way, and the engine must
                    # still leave ZooKeeper and close its clients.
                    self.log.warning(
                        "the query did not stop cleanly (%s); "
                        "Spark is probably shutting down already",
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                    )
                self._query = None
            self._become(State.STOPPED, reason)
            self._restored_from = None
            self.log.warning("%s", reason)

    def close(self) -> None:
        # The process ends: a standby's query, Spark and JVM shut down below the engines
        # that go on (twinstream.engine.priority).
        self.priority.ending(leads=self.gate.role == "active")
        self._stop("engine shutting down")
        self.zk.stop()
        self.zk.close()
        self.drain_rate.save()
        self._arrival_sampler.stop()
        if self._arrival_sampler.is_alive():
            self._arrival_sampler.join(timeout=2)
        self._arrival_marks.close()
        self.watermarks.close()
        self._last_published.close()
        self._active_position.close()
        self._follower.close()
        if self._spark is not None:
            self._spark.stop()

    def track_active_position(self) -> None:
        """Follow the ranges the active publishes (the progress topic), compare them with
        this engine's own rows while it is a standby (the agreement check), and tell the gate
        how far the active has published, so that it keeps what the active has not
        published and what is not compared yet (called from the engine's main loop once a
        second). The first look reads how far the active had published before."""
        standby = self.gate.role == "standby"
        try:
            if not self._following:
                if not standby:
                    return
                self._follower.start(self._active_position.partitions())
                self._following = True
                self.gate.note_published(self._active_position())
            self.agreement.offer(self._follower.poll())
            floors = self.agreement.check(standby)
            if standby and floors:
                self.gate.note_published(floors)
        except Exception as exc:  # the next look retries; the buffer keeps its floor of N
            self.log.warning(
                "could not follow the active's published ranges: %s",
                exc,
            )

    def log_batch_timings(self, every_s: float = 60.0) -> None:
        """Sample the query's last progress report and its lag and, once every `every_s`,
        log where its batches spent their time (called from the engine's main loop, once a
        second: the lag's trend must not depend on anyone reading the status)."""
        progress = self._progress()
        self.batch_timings.add(progress)
        self.drain_rate.add(progress, self._max_offsets)
        # The lag costs a high-watermark read: only when the history would keep it (one
        # sample per SAMPLE_EVERY_S), not at every pass of the loop.
        if self.lag_history.due():
            self.sample_lag(self._lag(self.gate.status().processed))
        now = time.monotonic()
        if now - self._timings_logged < every_s:
            return
        self._timings_logged = now
        self.drain_rate.save()
        summary = self.batch_timings.summary()
        if summary is not None:
            self.log.info("%s", summary)

    def check_query(self) -> None:
        """The main loop's look at the query, every second: recover a query that died (a
        batch that failed anyway, or infrastructure; a quarantine search's next step), repair
        a gap a takeover found. Status reads never call it: this work takes seconds."""
        # A persist or restore in progress owns the query; check after it.
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._check_query()
        finally:
            self._lock.release()

    def _check_query(self) -> None:
        if self.takeover.due():
            self.takeover.rewind(self._stop_query_between_batches)
            self._restart_query()
            return
        query = self._query
        if query is None:
            if self.lifecycle.state is State.RECOVERING and self.recovery.backoff_over():
                self._restart_query()
            return
        if query.isActive:
            return
        error = query.exception()
        self._query = None
        self._recover(error)

    def _recover(self, error: Any) -> None:
        """A query died: twinstream.engine.recovery says how to go on (the next step of a search
        for the record to blame, at once; or a restart after a backoff, having left the
        election after repeated failures)."""
        outcome = self.recovery.query_died(error, self._kafka_answers, self._read_quarantine)
        self._become(State.RECOVERING, outcome.reason)
        if outcome.leave_election and self.gate.role != "none":
            self.election.stop()
            self.gate.step_down("query failing", rejoin=False)
        if outcome.restart_now:
            self._restart_query()

    def _restart_query(self) -> None:
        try:
            self._start_query()
        except Exception as exc:
            # Recovering, whatever it was (a repair's rewind restarts a running query): the
            # main loop tries again after the backoff, and only from recovering.
            self._become(State.RECOVERING, self.recovery.restart_failed(exc))
            return
        self._become(State.RUNNING, "")
        if self.gate.role == "none":  # left the election after repeated failures
            self.gate.joined()
            self.election.start()

    def _read_quarantine(self) -> dict[int, str]:
        if not self.zk.connected:
            self.zk.start(timeout=30)
        # A session suspended as the query starts is asked again, not a failed start: with
        # the smallest session ZooKeeper grants, a heartbeat missed while four JVMs start on
        # two cores drops the connection for a moment, and the engine used to exit on the
        # ConnectionLoss (supervisord restarted it: ~25 s of `up`). kazoo's retry repeats
        # on ConnectionLoss and OperationTimeout only; a refusal (ForeignNodeError) is raised.
        retry = KazooRetry(max_tries=-1, delay=0.2, max_delay=2.0, deadline=_ZK_READ_DEADLINE_S)
        # Before anything is read under the pipeline's node: it must be Twinstream's.
        retry(self.election.claim)
        entries: dict[int, str] = retry(self.quarantine.entries)
        return entries

    def quarantined(self) -> dict[int, str]:
        """The pipeline's quarantine as last read (at most 5 s old), for status reads."""
        read_at, entries = self._quarantine_seen
        if not self.zk.connected:  # before the pipeline starts, or ZooKeeper away
            return {**self.recovery.excluded}
        if time.monotonic() - read_at > 5.0:
            try:
                entries = self.quarantine.entries()
            except Exception as exc:  # status reads must not fail on ZooKeeper
                self.log.warning("quarantine unreadable: %s", exc)
                entries = {**self.recovery.excluded}
            self._quarantine_seen = (time.monotonic(), entries)
        return entries

    def _kafka_answers(self) -> bool:
        try:
            self.watermarks.log_starts()
        except Exception:
            return False
        return True

    # -- persist and restore ------------------------------------------------------------

    def persist(self) -> snapshot.Manifest:
        """Snapshot this standby's checkpoint and buffer. The engine stays in the election:
        should it win meanwhile, its takeover publishes from the buffer at once and the
        query continues when the copy is done."""
        with self._lock:
            if self.lifecycle.state is not State.RUNNING:
                raise Conflict(
                    f"the pipeline is {self.lifecycle.state}, not running: only a running standby "
                    "can persist"
                )
            if self.gate.role == "active":
                raise Conflict(
                    "this engine is the active: state is persisted from a standby only, so "
                    "that the active never pauses"
                )
            started = time.monotonic()
            self._become(State.PERSISTING, "writing a snapshot")
            try:
                # A batch paused for backpressure completes now: its rows are buffered.
                self.gate.abandon_waits()
                self._stop_query_between_batches()
                # Each step logged: a persist that hangs (CPU starvation) shows where.
                self.log.info(
                    "persist: query stopped after %.2f s",
                    time.monotonic() - started,
                )
                # The query is stopped: the buffer and the checkpoint agree and stay put.
                agreement = self.agreement.status()
                manifest = persistence.write(
                    self.settings,
                    self.engine_id,
                    self.definition.state_layout,
                    self.gate.buffered(),
                    agreement.state,
                    agreement.checked,
                    str(self.clients.version),
                )
            finally:
                self.log.info(
                    "persist: restarting the query after %.2f s",
                    time.monotonic() - started,
                )
                try:
                    self._start_query()
                except Exception as exc:
                    # Recovering: the main loop restarts the query after the backoff.
                    self._become(State.RECOVERING, self.recovery.restart_failed(exc))
                    raise
                self._become(State.RUNNING, "")
            self.log.warning(
                "persisted snapshot %s in %.2f s (next offset %s, batch %s, %s bytes)",
                manifest.snapshot_id,
                time.monotonic() - started,
                positions_text(manifest.positions()),
                manifest.batch_id,
                manifest.size_bytes,
            )
            return manifest

    def restore(self, snapshot: str) -> RestoreReport:
        """Load a snapshot (an id, `latest`) or rebuild `cold` into a stopped pipeline, then
        start it; GET /pipeline shows state `restoring` and the lag until in sync."""
        with self._lock:
            state = self.lifecycle.state
            if state not in (State.STOPPED, State.RECOVERING):
                raise Conflict(
                    f"the pipeline is {state}: restore replaces the checkpoint, so stop "
                    "the pipeline first (POST /pipeline/stop)"
                )
            log_starts = self.watermarks.log_starts()
            ready = persistence.prepare_restore(
                self.settings,
                self.engine_id,
                self.definition.state_layout,
                snapshot,
                log_starts,
                self.watermarks.offsets_at,
                str(self.clients.version),
            )
            self.gate.restore(ready.buffer)
            source, next_offsets = ready.source, ready.next_offsets
            # Its state is replaced: what it computes from now on is compared afresh.
            self.agreement.reset(f"restored from {source}")
            self._restored_from = source
            self._restore_started = time.monotonic()
            self._run(
                State.RESTORING,
                f"replaying from inbound offset {positions_text(next_offsets)} ({source})",
                ready.starting,
            )
            self.log.warning(
                "restoring from %s at inbound offset %s (log start %s)",
                source,
                positions_text(next_offsets),
                positions_text(log_starts),
            )
            return RestoreReport(
                snapshot=source,
                next_offset=next_offsets.get(0, 0),
                log_start_offset=log_starts.get(0, 0),
                next_offsets=next_offsets,
                log_start_offsets=log_starts,
                pipeline=self.pipeline(),
            )

    def _publisher(self) -> KafkaPublisher:
        return self.clients.publisher(self.published_digests)

    def buffer(self, last: int) -> list[BufferedRow]:
        rows = self.gate.buffered()[-last:] if last > 0 else []
        return [
            BufferedRow(
                msg_id=r.msg_id, kind=r.kind, key=r.key, value=r.value, partition=r.partition
            )
            for r in rows
        ]

    def _new_session(self) -> SparkSession:
        from twinstream.engine.spark import session

        return session(
            self.settings, *engine_session_args(self.settings, self.engine_id, self.definition)
        )

    def _backlog(self) -> int | None:
        """Inbound records the query reads before it is level with the topic; None while
        the high watermark is unknown."""
        highs = self.watermarks.highs()
        if highs is None:
            return None
        checkpoint = self.settings.checkpoint_dir(self.engine_id)
        return unread(checkpoint, self.settings.inbound_topic, highs)

    # -- the query's sink ---------------------------------------------------------------

    def process_batch(self, df: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        try:
            rows = rows_of(df, self.recovery.excluded, self.settings.max_message_bytes)
            rows = self._with_offsets_without_records(batch_id, rows)
        except Exception as exc:
            # The query fails with it; _recover decides whether a record is to blame.
            self.recovery.batch_error = (batch_id, describe(exc))
            raise
        self.recovery.batch_passed()
        collected = time.perf_counter()
        published = self.gate.on_batch(batch_id, rows)
        done = time.perf_counter()
        self.batch_timings.sink(1000 * (collected - started), 1000 * (done - collected))
        self.meters.batch(done - started)
        self.log.debug(
            "batch %s, %s rows, %s published, msg_id %s..%s",
            batch_id,
            len(rows),
            published,
            rows[0].msg_id if rows else None,
            rows[-1].msg_id if rows else None,
        )

    def _with_offsets_without_records(self, batch_id: int, rows: list[Output]) -> list[Output]:
        """The batch's rows and a coverage row for each offset of its range that holds no
        record (transaction markers, aborted records: twinstream.core.rows.
        with_offsets_without_records); its range from the checkpoint's offsets log, which
        Spark writes before it runs the batch."""
        checkpoint = self.settings.checkpoint_dir(self.engine_id)
        topic = self.settings.inbound_topic
        ends = batch_end(checkpoint, batch_id, topic)
        # The batch before's end, as this engine read it last batch: one read of the log a
        # batch, not two (a batch planned again after a rewind or a narrowing has another
        # id before it than the one remembered, and reads it).
        before, before_ends = self._batch_ends
        starts = before_ends if before == batch_id - 1 else batch_start(checkpoint, batch_id, topic)
        if ends is None or starts is None:
            return rows
        self._batch_ends = (batch_id, ends)
        return with_offsets_without_records(rows, starts, ends)

    # -- election callbacks -------------------------------------------------------------

    def _committed(self, rows: Sequence[Output]) -> None:
        self.recent.published(self.arrivals.latencies(rows, time.time()))

    def _resign(self) -> None:
        """The gate's producer can publish no more: give up the leadership and queue again;
        whoever wins next fences with a producer of its own. A fence from outside the
        election (a client with the pipeline's credentials that is no engine) is reported:
        resigning is still the cure, as the next winner's init fences that client back.
        Called with the gate's lock held: the check runs on a thread of its own."""
        epoch = self.gate.status().epoch

        def foreign() -> None:
            self.meters.foreign_fence()
            self.log.error(
                "fenced at epoch %s by a producer that is no engine "
                "(transactional id %s); resigning so that the next winner fences it back. "
                "Whoever did it holds this pipeline's engine credentials: rotate them "
                "(README, Security)",
                epoch,
                self.settings.transactional_id,
            )

        self.election.resign_fenced(epoch, foreign)

    def _stepped_down(self, reason: str) -> None:
        self.gate.step_down(reason, rejoin=self.lifecycle.state is State.RUNNING)

    # -- status -------------------------------------------------------------------------

    def code(self) -> tuple[str, bool]:
        """The digest of the pipeline's code on disk now, and whether it differs from the
        code this engine loaded (a read: what the engine runs never changes)."""
        running, on_disk = self.clients.version, self.clients.code_on_disk()
        return on_disk, bool(running.digest and on_disk and on_disk != running.digest)

    def server(self) -> ServerInfo:
        status = self.gate.status()
        on_disk, stale = self.code()
        return ServerInfo(
            engine_id=self.engine_id,
            role=status.role,
            pid=os.getpid(),
            zk_state=self.election.zk_state,
            epoch=status.epoch,
            version=twinstream.__version__,
            pipeline_version=str(self.clients.version),
            code_on_disk=on_disk,
            stale=stale,
            state_shape=self.definition.state_shape,
            from_spare=self.from_spare,
        )

    def standing(self, processed: dict[int, int] | None = None) -> Standing:
        """How far this engine is, as the election compares engines (asked on each win) and
        the status reports it: its lag now, and whether it is in sync as the main loop last
        judged it (a read never changes that). `processed`: the gate's, when the caller has
        read it."""
        lag = self._lag(self.gate.status().processed if processed is None else processed)
        return Standing(self.sync.value, lag, self.agreement.eligible, self.sync.lag_s)

    def publish_standing(self) -> None:
        """The main loop's second (once a second): judge whether this engine is in sync, end
        a restore once it is, tell the other engines how far it is while it contends (a
        winner that is behind hands its win to one that is in sync), look at the standbys
        while active, and put the second's figures in the timeline."""
        lag = self._lag(self.gate.status().processed)
        self.sample_lag(lag)
        self.sync.update(
            self.lifecycle.state, lag, self.drain_rate.value, self._query_position() is not None
        )
        # Only from restoring: a stop may have moved it meanwhile (under the engine's lock,
        # which this loop does not take).
        if self.sync.value and self._become(State.RUNNING, "", only_from=State.RESTORING):
            self.log.warning(
                "restored from %s and in sync after %.1f s (%s)",
                self._restored_from,
                time.monotonic() - self._restore_started,
                self.sync.describe(lag),
            )
        raised = self.priority.update(self.sync.value, self.gate.role == "active")
        if raised is not None:
            self.log.info("raised to the engines' CPU priority: %s", raised)
        self._look_at_standbys()
        if self.lifecycle.state not in (State.RUNNING, State.RESTORING, State.PERSISTING):
            return
        standing = Standing(self.sync.value, lag, self.agreement.eligible, self.sync.lag_s)
        self.election.publish_standing(standing)
        self.recent.lag(standing.lag)
        rate = self._events_per_s()
        if rate is not None:
            self.recent.rate(rate)

    def _look_at_standbys(self) -> None:
        """While active: which standbys could take over (their standings in ZooKeeper); a
        change between "some could" and "none could" is logged once."""
        active = self.gate.status().role == "active"
        before = self.redundancy.cover()
        try:
            standings = self.election.standings() if active else {}
        except Exception as exc:  # ZooKeeper away: the election's own listener says so
            self.log.debug(
                "standings unread (%r)",
                exc,
            )
            return
        cover = self.redundancy.update(active, standings)
        if cover is None:
            return
        if not cover.ready and (before is None or before.ready):
            self.log.error(
                "active with no standby that could take over (%s): "
                "the next failure stops the output",
                "; ".join(f"{e}: {why}" for e, why in sorted(cover.not_ready.items()))
                or "no other engine configured",
            )
        elif cover.ready and before is not None and not before.ready:
            self.log.warning(
                "standby %s could take over again",
                ", ".join(cover.ready),
            )

    def sample_lag(self, lag: int | None) -> None:
        """One sample of the lag's trend, while the query works: a stopped or recovering
        engine's lag grows with every inbound message, which says nothing about whether
        the engine keeps up (the gap in samples makes its trend unknown instead)."""
        if self.lifecycle.state in (State.RUNNING, State.RESTORING):
            self.lag_history.add(lag)

    def pipeline(self) -> PipelineInfo:
        status = self.gate.status()
        standing = self.standing(status.processed)
        lag, in_sync = standing.lag, standing.in_sync
        trend = self.lag_history.trend()
        fills = status.buffer_fills
        quarantined = self.quarantined()
        cover = self.redundancy.cover()
        self.meters.update(
            lag=lag,
            lag_s=self.sync.lag_s,
            buffer_fills=fills,
            buffer_bound=status.buffer_size,
            quarantined=len(quarantined),
            in_sync=in_sync,
            behind=self.sync.behind(lag),
            lag_growing=trend is not None and trend.growing,
        )
        self.meters.standbys(cover)
        self.meters.code(str(self.clients.version), self.code()[1])
        agreement = self.agreement.status()
        self.meters.agreement(
            state=agreement.state,
            eligible=self.agreement.eligible,
            agreed=agreement.ranges_agreed,
            unchecked=agreement.ranges_unchecked,
            msg_id=None if agreement.difference is None else agreement.difference.msg_id,
            digest_s=agreement.digest_s + self.published_digests.seconds,
        )
        return pipeline_info(
            self.lifecycle.state.value,
            self.lifecycle.reason,
            status,
            standing,
            trend,
            quarantined,
            events_per_s=self._events_per_s(),
            restored_from=self._restored_from,
            agreement=agreement,
            lag_s=self.sync.lag_s,
            cover=cover,
            read_up_to=self._query_position(),
            from_spare=self.from_spare,
        )

    def metrics(self) -> str:
        """Prometheus' text format."""
        self.pipeline()  # refreshes the gauges
        # The machine's spares only here: a file read every GET /pipeline (the page polls it
        # each second) would serve no one.
        self.meters.spares(self.from_spare, read_status(self.settings.spares_dir))
        return self.meters.render().decode()

    def timeline(self) -> TimelineInfo:
        return TimelineInfo.model_validate(self.recent.snapshot())

    def _lag(self, processed: dict[int, int]) -> int | None:
        """Inbound high watermarks minus the next offsets the query will read, over every
        partition."""
        read_up_to = self._query_position()
        if read_up_to is None and processed:
            read_up_to = {p: msg_id + 1 for p, msg_id in processed.items()}
        highs = self.watermarks.highs()
        if highs is None or read_up_to is None:
            return None
        return inbound_lag(highs, read_up_to)

    def _progress(self) -> dict[str, Any]:
        """The query's last progress report, re-read at most every 250 ms: each read is a
        py4j round trip and a JSON parse, and status polls must not slow the batches."""
        fetched_at, query, progress = self._progress_cache
        if query is self._query and time.monotonic() - fetched_at < 0.25:
            return progress
        query = self._query
        progress = (query.lastProgress if query is not None else None) or {}
        self._progress_cache = (time.monotonic(), query, progress)
        return progress

    def _events_per_s(self) -> float | None:
        return events_per_s(self._progress(), self.settings.inbound_topic)

    def _query_position(self) -> dict[int, int] | None:
        return query_position(self._progress(), self.settings.inbound_topic)
