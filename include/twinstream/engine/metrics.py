"""Prometheus metrics of one engine (served at GET /metrics of its admin API).

Guarantee: every figure the operator's view judges a pipeline by is here too, so that an
alert can say what `twinstream status` says. A pipeline is falling behind (its problem in
the overview) when no engine is in sync while one is behind, or when an engine's lag grows
over a window (twinstream.engine.lag_trend); as Prometheus rules over every engine of a pipeline:

    max by (pipeline) (twinstream_in_sync) == 0 and max by (pipeline) (twinstream_behind) == 1
    max by (pipeline) (twinstream_lag_growing) == 1

A pipeline whose next failure would stop its output (its active has no standby that could
take over: down, behind, or barred by a disagreement) says so on its active:

    max by (pipeline) (twinstream_unprotected) == 1

An engine that runs other code than its pipeline's files hold (changed since it started):

    max by (pipeline, engine) (twinstream_code_stale) == 1

A machine with no warm spare left, so that its next lost engine starts cold (each engine
there reports its machine's spares; `engine_from_spare` says whether it was one):

    max by (instance) (twinstream_spares{status="warm"}) == 0
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import Gauge

from twinstream.platform.metrics import Metrics

if TYPE_CHECKING:
    from twinstream.engine.readiness import Cover

AGREEMENT_STATES = ("agrees", "disagrees", "unchecked", "shadow")
# A spare's states as its keeper reports them (twinstream.engine.spare.SpareState's values).
SPARE_STATUSES = ("warming", "warm", "offered", "adopted")
ROLES = ("none", "standby", "active")


class EngineMetrics(Metrics):
    def __init__(self, engine_id: str, pipeline: str) -> None:
        super().__init__({"engine": engine_id, "pipeline": pipeline})
        labels = self._labels
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
        self.buffer_fill = self._gauge(
            "twinstream_buffer_fill", "Rows in the buffer, over every inbound partition"
        )
        self._partition_fill = Gauge(
            "twinstream_partition_buffer_fill",
            "Rows in one inbound partition's buffer (bounded by twinstream_buffer_bound)",
            [*labels, "partition"],
            registry=self.registry,
        )
        self._buffer_bound = self._gauge(
            "twinstream_buffer_bound",
            "Rows each inbound partition's buffer keeps at least (num_buffered_msgs)",
        )
        self.lag = self._gauge("twinstream_lag", "Inbound messages not yet processed")
        self._lag_seconds = self._gauge(
            "twinstream_lag_seconds",
            "The lag in seconds of the engine's own measured rate (absent until measured)",
        )
        self._in_sync = self._gauge(
            "twinstream_in_sync",
            "1 while the engine is in sync (it would reach the inbound head within in_sync_s)",
        )
        self._behind = self._gauge(
            "twinstream_behind", "1 while the engine's lag is known and above the in-sync bound"
        )
        self._unprotected = self._gauge(
            "twinstream_unprotected",
            "1 while this engine is active and no standby could take over from it",
        )
        self._unprotected_seconds = self._gauge(
            "twinstream_unprotected_seconds",
            "How long this active engine has had no standby that could take over (0: one could)",
        )
        self._ready_standbys = self._gauge(
            "twinstream_ready_standbys",
            "On the active: the standbys that could take over now (in sync, allowed to lead)",
        )
        self._lag_growing = self._gauge(
            "twinstream_lag_growing",
            "1 while the engine's lag has grown through the last minute (falling behind)",
        )
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
        self._agreement = Gauge(
            "twinstream_agreement",
            "1 for the engine's agreement with the active's output (agrees, disagrees, "
            "unchecked, shadow: the active runs other code): twinstream.core.agreement",
            [*labels, "state"],
            registry=self.registry,
        )
        self._eligible = self._gauge(
            "twinstream_eligible", "1 while the engine may lead (0: it disagrees, not overridden)"
        )
        self._ranges = Gauge(
            "twinstream_agreement_ranges",
            "The active's published ranges this engine compared equal (agreed) or could not "
            "compare (unchecked)",
            [*labels, "result"],
            registry=self.registry,
        )
        self._disagreement_msg_id = self._gauge(
            "twinstream_disagreement_msg_id",
            "The first msg_id where this engine's rows differ from the published ones (-1: none)",
        )
        self._batch_seconds = self._counter(
            "twinstream_batch_seconds",
            "Seconds the query's batches spent in the engine's sink (the batch's Spark job, "
            "its rows' transfer and the gate): what the agreement check's cost is measured against",
        )
        self._version = Gauge(
            "twinstream_pipeline_version_info",
            "1, labelled with the version of the pipeline's code this engine runs (declared "
            "version+code digest: twinstream.platform.versions)",
            [*labels, "version"],
            registry=self.registry,
        )
        self._stale = self._gauge(
            "twinstream_code_stale",
            "1 while the pipeline's code on disk differs from the code this engine runs",
        )
        self._from_spare = self._gauge(
            "twinstream_engine_from_spare",
            "1 when this engine's process was a warm spare that became it "
            "(twinstream.engine.spare), 0 when it started cold",
        )
        self._spares = Gauge(
            "twinstream_spares",
            "This machine's spares by status, as its keeper last wrote them (none while no "
            "keeper runs: TWINSTREAM_SPARES=0, or a Spark master that is not local)",
            [*labels, "status"],
            registry=self.registry,
        )
        self._digest_seconds = self._gauge(
            "twinstream_digest_seconds",
            "Seconds spent digesting output rows for the agreement check, since the start",
        )

    def spares(self, from_spare: bool, keeper: Sequence[Mapping[str, Any]] | None) -> None:
        """Whether this engine was a spare, and its machine's spares by status (`keeper`:
        twinstream.engine.spare_keeper.read_status's rows; None: no keeper runs)."""
        self._from_spare.set(1 if from_spare else 0)
        counts = Counter(str(row.get("status")) for row in keeper or ())
        for status in SPARE_STATUSES:
            self._spares.labels(**self._labels, status=status).set(counts.get(status, 0))

    def batch(self, seconds: float) -> None:
        self._batch_seconds.inc(seconds)

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

    def update(
        self,
        *,
        lag: int | None,
        lag_s: float | None = None,
        buffer_fills: Mapping[int, int],
        buffer_bound: int,
        quarantined: int,
        in_sync: bool,
        behind: bool,
        lag_growing: bool,
    ) -> None:
        """The gauges of one status read. An unknown lag leaves twinstream_lag at its last
        value (a scrape never reads a made-up 0), and twinstream_behind at 0."""
        if lag is not None:
            self.lag.set(lag)
        if lag_s is not None:
            self._lag_seconds.set(lag_s)
        self.buffer_fill.set(sum(buffer_fills.values()))
        for partition, fill in buffer_fills.items():
            self._partition_fill.labels(**self._labels, partition=str(partition)).set(fill)
        self._buffer_bound.set(buffer_bound)
        self.quarantined.set(quarantined)
        self._in_sync.set(1 if in_sync else 0)
        self._behind.set(1 if behind else 0)
        self._lag_growing.set(1 if lag_growing else 0)

    def agreement(
        self,
        *,
        state: str,
        eligible: bool,
        agreed: int,
        unchecked: int,
        msg_id: int | None,
        digest_s: float,
    ) -> None:
        for name in AGREEMENT_STATES:
            self._agreement.labels(**self._labels, state=name).set(1 if name == state else 0)
        self._eligible.set(1 if eligible else 0)
        self._ranges.labels(**self._labels, result="agreed").set(agreed)
        self._ranges.labels(**self._labels, result="unchecked").set(unchecked)
        self._disagreement_msg_id.set(-1 if msg_id is None else msg_id)
        self._digest_seconds.set(digest_s)

    def standbys(self, cover: Cover | None, now: float | None = None) -> None:
        """The active's view of its standbys; a standby (None) is never unprotected."""
        seconds = (
            None if cover is None else cover.unprotected_s(time.time() if now is None else now)
        )
        self._unprotected.set(0 if seconds is None else 1)
        self._unprotected_seconds.set(seconds or 0.0)
        self._ready_standbys.set(0 if cover is None else len(cover.ready))

    def code(self, version: str, stale: bool) -> None:
        self._version.labels(**self._labels, version=version).set(1)
        self._stale.set(1 if stale else 0)

    def role(self, role: str) -> None:
        for name in ROLES:
            self._role.labels(**self._labels, role=name).set(1 if name == role else 0)
