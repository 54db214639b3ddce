"""The gate between an engine's results and the outbound topics.

Guarantee: every output row is published at most once, in msg_id order, and only by the
engine that currently holds both the ZooKeeper election and the pipeline's Kafka
transactional id. Rows are published exactly once as long as some engine that computed them
still holds them in its buffer when it becomes active; when no engine does, the missing
msg_id range is reported (log at ERROR, metric, admin API), never skipped silently.

Memory is bounded without dropping anything: a standby keeps every row above the active's
last published msg_id, and once it holds `max_buffered_msgs` rows it pauses its query
(`on_batch` does not return) until the active has published past them; an active that
cannot publish pauses its query once it holds `max_buffered_msgs` unpublished rows, and
retries with backoff until they are published. A paused query does not advance its
checkpoint, so nothing a pause holds back is lost: Kafka keeps the inbound records.

How: every engine, active or not, appends each batch's rows to a buffer of at least the
last `num_buffered_msgs` rows; a standby also keeps every row above the active's last
published msg_id (as last read from the outbound topics; all of them while it is
unknown), so a standby running ahead of a lagging active still covers the difference at
takeover. The active publishes the buffered rows whose msg_id is above the last published
one, in one Kafka transaction per batch. A new active first fences (init
transactions on the shared transactional id aborts the old active's open transaction and
makes its later commits fail), then reads the last committed msg_id from the outbound and
dead-letter topics, then publishes what its buffer holds after it. A batch Spark replays
after a restart repeats msg_ids the buffer already has, and they are dropped on arrival.

A msg_id may have several rows (a fan-out): they arrive in one batch, stay together in the
buffer and are published in one transaction, in the order the batch gave them. A record
without output has a coverage row (`twinstream.core.rows.NONE`), so that every msg_id a
batch consumed is in the buffer and a takeover tells a filtered record from a gap.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import takewhile
from typing import Protocol

from twinstream.core.rows import Output

log = logging.getLogger(__name__)


def merge(*sources: Iterable[Output]) -> list[Output]:
    """The rows of every msg_id in any source, in msg_id order, each msg_id's rows taken
    whole from the first source that has it (sources hold the same rows for a msg_id:
    engines compute deterministically)."""
    groups: dict[int, list[Output]] = {}
    for source in sources:
        mine: dict[int, list[Output]] = {}
        for row in source:
            if row.msg_id not in groups:
                mine.setdefault(row.msg_id, []).append(row)
        groups.update(mine)
    return [row for msg_id in sorted(groups) for row in groups[msg_id]]


class Fenced(Exception):
    """Another engine has initialised the shared transactional id: this one may never
    commit again with its producer."""


class TransientPublishError(Exception):
    """The transaction was aborted for a reason that may pass (broker restart, timeout)."""


class Publisher(Protocol):
    """A transactional producer whose init has fenced every earlier holder of the id."""

    def publish(self, rows: Sequence[Output], epoch: int) -> None:
        """Write `rows` in one transaction; raise Fenced or TransientPublishError."""

    def close(self) -> None: ...


class Metrics(Protocol):
    def published(self, rows: int) -> None: ...
    def processed(self, rows: int) -> None: ...
    def takeover(self) -> None: ...
    def uncovered(self, first: int, last: int) -> None: ...
    def role(self, role: str) -> None: ...
    def paused(self, paused: bool) -> None: ...
    def repaired(self, rows: int) -> None: ...


class NoMetrics:
    def published(self, rows: int) -> None: ...
    def processed(self, rows: int) -> None: ...
    def takeover(self) -> None: ...
    def uncovered(self, first: int, last: int) -> None: ...
    def role(self, role: str) -> None: ...
    def paused(self, paused: bool) -> None: ...
    def repaired(self, rows: int) -> None: ...


@dataclass
class Repair:
    """A range no buffer covered at a takeover, recomputed: msg_id first..last, and how
    long it took (None while in progress)."""

    first: int
    last: int
    seconds: float | None = None


@dataclass
class GateStatus:
    role: str
    epoch: int
    zk_connected: bool
    last_msg_id_processed: int | None
    last_msg_id_published: int | None
    buffer_fill: int
    buffer_size: int
    uncovered_ranges: list[tuple[int, int]] = field(default_factory=list)
    # Rows the active holds that it could not publish yet.
    unpublished: int = 0
    # Why the query is paused (backpressure), if it is.
    paused: str | None = None
    repairs: list[Repair] = field(default_factory=list)


class Gate:
    def __init__(
        self,
        engine_id: str,
        pipeline: str,
        buffer_size: int,
        metrics: Metrics | None = None,
        max_buffer_size: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        on_gap: Callable[[int, int], bool] | None = None,
        on_fenced: Callable[[], None] | None = None,
    ) -> None:
        self.engine_id = engine_id
        self.pipeline = pipeline
        # In msg_id order. At least the last `buffer_size` rows; more while they are above
        # the active's last published msg_id, up to `max_buffer_size` (see _trim).
        self._buffer: deque[Output] = deque()
        self._buffer_size = buffer_size
        self._max_buffer_size = max(buffer_size, max_buffer_size or buffer_size)
        # The active's last published msg_id as this standby last read it; None: unknown.
        self._published_elsewhere: int | None = None
        self._sleep = sleep
        self._clock = clock
        self._paused: str | None = None
        # Bumped when the query is being stopped: a paused batch then returns at once; and
        # no batch pauses until the next query starts.
        self._generation = 0
        self._stopping = False
        # Asked to recompute a range no buffer covers; True: it will (see `rewind`).
        self._on_gap = on_gap
        # The active's producer can publish no more (fenced, or failed for good): leave the
        # leadership, so that the next active (this engine again, perhaps) fences anew.
        self._on_fenced = on_fenced
        self._repairs: list[Repair] = []
        self._repair_started = 0.0
        # A gap given up on (reported): rows after it are then published as they are.
        self._last_published_gap: tuple[int, int] | None = None
        self._lock = threading.RLock()
        self._metrics = metrics or NoMetrics()
        self._role = "none"
        self._epoch = 0
        self._zk_connected = False
        self._publisher: Publisher | None = None
        self._last_processed: int | None = None
        self._last_published: int | None = None
        self._uncovered: list[tuple[int, int]] = []
        # While active: rows whose commit failed or was held (SUSPENDED), kept even if the
        # ring has dropped them, until they are published.
        self._held: list[Output] = []

    # -- what the streaming query calls -------------------------------------------------

    def on_batch(self, batch_id: int, rows: Sequence[Output]) -> int:
        """Take one batch's rows (any order). Returns how many were published, at once or
        while the batch was paused for room (see the module doc)."""
        published = self._take(batch_id, rows)
        return published + self._wait_for_room(batch_id)

    def _take(self, batch_id: int, rows: Sequence[Output]) -> int:
        with self._lock:
            newest = self._buffer[-1].msg_id if self._buffer else -1
            fresh = sorted((r for r in rows if r.msg_id > newest), key=lambda r: r.msg_id)
            if len(fresh) < len(rows):
                log.info(
                    "engine %s pipeline %s: batch %s repeats %s rows already buffered "
                    "(replay after restart); dropped",
                    self.engine_id,
                    self.pipeline,
                    batch_id,
                    len(rows) - len(fresh),
                )
            # The batch may be larger than the buffer: what the active publishes is taken
            # before the ring drops anything.
            # A standby never publishes from here: it skips the work on every batch.
            pending = self._pending(fresh) if self._role == "active" else []
            self._buffer.extend(fresh)
            self._trim()
            if fresh:
                self._last_processed = fresh[-1].msg_id
            self._metrics.processed(len(fresh))
            return self._publish(pending, batch_id)

    def abandon_waits(self) -> None:
        """The query is being stopped: a batch paused for room returns now (its rows are in
        the buffer already), and so does any later batch of it, so that the stop need not
        wait for the active. `resume_waits` ends this for the next query."""
        with self._lock:
            self._generation += 1
            self._stopping = True

    def resume_waits(self) -> None:
        """A new query starts: its batches pause for room again."""
        with self._lock:
            self._stopping = False

    def _over_bound(self) -> bool:
        if self._role == "active":
            return len(self._held) >= self._max_buffer_size
        return len(self._buffer) >= self._max_buffer_size and self._trim_floor_blocks()

    def _trim_floor_blocks(self) -> bool:
        floor = self._published_elsewhere
        return bool(self._buffer) and (floor is None or self._buffer[0].msg_id > floor)

    def _wait_for_room(self, batch_id: int) -> int:
        """Hold the query (this call does not return) while over the bound: an active
        retries its unpublished rows with backoff, a standby waits for the active to
        publish past its oldest rows. Returns the rows published meanwhile."""
        published = 0
        backoff = 0.1
        paused_at = self._clock()
        with self._lock:
            generation = self._generation
        while True:
            with self._lock:
                if generation != self._generation or self._stopping or self._role == "none":
                    break
                if self._role == "active" and self._held:
                    published += self._publish(self._pending([]), batch_id)
                if not self._over_bound():
                    break
                if self._paused is None:
                    self._paused = self._pause_reason()
                    paused_at = self._clock()
                    log.warning(
                        "engine %s pipeline %s: batch %s: query paused: %s",
                        self.engine_id,
                        self.pipeline,
                        batch_id,
                        self._paused,
                    )
                    self._metrics.paused(True)
            self._sleep(backoff)
            backoff = min(backoff * 2, 2.0)
        with self._lock:
            if self._paused is not None:
                log.warning(
                    "engine %s pipeline %s: batch %s: query resumed after %.1f s paused",
                    self.engine_id,
                    self.pipeline,
                    batch_id,
                    self._clock() - paused_at,
                )
                self._paused = None
                self._metrics.paused(False)
        return published

    def _pause_reason(self) -> str:
        if self._role == "active":
            return (
                f"{len(self._held)} unpublished rows (max_buffered_msgs "
                f"{self._max_buffer_size}); retrying the publish until Kafka takes them"
            )
        return (
            f"{len(self._buffer)} buffered rows above the active's last published msg_id "
            f"{self._published_elsewhere} (max_buffered_msgs {self._max_buffer_size}); "
            "waiting for the active to publish"
        )

    def note_published(self, msg_id: int) -> None:
        """A standby learns the active's last published msg_id: rows above it are kept
        beyond `buffer_size` until it has passed them (the query pauses at the bound)."""
        with self._lock:
            if self._published_elsewhere is None or msg_id > self._published_elsewhere:
                self._published_elsewhere = msg_id
            self._trim()

    # -- what the election and ZooKeeper state listener call ----------------------------

    def joined(self) -> None:
        """Entered the election (as a standby until it wins)."""
        with self._lock:
            if self._role == "none":
                self._set_role("standby")

    def take_over(
        self,
        epoch: int,
        fence: Callable[[], Publisher],
        last_committed: Callable[[], int | None],
    ) -> int:
        """Become the active: fence, find the last published msg_id, publish what the
        buffer holds after it. Returns the number of rows published at takeover."""
        with self._lock:
            started = time.monotonic()
            publisher = fence()
            fenced = time.monotonic()
            try:
                last = last_committed()
            except Exception:
                publisher.close()
                raise
            log.info(
                "engine %s pipeline %s: fenced in %.3f s, read the last committed msg_id in %.3f s",
                self.engine_id,
                self.pipeline,
                fenced - started,
                time.monotonic() - fenced,
            )
            self._publisher = publisher
            self._epoch = epoch
            self._last_published = last
            self._zk_connected = True
            self._set_role("active")
            self._metrics.takeover()
            log.warning(
                "engine %s pipeline %s: ACTIVE at epoch %s; last published msg_id %s, "
                "processed up to msg_id %s, buffer holds %s..%s",
                self.engine_id,
                self.pipeline,
                epoch,
                last,
                self._last_processed,
                self._buffer[0].msg_id if self._buffer else None,
                self._buffer[-1].msg_id if self._buffer else None,
            )
            return self._publish(self._pending([]), None)

    def step_down(self, reason: str, rejoin: bool = True) -> None:
        with self._lock:
            was = self._role
            if self._publisher is not None:
                self._publisher.close()
                self._publisher = None
            if self._held:
                # What it could not publish stays, as on any standby a row the active has
                # not published does: a takeover (by this engine, re-elected) needs it.
                self._buffer = deque(merge(self._buffer, self._held))
                self._published_elsewhere = self._last_published
            self._held = []
            self._set_role("standby" if rejoin else "none")
            if was == "active":
                log.warning(
                    "engine %s pipeline %s: stepped down from active (%s); last published "
                    "msg_id %s",
                    self.engine_id,
                    self.pipeline,
                    reason,
                    self._last_published,
                )

    def zk_connected(self, connected: bool) -> None:
        """SUSPENDED stops commits until the session is back (or LOST, then step_down)."""
        with self._lock:
            self._zk_connected = connected
            if connected and self._role == "active":
                self._publish(self._pending([]), None)

    # -- status -------------------------------------------------------------------------

    def status(self) -> GateStatus:
        # Without the lock: a publish holds it for as long as Kafka takes to answer (up to
        # message.timeout.ms in an outage), and status reads must not wait for that. Each
        # field is read atomically; together they may straddle one batch.
        return GateStatus(
            role=self._role,
            epoch=self._epoch,
            zk_connected=self._zk_connected,
            last_msg_id_processed=self._last_processed,
            last_msg_id_published=self._last_published,
            buffer_fill=len(self._buffer),
            buffer_size=self._buffer_size,
            uncovered_ranges=list(self._uncovered),
            unpublished=len(self._held),
            paused=self._paused,
            repairs=list(self._repairs),
        )

    def buffered(self) -> list[Output]:
        with self._lock:
            return list(self._buffer)

    def rewind(self, next_msg_id: int) -> None:
        """The query has been rewound to recompute from `next_msg_id`: forget the rows it
        will bring again, so they are taken as new (not dropped as a replay)."""
        with self._lock:
            while self._buffer and self._buffer[-1].msg_id >= next_msg_id:
                self._buffer.pop()
            self._held = [r for r in self._held if r.msg_id < next_msg_id]
            self._last_processed = self._buffer[-1].msg_id if self._buffer else None

    def repair_failed(self, why: str) -> None:
        """The engine could not recompute the range: report it as missing, and publish
        what follows it."""
        with self._lock:
            repair = self._repairing()
            if repair is None:
                return
            self._repairs.remove(repair)
            log.error(
                "engine %s pipeline %s: repair of msg_id %s..%s failed: %s",
                self.engine_id,
                self.pipeline,
                repair.first,
                repair.last,
                why,
            )
            self._report_uncovered(repair.first, repair.last)
            self._last_published_gap = (repair.first, repair.last)
            self._publish(self._pending([]), None)

    def _start_repair(self, first: int, last: int) -> bool:
        """Ask the engine to recompute first..last; True: it will, hold everything later."""
        if self._on_gap is None or not self._on_gap(first, last):
            return False
        self._repairs.append(Repair(first, last))
        self._repair_started = self._clock()
        log.warning(
            "engine %s pipeline %s: GAP msg_id %s..%s (%s messages): no buffer holds them; "
            "recomputing them before publishing anything later",
            self.engine_id,
            self.pipeline,
            first,
            last,
            last - first + 1,
        )
        return True

    def _repairing(self) -> Repair | None:
        return next((r for r in self._repairs if r.seconds is None), None)

    def restore(self, rows: Sequence[Output]) -> None:
        """Load a snapshot's buffer (or none, for a cold rebuild) into a standby whose query
        is stopped; the restarted query continues after the last row."""
        with self._lock:
            if self._role == "active":
                raise RuntimeError("an active engine's buffer cannot be replaced")
            self._buffer.clear()
            self._buffer.extend(sorted(rows, key=lambda r: r.msg_id))
            self._last_processed = self._buffer[-1].msg_id if self._buffer else None
            self._held = []
            self._published_elsewhere = None
            self._trim()

    @property
    def role(self) -> str:
        return self._role

    # -- internals ----------------------------------------------------------------------

    def _trim(self) -> None:
        """Drop the oldest rows beyond `buffer_size` that nobody needs any more: on a
        standby those the active has published (none while its position is unknown), on
        the active all of them (it keeps its unpublished ones in `_held`), outside the
        election all of them. Never a row a takeover may need: past `max_buffered_msgs`
        the query pauses instead."""
        floor = self._published_elsewhere
        while len(self._buffer) > self._buffer_size:
            if self._role == "standby" and (floor is None or self._buffer[0].msg_id > floor):
                break
            self._buffer.popleft()

    def _set_role(self, role: str) -> None:
        self._role = role
        self._metrics.role(role)

    def _pending(self, fresh: list[Output]) -> list[Output]:
        """Rows above the last published msg_id, in order: those held back by a failed or
        suspended commit, the buffered ones, and the new batch's."""
        last = self._last_published

        def unpublished(row: Output) -> bool:
            return last is None or row.msg_id > last

        # The ring is in msg_id order: read back from its end only as far as it is
        # unpublished, instead of scanning all num_buffered_msgs rows every batch.
        buffered = list(takewhile(unpublished, reversed(self._buffer)))[::-1]
        return merge(
            *([r for r in rows if unpublished(r)] for rows in (self._held, buffered, fresh))
        )

    def _publish(self, rows: list[Output], batch_id: int | None) -> int:
        if self._role != "active" or self._publisher is None:
            return 0
        if not rows:
            return 0
        if not self._zk_connected:
            self._held = rows
            log.warning(
                "engine %s pipeline %s: ZooKeeper session suspended; holding msg_id %s..%s",
                self.engine_id,
                self.pipeline,
                rows[0].msg_id,
                rows[-1].msg_id,
            )
            return 0
        last = self._last_published
        expected = 0 if last is None else last + 1
        if rows[0].msg_id > expected:
            if self._repairing() is not None:
                return 0  # the rewound query brings the missing rows first
            gap = (expected, rows[0].msg_id - 1)
            # A gap a failed repair gave up on is reported already: publish what follows.
            if gap != self._last_published_gap:
                if self._start_repair(*gap):
                    return 0
                self._report_uncovered(*gap)
        try:
            self._publisher.publish(rows, self._epoch)
        except Fenced as exc:
            log.error(
                "engine %s pipeline %s: cannot publish msg_id %s..%s (%s); nothing of it was "
                "committed; stepping down, keeping the rows",
                self.engine_id,
                self.pipeline,
                rows[0].msg_id,
                rows[-1].msg_id,
                exc,
            )
            self.step_down("fenced, or its producer failed")
            if self._on_fenced is not None:
                self._on_fenced()
            return 0
        except TransientPublishError as exc:
            log.warning(
                "engine %s pipeline %s: transaction for msg_id %s..%s aborted (%s); "
                "retrying with the next batch",
                self.engine_id,
                self.pipeline,
                rows[0].msg_id,
                rows[-1].msg_id,
                exc,
            )
            self._held = rows
            return 0
        self._held = []
        self._last_published = rows[-1].msg_id
        self._metrics.published(len(rows))
        repair = self._repairing()
        if repair is not None and self._last_published >= repair.last:
            repair.seconds = round(self._clock() - self._repair_started, 3)
            self._metrics.repaired(repair.last - repair.first + 1)
            log.warning(
                "engine %s pipeline %s: REPAIRED msg_id %s..%s (%s messages) in %.1f s",
                self.engine_id,
                self.pipeline,
                repair.first,
                repair.last,
                repair.last - repair.first + 1,
                repair.seconds,
            )
        log.info(
            "engine %s pipeline %s: batch %s: published msg_id %s..%s (%s rows) at epoch %s",
            self.engine_id,
            self.pipeline,
            batch_id,
            rows[0].msg_id,
            rows[-1].msg_id,
            len(rows),
            self._epoch,
        )
        return len(rows)

    def _report_uncovered(self, first: int, last: int) -> None:
        self._uncovered.append((first, last))
        self._metrics.uncovered(first, last)
        log.error(
            "engine %s pipeline %s: UNCOVERED msg_id %s..%s (%s messages): no engine's "
            "buffer holds them; they are missing from the outbound topics",
            self.engine_id,
            self.pipeline,
            first,
            last,
            last - first + 1,
        )
