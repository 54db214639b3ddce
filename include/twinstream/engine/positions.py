"""Where an engine stands on its inbound topic: Kafka's log start and high watermark of each
partition, the offsets at a time, and the query's own position and rate from its progress
reports. Positions are partition -> offset.

Guarantee: every answer is Kafka's or Spark's own; a broker that cannot answer gives None
(the lag is then unknown, never guessed), and the watermark consumer is replaced after a
failure, because an idle consumer can keep a partition "unknown" long after its broker is
back. Status reads are cached (0.5 s) so that polling never slows the batches.
"""

from __future__ import annotations

import json
import logging
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from twinstream.core.logs import EngineLog
from twinstream.platform.connections import KafkaConnection, PipelineTopics

log = logging.getLogger(__name__)


def _offsets(value: Any, topic: str) -> dict[int, int] | None:
    """Each partition's offset in a source's start or end offset (JSON text in PySpark 4, a
    dict before 4.0)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    partitions = value.get(topic) if isinstance(value, dict) else None
    return {int(p): int(o) for p, o in partitions.items()} if partitions else None


def query_position(progress: Mapping[str, Any], topic: str) -> dict[int, int] | None:
    """The next inbound offset of each partition the query will read, from its last
    progress report; None before the first report. PySpark 4 gives a source's endOffset as
    a JSON string (before 4.0 it was a dict): reading only the dict form found no position
    at all, ever."""
    for source in progress.get("sources") or []:
        end = _offsets(source.get("endOffset"), topic)
        if end is not None:
            return end
    return None


def lag(high_watermarks: Mapping[int, int], read_up_to: Mapping[int, int]) -> int:
    """Inbound records not read yet, over every partition (one the query has not read
    from yet counts whole)."""
    return sum(max(0, hwm - read_up_to.get(p, 0)) for p, hwm in high_watermarks.items())


def events_per_s(progress: Mapping[str, Any], topic: str) -> float | None:
    """Inbound records the last batch consumed, per second of it. From the source's offsets,
    not Spark's processedRowsPerSecond: a `transform` pipeline's plan reads its one source in
    two branches (the transform's and the dead letters'), and Spark counts every record
    twice (a Keyed pipeline's reads it once)."""
    duration_ms = (progress.get("durationMs") or {}).get("triggerExecution")
    for source in progress.get("sources") or []:
        start = _offsets(source.get("startOffset"), topic) or {}
        end = _offsets(source.get("endOffset"), topic)
        if end is not None and duration_ms:
            records = sum(o - start.get(p, 0) for p, o in end.items())
            return round(records / (float(duration_ms) / 1000), 1)
    return None


class InboundWatermarks:
    """The inbound partitions' log starts and high watermarks, through one consumer that
    never subscribes (it only asks for offsets)."""

    def __init__(
        self,
        kafka: KafkaConnection,
        topics: PipelineTopics,
        engine_id: str,
        consumer: Callable[[dict[str, Any]], Any] = Consumer,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kafka = kafka
        self.topics = topics
        self.engine_id = engine_id
        self._log = EngineLog(log, engine_id, topics.pipeline)
        self._new_consumer = consumer
        self._clock = clock
        self._lock = threading.Lock()
        self.consumer = consumer(self._config())
        self._high: tuple[float, dict[int, int] | None] = (-1.0, None)
        # Read once: a partition added later would need every engine restarted anyway.
        self._partition_ids: list[int] | None = None

    def _config(self) -> dict[str, Any]:
        return self.kafka.consumer(f"twinstream-lag-{uuid.uuid4()}")

    def partitions(self, timeout_s: float = 10) -> list[int]:
        """The inbound topic's partitions; raises when Kafka does not answer."""
        if self._partition_ids is None:
            topic = self.topics.inbound
            meta = self.consumer.list_topics(topic, timeout=timeout_s).topics[topic]
            if meta.error is not None or not meta.partitions:
                raise RuntimeError(f"no metadata for topic {topic}: {meta.error}")
            self._partition_ids = sorted(meta.partitions)
        return self._partition_ids

    def _tp(self, partition: int, timestamp_ms: int | None = None) -> TopicPartition:
        if timestamp_ms is None:
            return TopicPartition(self.topics.inbound, partition)
        return TopicPartition(self.topics.inbound, partition, timestamp_ms)

    def log_starts(self) -> dict[int, int]:
        """Kafka's first inbound offset of each partition; raises when Kafka does not
        answer."""
        with self._lock:
            return {
                p: int(self.consumer.get_watermark_offsets(self._tp(p), timeout=10)[0])
                for p in self.partitions()
            }

    def offsets_at(self, timestamp_ms: int) -> dict[int, int]:
        """Each partition's first inbound offset at or after the time (the end of its log
        if none is)."""
        with self._lock:
            partitions = self.partitions()
            found = self.consumer.offsets_for_times(
                [self._tp(p, timestamp_ms) for p in partitions], timeout=10
            )
            offsets = {}
            for tp in found:
                if tp.offset >= 0:
                    offsets[tp.partition] = int(tp.offset)
                else:
                    _, high = self.consumer.get_watermark_offsets(self._tp(tp.partition), 10)
                    offsets[tp.partition] = int(high)
        return offsets

    def highs(self, max_age_s: float = 0.5) -> dict[int, int] | None:
        """The high watermark of each partition, at most `max_age_s` old; None when Kafka
        does not answer."""
        fetched_at, value = self._high
        if fetched_at >= 0 and self._clock() - fetched_at < max_age_s:
            return value
        with self._lock:
            try:
                highs = {
                    p: int(self.consumer.get_watermark_offsets(self._tp(p), timeout=2)[1])
                    for p in self.partitions(timeout_s=2)
                }
            except Exception as exc:
                self._log.warning(
                    "inbound high watermark unavailable: %s; asking again with a new consumer",
                    exc,
                )
                # Seen after a broker was killed and came back: this idle consumer kept
                # the partition as unknown ("Local: Unknown partition") for minutes, so the
                # lag stayed unknown and the engine never counted as in sync again. A new
                # consumer fetches the cluster's metadata afresh.
                old, self.consumer = self.consumer, self._new_consumer(self._config())
                old.close()
                # Once per cache period, not once per status read.
                self._high = (self._clock(), None)
                return None
        self._high = (self._clock(), highs)
        return highs

    def close(self) -> None:
        self.consumer.close()


# The parts of a micro-batch Spark times (StreamingQueryProgress.durationMs), in the order
# it runs them.
BATCH_PARTS = ("latestOffset", "walCommit", "queryPlanning", "addBatch", "commitOffsets")


class BatchTimings:
    """Where a query's micro-batches spend their time, from the progress reports the engine
    reads anyway (a sample: the main loop looks once a second, at most one report per
    batch). `summary` gives the medians since the last summary, for one log line a minute:
    the profile of a running engine without a profiler."""

    def __init__(self) -> None:
        self._seen: Any = None
        self._samples: list[dict[str, float]] = []
        self._sink: list[tuple[float, float]] = []

    def sink(self, collect_ms: float, gate_ms: float) -> None:
        """Time the sink spent in one batch: the batch's Spark job with its transfer to the
        driver, then the gate (publishing, on the active). Called for every batch."""
        self._sink.append((collect_ms, gate_ms))

    def add(self, progress: Mapping[str, Any]) -> None:
        batch = progress.get("batchId")
        if batch is None or batch == self._seen:
            return
        self._seen = batch
        durations = progress.get("durationMs") or {}
        sample = {part: float(durations.get(part, 0)) for part in BATCH_PARTS}
        sample["total"] = float(durations.get("triggerExecution", 0))
        sample["rows"] = float(progress.get("numInputRows") or 0)
        sample["stateCommit"] = float(
            sum(op.get("commitTimeMs", 0) for op in progress.get("stateOperators") or [])
        )
        self._samples.append(sample)

    def summary(self) -> str | None:
        """'n batches sampled: total 812 ms (latestOffset 3, ..., stateCommit 640), 2,300
        rows' as medians; None without a sample since the last summary."""
        samples, self._samples = self._samples, []
        sink, self._sink = self._sink, []
        if not samples:
            return None

        def median(key: str) -> float:
            return statistics.median_low(s[key] for s in samples)

        parts = ", ".join(f"{p} {median(p):.0f}" for p in (*BATCH_PARTS, "stateCommit"))
        line = (
            f"{len(samples)} batches sampled, medians: {median('total'):.0f} ms ({parts}), "
            f"{median('rows'):,.0f} input rows"
        )
        if sink:
            job = statistics.median_low(c for c, _ in sink)
            gate = statistics.median_low(g for _, g in sink)
            line += f"; in addBatch, of {len(sink)} batches: job {job:.0f} ms, gate {gate:.0f} ms"
        return line
