"""Prometheus metrics of one publisher adapter, served at GET /metrics of its own small HTTP
server (`twinstream publish --source ... --metrics-port N`).

Guarantees:
- Every figure is read from the adapter's status (twinstream.edge.publisher.Status), the
  one `twinstream status` and the operator page show from its ZooKeeper node, at each
  scrape: an alert says what they say.
- A figure that is not known is absent, never a made-up 0: a standby's lag to its source's
  end, or an HTTP source's, has no sample (`twinstream_publisher_source_lag_bytes`).
- `GET /metrics` needs the engines' bearer token (`TWINSTREAM_ADMIN_TOKEN`), as an engine's
  does; `GET /healthz` answers anyone, for a container's health check.

As Prometheus rules over a pipeline's adapters (labels pipeline, adapter):

    sum by (pipeline) (twinstream_publisher_active) != 1          # none, or two, writing
    max by (pipeline) (twinstream_publisher_source_lag_bytes) > 1e8
    increase(twinstream_publisher_unreadable_lines_total[10m]) > 0
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

from prometheus_client import Counter, Gauge

from twinstream.platform.http import token_problem
from twinstream.platform.metrics import CONTENT_TYPE, Metrics

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
HEALTH_PATH = "/healthz"
# Why a line was not published as a record of its own (twinstream_publisher_unreadable_lines).
UNREADABLE = ("too_long", "not_utf8")


class Observed(Protocol):
    """What the metrics read of an adapter's status (twinstream.edge.publisher.Status)."""

    @property
    def role(self) -> str: ...
    @property
    def epoch(self) -> int | None: ...
    @property
    def published(self) -> int: ...
    @property
    def too_long(self) -> int: ...
    @property
    def not_utf8(self) -> int: ...
    @property
    def lost(self) -> Sequence[str]: ...
    @property
    def source_lag(self) -> int | None: ...


class PublisherMetrics(Metrics):
    def __init__(self, adapter_id: str, pipeline: str) -> None:
        super().__init__({"adapter": adapter_id, "pipeline": pipeline})
        self._active = self._gauge(
            "twinstream_publisher_active",
            "1 while this adapter is the elected one, the only one that writes the inbound topic",
        )
        self._epoch = self._gauge(
            "twinstream_publisher_epoch", "The election epoch this adapter last won (0: never)"
        )
        self._published = self._counter(
            "twinstream_publisher_published",
            "Source lines this adapter committed to the inbound topic",
        )
        # Labelled by hand: a series this adapter cannot know is removed, not set to 0.
        self._lag = Gauge(
            "twinstream_publisher_source_lag_bytes",
            "Bytes of the source beyond the last line published (the active adapter's; "
            "absent on a standby and for an HTTP source)",
            list(self._labels),
            registry=self.registry,
        )
        self._unreadable = Counter(
            "twinstream_publisher_unreadable_lines",
            "Source lines not published as read: too_long (over the limit, skipped and "
            "logged with their position), not_utf8 (published as they are, dead-lettered)",
            [*self._labels, "reason"],
            registry=self.registry,
        )
        for reason in UNREADABLE:
            self._unreadable.labels(**self._labels, reason=reason)
        self._lost = self._counter(
            "twinstream_publisher_lost",
            "Times lines of the source were found gone before they were read (a rotated "
            "file deleted, a standby's spool of standard input overrun): each a problem",
        )
        self._lock = threading.Lock()
        # The counters' values so far, as the status said them: a counter only adds.
        self._seen = {"published": 0, "too_long": 0, "not_utf8": 0, "lost": 0}

    def observe(self, status: Observed) -> None:
        """The figures as `status` says them now."""
        with self._lock:
            self._active.set(1 if status.role == "active" else 0)
            self._epoch.set(status.epoch or 0)
            now = {
                "published": status.published,
                "too_long": status.too_long,
                "not_utf8": status.not_utf8,
                "lost": len(status.lost),
            }
            grown = {k: max(0, v - self._seen[k]) for k, v in now.items()}
            self._seen = {k: max(v, self._seen[k]) for k, v in now.items()}
            self._published.inc(grown["published"])
            for reason in UNREADABLE:
                self._unreadable.labels(**self._labels, reason=reason).inc(grown[reason])
            self._lost.inc(grown["lost"])
            if status.source_lag is None:
                with contextlib.suppress(KeyError):
                    self._lag.remove(*self._labels.values())
            else:
                self._lag.labels(**self._labels).set(status.source_lag)

    def page(self, status: Observed) -> bytes:
        self.observe(status)
        return self.render()


class MetricsServer:
    """GET /metrics (with the bearer token) and GET /healthz on `host`:`port` (0: any free
    port, `port` says which), on a thread of its own."""

    def __init__(self, host: str, port: int, token: str, page: Callable[[], bytes]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == HEALTH_PATH:
                    self._answer(200, b"ok\n", "text/plain")
                    return
                # The token before anything else: a stranger learns nothing, not even
                # which paths exist.
                problem = token_problem(self.headers.get("Authorization"), token)
                if problem is not None:
                    self._answer(401, f"{problem}\n".encode(), "text/plain", bearer=True)
                elif path != METRICS_PATH:
                    self._answer(404, f"no {path}: GET {METRICS_PATH}\n".encode(), "text/plain")
                else:
                    self._answer(200, page(), CONTENT_TYPE)

            def _answer(self, status: int, body: bytes, kind: str, bearer: bool = False) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", kind)
                    self.send_header("Content-Length", str(len(body)))
                    if bearer:
                        self.send_header("WWW-Authenticate", "Bearer")
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    log.debug("metrics: a scraper left before its answer")

            def log_message(self, format: str, *args: object) -> None:
                log.debug("metrics: %s", format % args)

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="publisher-metrics", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
