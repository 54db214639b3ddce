"""How many inbound records a micro-batch may take: small when the engine is level with the
head, large only while it catches up, and never more than `max_batch_s` of work.

Guarantee: `next_batch(available, limit)` is what a batch takes: all that arrived since the
last one when that is under the limit (an engine level with the head runs small batches,
so its output follows its input within a trigger and a batch), else the limit.
`batch_limit` sizes the limit in time, not records: the records this engine processes in
`max_batch_s` at the rate it measured (`DrainRate`), within [floor, ceiling]. So a catch-up
batch lasts about `max_batch_s` on a fast machine and a slow one alike, and a takeover, a
persist or a stop never waits behind a 10-second batch; yet a batch is large enough that
its fixed cost (~0.6 s) stays a small part of it. Spark applies the limit as the Kafka
source's maxOffsetsPerTrigger, fixed for a query's life (`MicroBatchExecution` reads the
source's read limit once): each query start (the engine's start, a restore, a recovery,
a repair's rewind) sizes it afresh from the rate measured so far.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def next_batch(available: int, limit: int) -> int:
    """The records the next batch takes when `available` wait in Kafka (Spark's rule for
    maxOffsetsPerTrigger, stated here so the sizing below can be reasoned about)."""
    return max(0, min(available, limit))


def batch_limit(records_per_s: float | None, max_batch_s: float, floor: int, ceiling: int) -> int:
    """A catch-up batch's size: `max_batch_s` worth at the measured rate, within [floor,
    ceiling]; the ceiling when nothing was measured yet (the configured bound)."""
    if records_per_s is None or not math.isfinite(records_per_s) or records_per_s <= 0:
        return ceiling
    return max(min(floor, ceiling), min(ceiling, int(records_per_s * max_batch_s)))


class DrainRate:
    """The records a second this engine's batches process when it catches up, from its
    progress reports: the input rows of each full batch (at least FULL of the query's limit,
    and MIN_ROWS) over the batch's whole duration (its fixed cost included), smoothed. Kept
    in the engine's state folder, so that a restarted engine sizes its catch-up batches from
    what it measured before.

    Only full batches count: a level engine's batches of a few hundred or thousand records
    are mostly fixed cost, and their rate (1,221 records/s measured on `make up`) sized a
    restarted engine's catch-up batches at 3,663 records, which drained its backlog against
    a 1,000 events/s inflow in 274 s instead of about a minute."""

    FULL = 0.9
    MIN_ROWS = 1_000
    # The weight of a new batch's rate: about the last ten batches count.
    ALPHA = 0.2

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.value: float | None = None
        self._seen: Any = None
        if path is not None and path.exists():
            try:
                self.value = float(json.loads(path.read_text())["records_per_s"])
            except (ValueError, KeyError, TypeError, OSError) as exc:
                log.warning("drain rate in %s unreadable (%s); measuring afresh", path, exc)

    def add(self, progress: Mapping[str, Any], limit: int) -> None:
        """One progress report (the same report at every call until the next batch) of a
        query whose batches take at most `limit` records."""
        batch = progress.get("batchId")
        if batch is None or batch == self._seen:
            return
        self._seen = batch
        rows = float(progress.get("numInputRows") or 0)
        total_ms = float((progress.get("durationMs") or {}).get("triggerExecution") or 0)
        if rows < max(self.MIN_ROWS, self.FULL * limit) or total_ms <= 0:
            return
        rate = rows / (total_ms / 1000.0)
        self.value = (
            rate if self.value is None else (1 - self.ALPHA) * self.value + (self.ALPHA * rate)
        )

    def save(self) -> None:
        if self.path is None or self.value is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_suffix(".tmp")
            temporary.write_text(json.dumps({"records_per_s": round(self.value, 1)}))
            temporary.replace(self.path)
        except OSError as exc:  # a report for the next start; the engine goes on
            log.warning("drain rate not saved to %s (%s)", self.path, exc)
