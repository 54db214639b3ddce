"""Whether an engine could take over now, and whether its pipeline would survive the loss of
its active.

Guarantee: `InSync` says an engine is in sync when it would reach the inbound head within
`bound_s` at the rate its own batches measured (`twinstream.engine.batching.DrainRate`): its
lag in seconds, not in records, so the answer means the same at 10 events/s and at 10,000.
It changes with hysteresis: an engine becomes in sync once its lag is within the bound, and
stops being in sync only when its lag stays above the bound for `hold_s`, or exceeds twice
the bound: a level engine's lag swings by a batch between triggers, and that swing never
makes it flap. Until the engine has measured a rate, the bound is `fallback_records`
records. Its value changes only in `update`, which the engine's main loop calls once a
second: a status read never changes it.

`Redundancy` is the active's view of its standbys, from the standings every engine writes
to ZooKeeper (`twinstream.core.election.Standing`): which engines could take over now (in
sync, allowed to lead) and, when none could, since when and why each one could not. A
pipeline in that state stops its output at the next failure: the overview, the page,
`platform_health` and `/metrics` (`twinstream_unprotected`) report it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from twinstream.core.election import Standing

# States in which an engine's query works towards the head (a persist holds it on purpose).
_WORKING = ("running", "restoring")


def lag_seconds(lag: int | None, records_per_s: float | None) -> float | None:
    """The lag in seconds of the engine's measured rate; None when either is unknown."""
    if lag is None or records_per_s is None or records_per_s <= 0:
        return None
    return round(lag / records_per_s, 2)


class InSync:
    """An engine's in-sync flag with hysteresis (see the module's guarantee)."""

    def __init__(
        self,
        bound_s: float,
        hold_s: float,
        fallback_records: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bound_s = bound_s
        self.hold_s = hold_s
        self.fallback_records = fallback_records
        self._clock = clock
        self.value = False
        # The lag in seconds at the last update (None: no rate measured, or no lag known).
        self.lag_s: float | None = None
        # Since when the lag has been above the bound while in sync.
        self._above_since: float | None = None

    def update(
        self, state: str, lag: int | None, records_per_s: float | None, query_reported: bool
    ) -> bool:
        """One second's reading. Until the current query has reported progress the lag
        comes from what the previous query processed, so it does not count; a persist
        stops the query on purpose and keeps the engine what it was."""
        self.lag_s = lag_seconds(lag, records_per_s)
        if state == "persisting":
            return self.value
        if state not in _WORKING or not query_reported or lag is None:
            self.value, self._above_since = False, None
            return self.value
        if self.lag_s is not None:
            within, far = self.lag_s <= self.bound_s, self.lag_s > 2 * self.bound_s
        else:
            within = lag <= self.fallback_records
            far = lag > 2 * self.fallback_records
        now = self._clock()
        if within:
            self.value, self._above_since = True, None
        elif self.value:
            if self._above_since is None:
                self._above_since = now
            if far or now - self._above_since >= self.hold_s:
                self.value, self._above_since = False, None
        return self.value

    def behind(self, lag: int | None) -> bool:
        """The lag is known and above the bound now (no hysteresis: a figure for alerts
        that span a window, twinstream_behind)."""
        if lag is None:
            return False
        if self.lag_s is not None:
            return self.lag_s > self.bound_s
        return lag > self.fallback_records

    def describe(self, lag: int | None) -> str:
        """ "lag 4,200 (1.4 s)", "lag 4,200", "lag unknown"."""
        if lag is None:
            return "lag unknown"
        return f"lag {lag:,}" + ("" if self.lag_s is None else f" ({self.lag_s:.1f} s)")


def why_not_ready(standing: Standing | None) -> str | None:
    """None when an engine standing so could take over now; else why not, in a few words."""
    if standing is None:
        return "not running (no standing in ZooKeeper: stopped, restarting or its machine lost)"
    if not standing.eligible:
        return "may not lead (its rows disagree with the published output)"
    if not standing.in_sync:
        if standing.lag is None:
            return "not in sync (lag unknown: starting or restoring)"
        behind = f"{standing.lag:,} records"
        if standing.lag_s is not None:
            behind += f", {standing.lag_s:.1f} s"
        return f"not in sync ({behind} behind)"
    return None


@dataclass(frozen=True)
class Cover:
    """The active's standbys: those that could take over now; when none could, the
    wall-clock time since then and each other engine's reason."""

    ready: list[str] = field(default_factory=list)
    not_ready: dict[str, str] = field(default_factory=dict)
    since: float | None = None

    def unprotected_s(self, now: float) -> float | None:
        """How long no standby could take over, at `now`; None while one could."""
        return None if self.since is None else round(max(0.0, now - self.since), 1)


class Redundancy:
    """Which standbys could take over from this engine while it is active (see the module's
    guarantee). `update` runs in the main loop; `cover()` only reads."""

    def __init__(
        self,
        engine_id: str,
        engine_ids: Sequence[str],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine_id = engine_id
        self.others = [e for e in engine_ids if e != engine_id]
        self._clock = clock
        self._cover: Cover | None = None

    def update(self, active: bool, standings: Mapping[str, Standing]) -> Cover | None:
        """One look at the other engines' standings while active; None (and forgotten)
        while not: a standby cannot tell which standing is the active's."""
        if not active:
            self._cover = None
            return None
        names = sorted(set(self.others) | set(standings))
        reasons = {e: why_not_ready(standings.get(e)) for e in names if e != self.engine_id}
        ready = [e for e, why in reasons.items() if why is None]
        not_ready = {e: why for e, why in reasons.items() if why is not None}
        since = None
        if not ready:
            # Since the first look that found none, not the last.
            before = self._cover.since if self._cover is not None else None
            since = before if before is not None else self._clock()
        self._cover = Cover(ready, not_ready, since)
        return self._cover

    def cover(self) -> Cover | None:
        return self._cover
