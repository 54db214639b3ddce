"""The last 15 minutes of one engine's own figures, for the operator page's chart and
`twinstream status --watch`'s sparklines.

Guarantee: `Timeline.snapshot()` gives, for every `step_s` bucket of the last `window_s`
seconds in which the engine reported anything, the exact p50 and p99 of the end-to-end
latencies of the records published in it (the smallest latency that at least 50 % / 99 %
of them do not exceed: a latency a record really had, never an interpolation), as long as
the bucket held at most MAX_SAMPLES records (13,000 records/s at 5 s buckets). Above that
the bucket keeps a uniform random sample of MAX_SAMPLES/2 to MAX_SAMPLES of them, each
record with the same chance, and its quantiles are the sample's; `published` always
counts every record. A report more than a bucket late, into a bucket already summarised,
counts in `published` but not in its quantiles. Nothing older than the window is kept: the
memory is bounded by the window whatever the rate.

Cost: a call is a lock, a dictionary look-up and, for `published`, one numpy array
appended to the open bucket (no object per record); a bucket's quantiles are computed once,
when the next bucket opens, and the open bucket's at each snapshot.

Thread-safe: one lock, for Spark's foreachBatch thread (`published`), the engine's main
loop (`rate`, `lag`, `takeover`) and the admin API's threads (`snapshot`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, Field, ValidationError

from twinstream.platform.settings import Connections

if TYPE_CHECKING:
    from twinstream.engine.api import TimelineInfo
    from twinstream.engine.client import EngineClient

log = logging.getLogger(__name__)

WINDOW_S = 900.0
STEP_S = 5.0
# The most latencies a bucket keeps: 512 KB of float64 in the open bucket; a summarised
# bucket keeps its two quantiles only.
MAX_SAMPLES = 65_536
QUANTILES = (0.5, 0.99)


@dataclass
class _Bucket:
    # The latencies kept, as the arrays the calls gave (concatenated when summarised).
    samples: list[npt.NDArray[np.float64]] = field(default_factory=list)
    kept: int = 0
    # The chance each published record of the bucket had to be kept (1.0: all of them).
    keep: float = 1.0
    published: int = 0
    # (p50, p99) once summarised; the samples are then dropped.
    summary: tuple[float, float] | None = None
    rate_sum: float = 0.0
    rate_n: int = 0
    lag: int | None = None


def _quantiles(values: npt.NDArray[np.float64]) -> tuple[float, float]:
    # inverted_cdf: the smallest value with at least q of the values at or below it, a
    # latency some record had (the default, linear, would interpolate between two).
    p50, p99 = np.quantile(values, QUANTILES, method="inverted_cdf")
    return float(p50), float(p99)


class Timeline:
    """The last `window_s` (900) of one engine's own figures, in `step_s` (5 s) buckets."""

    def __init__(
        self,
        window_s: float = WINDOW_S,
        step_s: float = STEP_S,
        clock: Callable[[], float] = time.time,
        seed: int | None = None,
    ) -> None:
        if step_s <= 0 or window_s < step_s:
            raise ValueError(f"timeline: step_s {step_s} must be > 0 and <= window_s {window_s}")
        self.window_s = float(window_s)
        self.step_s = float(step_s)
        self._clock = clock
        self._lock = threading.Lock()
        # Bucket index (start // step_s) -> bucket.
        self._buckets: dict[int, _Bucket] = {}
        self._newest = -1
        self._takeovers: list[tuple[float, int]] = []
        # Only for the sampling above MAX_SAMPLES; seeded in tests.
        self._rng = np.random.default_rng(seed)

    def published(
        self, latencies_s: npt.NDArray[np.floating[Any]] | Sequence[float], at: float | None = None
    ) -> None:
        """The end-to-end latency (inbound record's Kafka timestamp -> commit of the
        transaction that made it visible) of every record one commit published."""
        values = np.asarray(latencies_s, dtype=np.float64).ravel()
        if values.size == 0:
            return
        with self._lock:
            bucket = self._bucket(at)
            if bucket is None:
                return
            bucket.published += int(values.size)
            if bucket.summary is not None:
                return  # summarised already: see the module's guarantee
            if bucket.keep < 1.0:
                values = values[self._rng.random(values.size) < bucket.keep]
            bucket.samples.append(values)
            bucket.kept += int(values.size)
            while bucket.kept > MAX_SAMPLES:
                # Halve the sample: each kept record stays with chance 1/2, so every record
                # of the bucket keeps the same chance `keep` of being in it.
                kept = np.concatenate(bucket.samples)
                kept = kept[self._rng.random(kept.size) < 0.5]
                bucket.samples, bucket.kept = [kept], int(kept.size)
                bucket.keep /= 2

    def rate(self, events_per_s: float, at: float | None = None) -> None:
        """The inbound rate, sampled about once a second: a bucket shows its mean."""
        if not math.isfinite(events_per_s):
            return
        with self._lock:
            bucket = self._bucket(at)
            if bucket is not None:
                bucket.rate_sum += events_per_s
                bucket.rate_n += 1

    def lag(self, records: int | None, at: float | None = None) -> None:
        """This engine's lag (inbound head - its next msg_id), sampled about once a second:
        a bucket shows its highest, the lag a takeover in it would have had to make up at
        worst (between micro-batches the lag swings by a batch). None (unknown) is skipped."""
        if records is None:
            return
        with self._lock:
            bucket = self._bucket(at)
            if bucket is not None:
                bucket.lag = records if bucket.lag is None else max(bucket.lag, records)

    def takeover(self, epoch: int, at: float | None = None) -> None:
        """This engine won the election with `epoch`."""
        with self._lock:
            when = self._clock() if at is None else at
            self._takeovers.append((when, epoch))
            self._takeovers.sort()
            self._prune(self._clock())

    def snapshot(self) -> dict[str, Any]:
        """JSON-ready: {"window_s", "step_s", "now", "points": [{"t": bucket start, epoch
        seconds, "p50_s", "p99_s", "published", "in_per_s", "lag"}, ...] oldest first,
        "takeovers": [{"t", "epoch"}, ...] oldest first}. A figure a bucket has none of is
        None (p50_s/p99_s without a published record, in_per_s without a rate sample)."""
        with self._lock:
            now = self._clock()
            self._prune(now)
            points = []
            for index in sorted(self._buckets):
                bucket = self._buckets[index]
                quantiles = bucket.summary
                if quantiles is None and bucket.kept:
                    quantiles = _quantiles(np.concatenate(bucket.samples))
                points.append(
                    {
                        "t": index * self.step_s,
                        "p50_s": None if quantiles is None else quantiles[0],
                        "p99_s": None if quantiles is None else quantiles[1],
                        "published": bucket.published,
                        "in_per_s": bucket.rate_sum / bucket.rate_n if bucket.rate_n else None,
                        "lag": bucket.lag,
                    }
                )
            return {
                "window_s": self.window_s,
                "step_s": self.step_s,
                "now": now,
                "points": points,
                "takeovers": [{"t": t, "epoch": e} for t, e in self._takeovers],
            }

    def _bucket(self, at: float | None) -> _Bucket | None:
        """The bucket `at` (default: now) falls in, opened if new; None when `at` is
        already outside the window. Called with the lock held."""
        now = self._clock()
        when = now if at is None else at
        index = math.floor(when / self.step_s)
        if index < self._oldest_index(now):
            return None
        bucket = self._buckets.get(index)
        if bucket is None:
            bucket = self._buckets[index] = _Bucket()
            if index > self._newest:
                self._newest = index
                self._roll(now)
        return bucket

    def _roll(self, now: float) -> None:
        """A new bucket opened: summarise every bucket before the one before it (a commit
        reported a moment late still lands in the previous one exactly), and forget what
        left the window."""
        for index, bucket in self._buckets.items():
            if index < self._newest - 1 and bucket.summary is None and bucket.samples:
                bucket.summary = _quantiles(np.concatenate(bucket.samples))
                bucket.samples, bucket.kept = [], 0
        self._prune(now)

    def _oldest_index(self, now: float) -> int:
        # The oldest bucket any part of which lies within the window.
        return math.floor((now - self.window_s) / self.step_s) + 1

    def _prune(self, now: float) -> None:
        oldest = self._oldest_index(now)
        for index in [i for i in self._buckets if i < oldest]:
            del self._buckets[index]
        cutoff = now - self.window_s
        if self._takeovers and self._takeovers[0][0] < cutoff:
            self._takeovers = [(t, e) for t, e in self._takeovers if t >= cutoff]


class Mark(BaseModel):
    """A takeover: `engine_id` won the election with `epoch` at `t` (epoch seconds)."""

    t: float
    epoch: int
    engine_id: str


class PipelineTimeline(BaseModel):
    """A pipeline's last `window_s` seconds, its engines' timelines merged, as columns over
    the shared time axis `t` (bucket starts, epoch seconds; a bucket any engine reported in).

    Latency is the publisher's: in each bucket the engine that published the most records
    in it (only the active publishes; in a takeover's bucket both may have) gives p50_s,
    p99_s and published; None where none published. `in_per_s` is the mean of the engines'
    samples of the inbound rate. `lag` has one line per engine. Every engine's remembered
    takeovers are `takeovers`, oldest first, one per epoch. An engine that did not answer
    is in `unread` with why: its history is not in the lines (a restarted engine's starts
    at its start)."""

    pipeline: str
    window_s: float = WINDOW_S
    step_s: float = STEP_S
    # The merging side's clock, epoch seconds: where the window ends.
    now: float
    t: list[float] = Field(default_factory=list)
    p50_s: list[float | None] = Field(default_factory=list)
    p99_s: list[float | None] = Field(default_factory=list)
    published: list[int] = Field(default_factory=list)
    in_per_s: list[float | None] = Field(default_factory=list)
    lag: dict[str, list[int | None]] = Field(default_factory=dict)
    takeovers: list[Mark] = Field(default_factory=list)
    unread: dict[str, str] = Field(default_factory=dict)


def merge(
    pipeline: str,
    timelines: Mapping[str, TimelineInfo],
    now: float,
    unread: Mapping[str, str] | None = None,
) -> PipelineTimeline:
    """The engines' timelines (engine id -> its GET /timeline) as one (`PipelineTimeline`),
    limited to the window that ends at `now`."""
    seen = next(iter(timelines.values()), None)
    window_s = seen.window_s if seen is not None else WINDOW_S
    step_s = seen.step_s if seen is not None else STEP_S
    start = now - window_s - step_s
    times = sorted({p.t for info in timelines.values() for p in info.points if p.t >= start})
    at = {t: i for i, t in enumerate(times)}
    merged = PipelineTimeline(
        pipeline=pipeline,
        window_s=window_s,
        step_s=step_s,
        now=now,
        t=times,
        p50_s=[None] * len(times),
        p99_s=[None] * len(times),
        published=[0] * len(times),
        in_per_s=[None] * len(times),
        lag={engine_id: [None] * len(times) for engine_id in sorted(timelines)},
        unread=dict(unread or {}),
    )
    rates: list[list[float]] = [[] for _ in times]
    marks: dict[int, Mark] = {}
    for engine_id, info in sorted(timelines.items()):
        for p in info.points:
            i = at.get(p.t)
            if i is None:
                continue
            if p.published > merged.published[i]:
                merged.published[i] = p.published
                merged.p50_s[i], merged.p99_s[i] = p.p50_s, p.p99_s
            if p.in_per_s is not None:
                rates[i].append(p.in_per_s)
            merged.lag[engine_id][i] = p.lag
        for mark in info.takeovers:
            if mark.t >= start:
                marks.setdefault(mark.epoch, Mark(t=mark.t, epoch=mark.epoch, engine_id=engine_id))
    merged.in_per_s = [sum(r) / len(r) if r else None for r in rates]
    merged.takeovers = sorted(marks.values(), key=lambda m: (m.t, m.epoch))
    return merged


def read(
    name: str,
    settings: Connections,
    engines: Callable[[Connections, str], EngineClient],
    clock: Callable[[], float] = time.time,
) -> PipelineTimeline:
    """The pipeline's timeline: each of its engines asked for GET /timeline, merged."""
    from twinstream.engine.client import EngineError

    timelines: dict[str, TimelineInfo] = {}
    unread: dict[str, str] = {}
    for engine_id in settings.engine_ids:
        try:
            with engines(settings, engine_id) as client:
                timelines[engine_id] = client.timeline()
        except EngineError as exc:
            # An engine down has no figures to give; its lag line pauses, and why is shown.
            unread[engine_id] = exc.reason if exc.status is None else f"HTTP {exc.status}"
            log.debug("pipeline %s: no timeline from engine %s: %s", name, engine_id, exc)
        except ValidationError as exc:
            # An answer that is not a timeline (another version's) must not cost the
            # page the other engines' figures.
            unread[engine_id] = f"an answer that is not a timeline ({exc.error_count()} errors)"
            log.warning("pipeline %s: engine %s's timeline unreadable: %s", name, engine_id, exc)
    return merge(name, timelines, clock(), unread)
