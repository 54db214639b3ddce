"""Prometheus metrics of one engine (served at GET /metrics of its admin API)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

ROLES = ("none", "standby", "active")


class EngineMetrics:
    def __init__(self, engine_id: str, pipeline: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"engine": engine_id, "pipeline": pipeline}
        self._labels = labels
        self._processed = Counter(
            "twinstream_rows_processed",
            "Output rows computed",
            list(labels),
            registry=self.registry,
        ).labels(**labels)
        self._published = Counter(
            "twinstream_rows_published",
            "Output rows committed to Kafka",
            list(labels),
            registry=self.registry,
        ).labels(**labels)
        self._takeovers = Counter(
            "twinstream_takeovers",
            "Times this engine became active",
            list(labels),
            registry=self.registry,
        ).labels(**labels)
        self._uncovered = Counter(
            "twinstream_uncovered_msgs",
            "Messages no buffer could cover at a takeover (missing from the output)",
            list(labels),
            registry=self.registry,
        ).labels(**labels)
        self._role = Gauge(
            "twinstream_role",
            "1 for the engine's current role",
            [*labels, "role"],
            registry=self.registry,
        )
        self.buffer_fill = Gauge(
            "twinstream_buffer_fill",
            "Rows in the standby buffer",
            list(labels),
            registry=self.registry,
        ).labels(**labels)
        self.lag = Gauge(
            "twinstream_lag",
            "Inbound messages not yet processed",
            list(labels),
            registry=self.registry,
        ).labels(**labels)

    def processed(self, rows: int) -> None:
        self._processed.inc(rows)

    def published(self, rows: int) -> None:
        self._published.inc(rows)

    def takeover(self) -> None:
        self._takeovers.inc()

    def uncovered(self, first: int, last: int) -> None:
        self._uncovered.inc(last - first + 1)

    def role(self, role: str) -> None:
        for name in ROLES:
            self._role.labels(**self._labels, role=name).set(1 if name == role else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
