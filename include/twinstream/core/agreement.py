"""Whether a standby's output rows are the active's, checked while both run.

Guarantee: for every range of msg_ids the active published in one transaction (one
partition's part of it) whose rows a standby holds whole, the standby says whether its own
rows for that range equal the published ones: every output and dead letter, its kind, key
and value, byte for byte, and as many of each. When they differ it names the first msg_id
that differs, with both sides' rows, and stays `disagrees` until it is restored (`reset`)
or an operator overrides it; a disagreeing engine is not eligible to lead (the election
asks `eligible`). Equal rows are never reported as a difference. A range whose rows the
standby does not hold whole (computed before a restart or restore, trimmed already, or
larger than its buffer may hold) is counted as unchecked, never guessed.

How: the active writes, into each transaction's progress record of each partition, the
digest of that partition's rows in the transaction (`digest`: BLAKE2b over the rows'
texts, sorted, so that the order a fan-out's rows came in does not count, and coverage
rows left out: the range itself says every msg_id of it is accounted for). A standby reads
the progress topic (read_committed) as it is written, queues the ranges, and once it has
processed a range's last msg_id takes its own rows of the range from its buffer, digests
them the same way and compares. Until then the gate keeps the range's rows (`check`
returns the positions the standby may forget up to). Only on a difference does it read the
active's rows of the range back from the outbound and dead-letter topics, to find the
first msg_id that differs.

A standby on other code than the active (the progress record's `version` header is not the
standby's own: a deploy's new version running beside the old) is compared the same way, but
its differences are its new logic's, on purpose: it is in `shadow`, reports what differs
(ranges and rows compared, msg_ids differing in the ranges read back, a few examples of
both versions' rows for the same msg_id) and is never barred for them. Rows of the same
version that differ still bar it.

Cost: the active digests each transaction's rows once; each standby digests the same rows
once, and reads one progress record per partition per transaction. Both are counted in
`AgreementStatus.digest_s` (docs/design.md, "Replica agreement", has the figures).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from twinstream.core.logs import EngineLog
from twinstream.core.rows import NONE, Output, range_text

_module_log = logging.getLogger(__name__)

# What a standby's buffer says of a range (Gate.rows_between): its rows, or that it has not
# processed the range's end yet, or that it does not hold the range's start (any more).
NOT_YET: Literal["not yet"] = "not yet"
NOT_HELD: Literal["not held"] = "not held"
Held = list[Output] | Literal["not yet", "not held"]

# Ranges queued for comparison, over all partitions, before the oldest are given up on as
# unchecked: a standby far behind (restoring) would otherwise queue one per transaction.
MAX_PENDING = 100_000
# A shadow's differing ranges are read back from Kafka at most once in this many seconds
# (each read is a consumer's seek and scan), and its examples kept are this many.
SHADOW_READ_BACK_S = 5.0
SHADOW_EXAMPLES = 5


def row_text(row: Output) -> str:
    """One row as the digest reads it: msg_id, kind, key and value, each length-prefixed
    where it is free text, so that no two different rows give the same text."""
    key = "-" if row.key is None else f"{len(row.key)}:{row.key}"
    return f"{row.msg_id}|{row.kind}|{key}|{len(row.value)}:{row.value}"


def digest(rows: Iterable[Output]) -> str:
    """The digest of rows (of one partition's range): BLAKE2b-128 of their texts, sorted;
    coverage rows do not count."""
    texts = sorted(row_text(r) for r in rows if r.kind != NONE)
    h = hashlib.blake2b(digest_size=16)
    h.update("\n".join(texts).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


@dataclass
class DigestCost:
    """Time spent digesting rows, and how many: the check's cost, for the metrics."""

    seconds: float = 0.0
    rows: int = 0


@dataclass(frozen=True)
class PublishedRange:
    """One transaction's part in one partition, as its progress record says: msg_id
    first..last, the digest of its rows (None: written before digests were), the epoch
    and the engine that published it, and the record's timestamp (ms)."""

    partition: int
    first: int
    last: int
    digest: str | None
    epoch: int | None = None
    engine_id: str | None = None
    timestamp_ms: int = 0
    # The version of the code that computed the range (twinstream.platform.versions); None:
    # written without one.
    version: str | None = None

    def text(self) -> str:
        return range_text(self.partition, self.first, self.last)


@dataclass(frozen=True)
class Difference:
    """The first msg_id of `range_` where the rows differ: the active's as published, this
    engine's as computed (each empty for none); `found_at` in epoch seconds."""

    range_: PublishedRange
    msg_id: int
    active_rows: list[Output]
    engine_rows: list[Output]
    found_at: float

    def text(self) -> str:
        r = self.range_
        return difference_text(r.partition, self.msg_id, r.first, r.last, r.epoch)


def difference_text(partition: int, msg_id: int, first: int, last: int, epoch: int | None) -> str:
    """Where a difference is, as logs, the admin API's views and the audit say it:
    `msg_id 2:1000 (the active's transaction of msg_id 2:950..1040, epoch 3)`."""
    where = f"{partition}:{msg_id}" if partition else str(msg_id)
    span = f"{partition}:{first}..{last}" if partition else f"{first}..{last}"
    return f"msg_id {where} (the active's transaction of msg_id {span}, epoch {epoch})"


@dataclass
class Shadow:
    """What a standby on other code than the active found comparing their rows: reported,
    never barring it (the module's guarantee)."""

    active_version: str
    version: str
    ranges_compared: int = 0
    ranges_differing: int = 0
    rows_compared: int = 0
    # Of the differing ranges, those read back (SHADOW_READ_BACK_S apart), and the msg_ids
    # whose rows differ in them.
    ranges_read_back: int = 0
    msg_ids_differing: int = 0
    examples: list[Difference] = field(default_factory=list)


@dataclass
class AgreementStatus:
    state: str
    # Per partition: the last msg_id of the newest range compared and equal.
    checked: dict[int, int] = field(default_factory=dict)
    ranges_agreed: int = 0
    ranges_unchecked: int = 0
    difference: Difference | None = None
    overridden: bool = False
    # Seconds this engine spent digesting its rows for comparison, in all.
    digest_s: float = 0.0
    digested_rows: int = 0
    # While the active runs other code than this engine: what differs (state "shadow").
    shadow: Shadow | None = None


def first_difference(
    range_: PublishedRange,
    mine: Sequence[Output],
    theirs: Sequence[Output],
    found_at: float,
) -> Difference:
    """The lowest msg_id of the range whose rows (sorted texts, coverage rows left out)
    differ between `mine` and `theirs`; the range's first msg_id when none does (the
    active's rows could not all be read back: the digests still differ)."""

    def grouped(rows: Sequence[Output]) -> dict[int, list[Output]]:
        groups: dict[int, list[Output]] = {}
        for row in rows:
            if row.kind != NONE and range_.first <= row.msg_id <= range_.last:
                groups.setdefault(row.msg_id, []).append(row)
        return groups

    mine_by, theirs_by = grouped(mine), grouped(theirs)
    for msg_id in sorted(set(mine_by) | set(theirs_by)):
        a, b = theirs_by.get(msg_id, []), mine_by.get(msg_id, [])
        if sorted(map(row_text, a)) != sorted(map(row_text, b)):
            return Difference(range_, msg_id, a, b, found_at)
    return Difference(range_, range_.first, [], [], found_at)


class Agreement:
    """A standby's running comparison with the active (the module's guarantee).

    `rows_between(partition, first, last)`: the engine's rows of the range, or NOT_YET /
    NOT_HELD (`Gate.rows_between`). `published_rows(range)`: the active's committed rows of
    the range, read back from Kafka, only on a difference. `bound()`: the most msg_ids a
    range may span to be compared (what the buffer may hold)."""

    def __init__(
        self,
        engine_id: str,
        pipeline: str,
        rows_between: Callable[[int, int, int], Held],
        published_rows: Callable[[PublishedRange], list[Output]],
        bound: Callable[[], int],
        wall_clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.perf_counter,
        log: EngineLog | None = None,
        version: str = "",
    ) -> None:
        self.engine_id = engine_id
        # The code this engine runs: a range another version computed is a shadow's.
        self.version = version
        self._read_back_at = float("-inf")
        self.pipeline = pipeline
        self._log = (log or EngineLog(_module_log, engine_id, pipeline)).named(__name__)
        self._rows_between = rows_between
        self._published_rows = published_rows
        self._bound = bound
        self._wall_clock = wall_clock
        self._timer = timer
        self._pending: dict[int, deque[PublishedRange]] = {}
        self._status = AgreementStatus("unchecked")
        # The main loop offers and checks; admin API threads override and reset (a
        # restore). Status reads take a copy without it: a read never waits on a check.
        self._lock = threading.RLock()

    # -- what the engine calls ----------------------------------------------------------

    def offer(self, ranges: Iterable[PublishedRange]) -> None:
        """Queue the active's published ranges, in the order the progress topic has them."""
        with self._lock:
            self._offer(ranges)

    def _offer(self, ranges: Iterable[PublishedRange]) -> None:
        for r in ranges:
            self._pending.setdefault(r.partition, deque()).append(r)
        excess = sum(len(q) for q in self._pending.values()) - MAX_PENDING
        while excess > 0:
            oldest = min((q for q in self._pending.values() if q), key=lambda q: q[0].timestamp_ms)
            oldest.popleft()
            self._status.ranges_unchecked += 1
            excess -= 1

    def check(self, standby: bool) -> dict[int, int]:
        """Compare every queued range this engine has processed. Returns, per partition,
        the msg_id up to which the gate may forget rows: the end of the ranges settled, or
        just before the first range still waiting (the active has published everything
        below it, and its rows are kept until compared). Not a standby (the active, or out
        of the election): the ranges are its own, or cannot be compared; they are settled
        unchecked."""
        with self._lock:
            return self._check(standby)

    def _check(self, standby: bool) -> dict[int, int]:
        floors: dict[int, int] = {}
        for partition, queue in self._pending.items():
            while queue:
                r = queue[0]
                if standby and self._status.state != "disagrees" and r.digest is not None:
                    if r.last - r.first + 1 > self._bound():
                        self._unchecked(r, "larger than the buffer may hold")
                    else:
                        held = self._rows_between(partition, r.first, r.last)
                        if held == NOT_YET:
                            floors[partition] = r.first - 1
                            break
                        if held == NOT_HELD:
                            self._unchecked(r, "its rows are not (or no longer) in the buffer")
                        else:
                            self._compare(r, held)
                elif standby and r.digest is None:
                    self._unchecked(r, "its progress record has no digest")
                queue.popleft()
                floors[partition] = r.last
        return floors

    def status(self) -> AgreementStatus:
        """A copy: the caller (another thread's status read) never sees it change."""
        shadow = self._status.shadow
        return replace(
            self._status,
            checked=dict(self._status.checked),
            shadow=None if shadow is None else replace(shadow, examples=list(shadow.examples)),
        )

    @property
    def eligible(self) -> bool:
        """Whether this engine may lead: not while it disagrees, unless overridden."""
        return self._status.state != "disagrees" or self._status.overridden

    def override(self) -> bool:
        """An operator lets a disagreeing engine lead; False when it does not disagree."""
        with self._lock:
            if self._status.state != "disagrees":
                return False
            self._status.overridden = True
            return True

    def reset(self, why: str) -> None:
        """Forget every comparison and queued range (the engine's state was replaced: a
        restore): what it computes from now on is compared afresh."""
        with self._lock:
            self._reset(why)

    def _reset(self, why: str) -> None:
        if self._status.state == "disagrees":
            self._log.warning(
                "agreement reset (%s); it disagreed at %s",
                why,
                self._status.difference.text() if self._status.difference else "?",
            )
        digest_s, rows = self._status.digest_s, self._status.digested_rows
        self._status = AgreementStatus("unchecked", digest_s=digest_s, digested_rows=rows)
        self._pending = {}

    # -- internals ----------------------------------------------------------------------

    def _unchecked(self, r: PublishedRange, why: str) -> None:
        self._status.ranges_unchecked += 1
        self._log.debug(
            "msg_id %s not compared: %s",
            r.text(),
            why,
        )

    def _compare(self, r: PublishedRange, mine: list[Output]) -> None:
        started = self._timer()
        ours = digest(mine)
        self._status.digest_s += self._timer() - started
        self._status.digested_rows += len(mine)
        if r.version and self.version and r.version != self.version:
            self._shadow(r, mine, ours)
            return
        if self._status.state == "shadow":
            # The active runs this engine's code now (the switch): compared afresh.
            self._status.state = "unchecked"
            self._log.info("the active runs this engine's code (%s): comparing afresh", r.version)
        if ours == r.digest:
            self._status.ranges_agreed += 1
            self._status.checked[r.partition] = r.last
            if self._status.state == "unchecked":
                self._status.state = "agrees"
                self._log.info(
                    "agrees with the active (msg_id %s compared)",
                    r.text(),
                )
            return
        try:
            theirs = self._published_rows(r)
        except Exception as exc:  # the difference stands; only its msg_id is unknown
            self._log.warning(
                "could not read back the active's rows of msg_id %s: %s",
                r.text(),
                exc,
            )
            theirs = []
        found = first_difference(r, mine, theirs, self._wall_clock())
        self._status.state = "disagrees"
        self._status.difference = found
        self._log.error(
            "DISAGREES with the active at %s: the active published %s, "
            "this engine computed %s. It will not lead until restored (restore_and_resync, "
            "snapshot proven) or overridden (POST /pipeline/override)",
            found.text(),
            [(o.kind, o.key, o.value[:200]) for o in found.active_rows],
            [(o.kind, o.key, o.value[:200]) for o in found.engine_rows],
        )

    def _shadow(self, r: PublishedRange, mine: list[Output], ours: str) -> None:
        """Compare a range the active computed with other code: count, keep examples, never
        bar (the module's guarantee)."""
        assert r.version is not None
        shadow = self._status.shadow
        if shadow is None or shadow.active_version != r.version:
            shadow = self._status.shadow = Shadow(r.version, self.version)
            self._log.info(
                "shadow: the active runs %s, this engine %s; differences are reported, not barred",
                r.version,
                self.version,
            )
        if self._status.state != "disagrees":
            self._status.state = "shadow"
        shadow.ranges_compared += 1
        shadow.rows_compared += sum(1 for o in mine if o.kind != NONE)
        if ours == r.digest:
            return
        shadow.ranges_differing += 1
        now = self._wall_clock()
        if now - self._read_back_at < SHADOW_READ_BACK_S:
            return
        self._read_back_at = now
        try:
            theirs = self._published_rows(r)
        except Exception as exc:  # counted as differing; only its detail is unknown
            self._log.warning("shadow: could not read back msg_id %s: %s", r.text(), exc)
            return
        shadow.ranges_read_back += 1
        shadow.msg_ids_differing += len(differing_msg_ids(r, mine, theirs))
        if len(shadow.examples) < SHADOW_EXAMPLES:
            shadow.examples.append(first_difference(r, mine, theirs, now))


def differing_msg_ids(
    range_: PublishedRange, mine: Sequence[Output], theirs: Sequence[Output]
) -> list[int]:
    """The msg_ids of the range whose rows (coverage rows left out) differ."""

    def texts(rows: Sequence[Output]) -> dict[int, list[str]]:
        found: dict[int, list[str]] = {}
        for row in rows:
            if row.kind != NONE and range_.first <= row.msg_id <= range_.last:
                found.setdefault(row.msg_id, []).append(row_text(row))
        return {k: sorted(v) for k, v in found.items()}

    a, b = texts(mine), texts(theirs)
    return sorted(m for m in set(a) | set(b) if a.get(m, []) != b.get(m, []))
