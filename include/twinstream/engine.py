"""One Twinstream engine: the streaming query, the gate, the election and the admin API,
wired together. `spark_jobs/engine.py` is its command-line entry point."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, TopicPartition

import twinstream
from twinstream.admin_api import Conflict, PipelineInfo, ServerInfo
from twinstream.config import Settings
from twinstream.election import Election, root_acl, zk_client
from twinstream.gate import Gate
from twinstream.kafka import consumer_config
from twinstream.metrics import EngineMetrics
from twinstream.outbound import KafkaPublisher, LastPublishedReader
from twinstream.pipeline import rows_of, spark_conf, start_query

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, settings: Settings, engine_id: str) -> None:
        settings.engine_admin_port(engine_id)  # an unknown engine id fails here, by name
        self.settings = settings
        self.engine_id = engine_id
        self.metrics = EngineMetrics(engine_id, settings.pipeline)
        self.gate = Gate(engine_id, settings.pipeline, settings.num_buffered_msgs, self.metrics)
        self.zk = zk_client(settings)
        self.election = Election(
            self.zk,
            settings.election_path,
            settings.epoch_path,
            engine_id,
            on_elected=self._take_over,
            on_step_down=self._stepped_down,
            on_connection=self.gate.zk_connected,
            root_acl=root_acl(settings),
        )
        self._lock = threading.RLock()
        self._spark: SparkSession | None = None
        self._query: StreamingQuery | None = None
        self._state = "stopped"
        self._reason = "not started"
        self._hwm_consumer = Consumer(consumer_config(settings, f"twinstream-lag-{uuid.uuid4()}"))
        self._hwm: tuple[float, int | None] = (0.0, None)
        # Built ahead of a takeover, so that winning costs only the fence and the tail read.
        self._last_published = LastPublishedReader(settings)
        self._spare: KafkaPublisher | None = None
        self._prepare_publisher()

    # -- lifecycle ----------------------------------------------------------------------

    def start_pipeline(self) -> None:
        with self._lock:
            if self._state == "running":
                return
            if self._spark is None:
                self._spark = self._new_session()
            self._query = start_query(
                self._spark, self.settings, self.engine_id, self.process_batch
            )
            self._state, self._reason = "running", ""
            log.info(
                "engine %s pipeline %s: query %s started from %s",
                self.engine_id,
                self.settings.pipeline,
                self._query.name,
                self.settings.engine_dir(self.engine_id) / "checkpoint",
            )
            self.gate.joined()
            self.election.start()

    def stop_pipeline(self, reason: str = "stopped through the admin API") -> None:
        with self._lock:
            if self._state == "stopped":
                return
            # Leave the election first: a standby takes over while this query winds down.
            self.election.stop()
            self.gate.step_down(reason, rejoin=False)
            if self._query is not None:
                self._query.stop()
                self._query = None
            self._state, self._reason = "stopped", reason
            log.warning("engine %s pipeline %s: %s", self.engine_id, self.settings.pipeline, reason)

    def close(self) -> None:
        self.stop_pipeline("engine shutting down")
        self.zk.stop()
        self.zk.close()
        self._hwm_consumer.close()
        self._last_published.close()
        if self._spark is not None:
            self._spark.stop()

    def check_query(self) -> None:
        """Surface a query that died (it never stops on bad input; this is for bugs and
        infrastructure), so the admin API says why instead of claiming it runs."""
        with self._lock:
            query = self._query
            if query is None or query.isActive:
                return
            error = query.exception()
            self._query = None
            self.election.stop()
            self.gate.step_down("query failed", rejoin=False)
            self._state = "failed"
            self._reason = f"streaming query stopped: {error}"
            log.error(
                "engine %s pipeline %s: %s", self.engine_id, self.settings.pipeline, self._reason
            )

    def _new_session(self) -> SparkSession:
        from twinstream.spark import session

        return session(
            self.settings,
            f"twinstream-{self.settings.pipeline}-{self.engine_id}",
            conf={**spark_conf(self.settings), "spark.driver.memory": self.settings.engine_heap},
        )

    # -- the query's sink ---------------------------------------------------------------

    def process_batch(self, df: DataFrame, batch_id: int) -> None:
        rows = rows_of(df)
        published = self.gate.on_batch(batch_id, rows)
        log.debug(
            "engine %s pipeline %s: batch %s, %s rows, %s published, msg_id %s..%s",
            self.engine_id,
            self.settings.pipeline,
            batch_id,
            len(rows),
            published,
            rows[0].msg_id if rows else None,
            rows[-1].msg_id if rows else None,
        )

    # -- election callbacks -------------------------------------------------------------

    def _prepare_publisher(self) -> None:
        try:
            self._spare = KafkaPublisher(self.settings, self.engine_id)
        except Exception as exc:  # a takeover builds one itself
            log.warning("engine %s: could not prepare a publisher: %s", self.engine_id, exc)
            self._spare = None

    def _take_over(self, epoch: int) -> None:
        spare, self._spare = self._spare, None

        def fence() -> KafkaPublisher:
            return (spare or KafkaPublisher(self.settings, self.engine_id)).fence()

        try:
            self.gate.take_over(epoch, fence=fence, last_committed=self._last_published)
        finally:
            # A fenced or used producer can never serve a later takeover: build the next one.
            threading.Thread(target=self._prepare_publisher, daemon=True).start()

    def _stepped_down(self, reason: str) -> None:
        self.gate.step_down(reason, rejoin=self._state == "running")

    # -- status -------------------------------------------------------------------------

    def server_info(self) -> ServerInfo:
        status = self.gate.status()
        return ServerInfo(
            engine_id=self.engine_id,
            role=status.role,
            pid=os.getpid(),
            zk_state=self.election.zk_state,
            epoch=status.epoch,
            version=twinstream.__version__,
        )

    def pipeline_info(self) -> PipelineInfo:
        self.check_query()
        status = self.gate.status()
        lag = self._lag(status.last_msg_id_processed)
        self.metrics.buffer_fill.set(status.buffer_fill)
        if lag is not None:
            self.metrics.lag.set(lag)
        return PipelineInfo(
            state=self._state,
            reason=self._reason,
            last_msg_id_processed=status.last_msg_id_processed,
            last_msg_id_published=status.last_msg_id_published,
            lag=lag,
            buffer_fill=status.buffer_fill,
            buffer_size=status.buffer_size,
            in_sync=self._state == "running"
            and lag is not None
            and lag <= self.settings.in_sync_lag,
            uncovered_ranges=status.uncovered_ranges,
        )

    def metrics_text(self) -> bytes:
        self.pipeline_info()  # refreshes the gauges
        return self.metrics.render()

    def _lag(self, last_processed: int | None) -> int | None:
        """Inbound high watermark minus the next offset the query will read."""
        read_up_to = self._query_position()
        if read_up_to is None and last_processed is not None:
            read_up_to = last_processed + 1
        hwm = self._high_watermark()
        if hwm is None or read_up_to is None:
            return None
        return max(0, hwm - read_up_to)

    def _query_position(self) -> int | None:
        query = self._query
        progress: Any = query.lastProgress if query is not None else None
        if not progress:
            return None
        for source in progress.get("sources", []):
            end = source.get("endOffset") or {}
            partitions = end.get(self.settings.inbound_topic) if isinstance(end, dict) else None
            if partitions:
                return int(partitions.get("0", 0))
        return None

    def _high_watermark(self) -> int | None:
        fetched_at, value = self._hwm
        if time.monotonic() - fetched_at < 0.5:
            return value
        with self._lock:
            try:
                _, high = self._hwm_consumer.get_watermark_offsets(
                    TopicPartition(self.settings.inbound_topic, 0), timeout=2
                )
            except Exception as exc:
                log.warning(
                    "engine %s: inbound high watermark unavailable: %s", self.engine_id, exc
                )
                return None
        self._hwm = (time.monotonic(), int(high))
        return int(high)


class EngineControl:
    """Adapts Engine to the admin API's Control protocol (409 where a request does not fit)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def server_info(self) -> ServerInfo:
        return self.engine.server_info()

    def pipeline_info(self) -> PipelineInfo:
        return self.engine.pipeline_info()

    def start_pipeline(self) -> None:
        if self.engine.pipeline_info().state == "running":
            raise Conflict("the pipeline is already running")
        self.engine.start_pipeline()

    def stop_pipeline(self) -> None:
        if self.engine.pipeline_info().state != "running":
            raise Conflict("the pipeline is not running")
        self.engine.stop_pipeline()

    def metrics(self) -> bytes:
        return self.engine.metrics_text()
