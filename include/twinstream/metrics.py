"""Prometheus metrics of one engine (served at GET /metrics of its admin API)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

ROLES = ("none", "standby", "active")


class EngineMetrics:
    def __init__(self, engine_id: str, pipeline: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"engine": engine_id, "pipeline": pipeline}
        self._labels = labels
        self._processed = self._counter("twinstream_rows_processed", "Output rows computed")
        self._published = self._counter(
            "twinstream_rows_published", "Output rows committed to Kafka"
        )
        self._takeovers = self._counter("twinstream_takeovers", "Times this engine became active")
        self._foreign_fences = self._counter(
            "twinstream_foreign_fences",
            "Times this engine, active, was fenced by a producer that is no engine",
        )
        self._uncovered = self._counter(
            "twinstream_uncovered_msgs",
            "Messages no buffer could cover at a takeover (missing from the output)",
        )
        self._role = Gauge(
            "twinstream_role",
            "1 for the engine's current role",
            [*labels, "role"],
            registry=self.registry,
        )
        self.buffer_fill = self._gauge("twinstream_buffer_fill", "Rows in the standby buffer")
        self.lag = self._gauge("twinstream_lag", "Inbound messages not yet processed")
        self._repaired = self._counter(
            "twinstream_repaired_msgs",
            "Messages no buffer covered at a takeover, recomputed and published",
        )
        self.quarantined = self._gauge(
            "twinstream_quarantined_offsets",
            "Inbound offsets in the pipeline's quarantine (published as dead letters)",
        )
        self._paused = self._gauge(
            "twinstream_paused",
            "1 while the query is paused for backpressure (rows held at max_buffered_msgs)",
        )

    def _counter(self, name: str, doc: str) -> Any:
        metric = Counter(name, doc, list(self._labels), registry=self.registry)
        return metric.labels(**self._labels)

    def _gauge(self, name: str, doc: str) -> Any:
        metric = Gauge(name, doc, list(self._labels), registry=self.registry)
        return metric.labels(**self._labels)

    def processed(self, rows: int) -> None:
        self._processed.inc(rows)

    def published(self, rows: int) -> None:
        self._published.inc(rows)

    def takeover(self) -> None:
        self._takeovers.inc()

    def foreign_fence(self) -> None:
        self._foreign_fences.inc()

    def uncovered(self, first: int, last: int) -> None:
        self._uncovered.inc(last - first + 1)

    def repaired(self, rows: int) -> None:
        self._repaired.inc(rows)

    def paused(self, paused: bool) -> None:
        self._paused.set(1 if paused else 0)

    def role(self, role: str) -> None:
        for name in ROLES:
            self._role.labels(**self._labels, role=name).set(1 if name == role else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
