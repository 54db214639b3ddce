"""When each inbound record arrived, for the end-to-end latency an engine reports of its
own output (twinstream.engine.timeline, the operator page's chart).

Guarantee: `latencies(rows, now)` gives, for each published row whose offset the samples
bracket, `now` minus the time its offset passed the inbound high watermark, linearly
interpolated between the two samples around it: so within one sampling interval (0.5 s) of
the record's append to Kafka, without reading a record's timestamp or adding a column to the
plan. A row older than the samples kept (`keep_s`) or newer than the last one has no
latency: it is left out, never guessed. Memory is bounded by `keep_s` / the interval.

Thread-safe: the sampler thread adds, Spark's foreachBatch thread (the gate's commit) reads.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

import numpy as np
import numpy.typing as npt

from twinstream.core.rows import Output

log = logging.getLogger(__name__)


class Arrivals:
    def __init__(self, keep_s: float = 600.0, every_s: float = 0.5) -> None:
        self.every_s = every_s
        self._lock = threading.Lock()
        size = int(keep_s / every_s) + 1
        # Per partition: (wall time, high watermark) samples, oldest first.
        self._samples: dict[int, collections.deque[tuple[float, int]]] = collections.defaultdict(
            lambda: collections.deque(maxlen=size)
        )

    def sample(self, highs: Mapping[int, int], at: float) -> None:
        with self._lock:
            for partition, high in highs.items():
                samples = self._samples[partition]
                # Only changes matter (and the sample just before one): an idle partition
                # keeps its last two, so a record after a quiet hour still gets a time.
                if len(samples) >= 2 and samples[-1][1] == high and samples[-2][1] == high:
                    samples[-1] = (at, high)
                else:
                    samples.append((at, high))

    def latencies(self, rows: Iterable[Output], now: float) -> npt.NDArray[np.float64]:
        """Seconds from arrival to `now` of each row's record the samples bracket."""
        offsets: dict[int, list[int]] = collections.defaultdict(list)
        for row in rows:
            offsets[row.partition].append(row.msg_id)
        found: list[npt.NDArray[np.float64]] = []
        for partition, wanted in offsets.items():
            with self._lock:
                samples = list(self._samples.get(partition, ()))
            if len(samples) < 2:
                continue
            times = np.fromiter((t for t, _ in samples), dtype=np.float64, count=len(samples))
            highs = np.fromiter((h for _, h in samples), dtype=np.float64, count=len(samples))
            at = np.asarray(wanted, dtype=np.float64)
            # An offset o is in the log once the high watermark exceeds it: it arrived
            # between the last sample with high <= o and the first with high > o.
            after = np.searchsorted(highs, at, side="right")
            known = (after > 0) & (after < len(highs))
            if not known.any():
                continue
            j = after[known]
            h0, h1 = highs[j - 1], highs[j]
            t0, t1 = times[j - 1], times[j]
            share = (at[known] - h0 + 1) / np.maximum(h1 - h0, 1)
            arrived = t0 + np.clip(share, 0.0, 1.0) * (t1 - t0)
            found.append(now - arrived)
        if not found:
            return np.empty(0, dtype=np.float64)
        return np.concatenate(found)


class ArrivalSampler(threading.Thread):
    """Samples `highs()` into `arrivals` every `arrivals.every_s` until stopped."""

    def __init__(
        self,
        arrivals: Arrivals,
        highs: Callable[[], Mapping[int, int] | None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(name="arrivals", daemon=True)
        self.arrivals = arrivals
        self._highs = highs
        self._clock = clock
        self._halt = threading.Event()

    # After a failed read the sampler waits longer each time, up to this: Kafka that does
    # not answer (starting, a broker down) gets no read 5 times a second, nor the engine's
    # log a line each time.
    MAX_BACKOFF_S = 10.0

    def run(self) -> None:
        wait = self.arrivals.every_s
        while not self._halt.wait(wait):
            try:
                highs = self._highs()
            except Exception as exc:  # the next sample retries; latency is a report only
                log.debug("arrivals: no high watermark (%r)", exc)
                highs = None
            if highs is None:
                wait = min(self.MAX_BACKOFF_S, wait * 2)
                continue
            wait = self.arrivals.every_s
            self.arrivals.sample(highs, self._clock())

    def stop(self) -> None:
        self._halt.set()
