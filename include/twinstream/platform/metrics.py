"""The Prometheus metrics every process of the platform serves at its GET /metrics: one
registry per process, every series labelled with who the process is. An engine's figures
are twinstream.engine.metrics, a publisher adapter's twinstream.edge.publisher_metrics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

# Prometheus' text format, as every /metrics of the platform answers it.
CONTENT_TYPE = "text/plain; version=0.0.4"


class Metrics:
    """One process's metrics in a registry of its own, every series labelled with who the
    process is (`labels`): an engine, a publisher adapter."""

    def __init__(self, labels: Mapping[str, str]) -> None:
        self.registry = CollectorRegistry()
        self._labels = dict(labels)

    def _counter(self, name: str, doc: str) -> Any:
        metric = Counter(name, doc, list(self._labels), registry=self.registry)
        return metric.labels(**self._labels)

    def _gauge(self, name: str, doc: str) -> Any:
        metric = Gauge(name, doc, list(self._labels), registry=self.registry)
        return metric.labels(**self._labels)

    def render(self) -> bytes:
        return generate_latest(self.registry)
