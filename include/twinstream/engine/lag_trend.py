"""Whether an engine is falling behind, not merely behind: the trend of its lag.

Guarantee: `LagHistory.trend()` says `growing` only when the lag rose through a whole
window of WINDOW_S seconds: the median lag of each quarter of the window above the one
before, and even the lowest sample of the newest quarter at least MIN_GROWTH above the
highest of the oldest. A burst the engine absorbs (the lag jumps, then falls back), a
backlog it drains, and the sawtooth of large micro-batches (the lag swings by a batch
between triggers) never count. Too little history (a restart, a pause in sampling that
leaves a quarter without a sample) gives no trend at all: unknown is never "growing".

The samples come from the engine's main loop once a second and from status reads, kept at
most one per SAMPLE_EVERY_S, so that a minute holds about 30.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable

from twinstream.engine.api import LagTrend

# The window the trend is judged over: long enough that a burst the pair absorbs within
# it (seconds, at the rates of docs/benchmarks.md) rises and falls inside it, short enough
# that an operator hears of a pair that cannot keep up within a minute or so.
WINDOW_S = 60.0
SAMPLE_EVERY_S = 2.0
# Messages the lag must have grown by, floor to floor, before it is news: below that a
# pair keeps up in practice, and a lag that keeps rising slowly ends "not in sync" anyway.
MIN_GROWTH = 1_000
QUARTERS = 4


class LagHistory:
    """An engine's recent lag samples (thread-safe: the main loop and the admin API's
    threads both add)."""

    def __init__(
        self,
        window_s: float = WINDOW_S,
        every_s: float = SAMPLE_EVERY_S,
        min_growth: int = MIN_GROWTH,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self.every_s = every_s
        self.min_growth = min_growth
        self._clock = clock
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, int]] = deque()

    def due(self) -> bool:
        """Whether a sample taken now would be kept: a caller whose lag costs a Kafka read
        asks first, instead of reading it to have it dropped."""
        with self._lock:
            return not self._samples or self._clock() - self._samples[-1][0] >= self.every_s

    def add(self, lag: int | None) -> None:
        """Record the lag now; an unknown lag records nothing (it leaves a hole, which
        makes the trend unknown rather than wrong)."""
        if lag is None:
            return
        now = self._clock()
        with self._lock:
            if self._samples and now - self._samples[-1][0] < self.every_s:
                return
            self._samples.append((now, lag))
            self._forget(now)

    def clear(self) -> None:
        """Forget every sample: the query restarts from elsewhere (a restore)."""
        with self._lock:
            self._samples.clear()

    def _forget(self, now: float) -> None:
        while self._samples and self._samples[0][0] < now - self.window_s:
            self._samples.popleft()

    def trend(self) -> LagTrend | None:
        """The lag's trend over the last window; None while some quarter of it has no
        sample."""
        now = self._clock()
        with self._lock:
            self._forget(now)
            samples = list(self._samples)
        start = now - self.window_s
        quarters: list[list[int]] = [[] for _ in range(QUARTERS)]
        for at, lag in samples:
            index = min(QUARTERS - 1, int((at - start) / self.window_s * QUARTERS))
            quarters[index].append(lag)
        if not all(quarters):
            return None
        medians = [int(statistics.median_low(q)) for q in quarters]
        rising = all(a < b for a, b in itertools.pairwise(medians))
        growing = rising and min(quarters[-1]) - max(quarters[0]) >= self.min_growth
        return LagTrend(
            window_s=self.window_s,
            first=samples[0][1],
            last=samples[-1][1],
            quarters=medians,
            growing=growing,
        )
