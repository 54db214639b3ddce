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

Partitions: a record's identity is (partition, msg_id), msg_id being its offset in that
inbound partition. Everything above holds per partition: each has its own buffer (of at
least `num_buffered_msgs` rows), its own last published msg_id, its own gaps and repairs;
one transaction still covers a batch's rows of every partition. `max_buffered_msgs` bounds
the rows of all partitions together (raised to partitions x `num_buffered_msgs` if lower).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import takewhile
from typing import Protocol

from twinstream.core.agreement import NOT_HELD, NOT_YET, Held
from twinstream.core.logs import EngineLog
from twinstream.core.rows import Output, range_text, span

_module_log = logging.getLogger(__name__)

# Partition -> msg_id: how far something has got in each inbound partition.
Positions = Mapping[int, int]


def merge(*sources: Iterable[Output]) -> list[Output]:
    """The rows of every (partition, msg_id) in any source, in that order, each msg_id's
    rows taken whole from the first source that has it (sources hold the same rows for a
    msg_id: engines compute deterministically)."""
    groups: dict[tuple[int, int], list[Output]] = {}
    for source in sources:
        mine: dict[tuple[int, int], list[Output]] = {}
        for row in source:
            if row.position not in groups:
                mine.setdefault(row.position, []).append(row)
        groups.update(mine)
    return [row for position in sorted(groups) for row in groups[position]]


def by_partition(rows: Iterable[Output]) -> dict[int, list[Output]]:
    """Rows grouped by partition, each group in the order given."""
    groups: dict[int, list[Output]] = {}
    for row in rows:
        groups.setdefault(row.partition, []).append(row)
    return groups


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
    """A range no buffer covered at a takeover, recomputed: msg_id first..last of a
    partition, and how long it took (None while in progress)."""

    first: int
    last: int
    seconds: float | None = None
    partition: int = 0


@dataclass(frozen=True)
class Uncovered:
    """msg_id first..last of a partition: in no buffer, missing from the output."""

    partition: int
    first: int
    last: int


@dataclass
class TakeoverRecord:
    """One takeover by this engine: when it won (wall clock, epoch seconds), how long
    fencing and reading the last published msg_id took, and how long after winning its
    first transaction as active was committed (None until then)."""

    epoch: int
    at: float
    fence_and_read_s: float
    first_commit_s: float | None = None


# The takeovers an engine remembers for its status: an operator looks at the last few.
TAKEOVER_HISTORY = 10


@dataclass
class GateStatus:
    role: str
    epoch: int
    zk_connected: bool
    # With one partition (0), its msg_ids; with several, None: see `processed`/`published`.
    last_msg_id_processed: int | None
    last_msg_id_published: int | None
    buffer_fill: int
    # The bound of each partition's buffer (num_buffered_msgs): a takeover replays one
    # partition's rows from that partition's buffer alone.
    buffer_size: int
    uncovered_ranges: list[Uncovered] = field(default_factory=list)
    # Rows the active holds that it could not publish yet.
    unpublished: int = 0
    # Why the query is paused (backpressure), if it is.
    paused: str | None = None
    repairs: list[Repair] = field(default_factory=list)
    # Per partition: the last msg_id buffered, and the last published as this engine knows it.
    processed: dict[int, int] = field(default_factory=dict)
    published: dict[int, int] = field(default_factory=dict)
    # This engine's last takeovers, newest first.
    takeovers: list[TakeoverRecord] = field(default_factory=list)
    # Per partition: the rows buffered (each against buffer_size; buffer_fill is their sum).
    buffer_fills: dict[int, int] = field(default_factory=dict)


class _Partition:
    """One inbound partition's rows and positions (the gate's lock guards it)."""

    def __init__(self) -> None:
        # In msg_id order. At least the last `buffer_size` rows; more while they are above
        # the active's last published msg_id (see Gate._trim).
        self.buffer: deque[Output] = deque()
        # The active's last published msg_id as this standby last read it; None: unknown.
        self.published_elsewhere: int | None = None
        self.last_processed: int | None = None
        self.last_published: int | None = None
        # A gap given up on (reported): rows after it are then published as they are.
        self.given_up_gap: tuple[int, int] | None = None

    def floor_blocks(self) -> bool:
        """Whether the oldest row is one the active has not published (or may not have)."""
        floor = self.published_elsewhere
        return bool(self.buffer) and (floor is None or self.buffer[0].msg_id > floor)


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
        wall_clock: Callable[[], float] = time.time,
        on_gap: Callable[[int, int, int], bool] | None = None,
        on_fenced: Callable[[], None] | None = None,
        on_committed: Callable[[Sequence[Output]], None] | None = None,
        log: EngineLog | None = None,
    ) -> None:
        self.engine_id = engine_id
        # "engine <id> pipeline <name>: " before every line (the engine's, or its own).
        self._log = (log or EngineLog(_module_log, engine_id, pipeline)).named(__name__)
        # Told of every committed transaction's rows, after the commit (a report, such as
        # their latency: it can neither delay nor fail a publish).
        self._on_committed = on_committed
        self.pipeline = pipeline
        self._parts: dict[int, _Partition] = {}
        self._buffer_size = buffer_size
        self._max_buffer_size = max(buffer_size, max_buffer_size or buffer_size)
        self._sleep = sleep
        self._clock = clock
        self._wall_clock = wall_clock
        self._paused: str | None = None
        # Bumped when the query is being stopped: a paused batch then returns at once; and
        # no batch pauses until the next query starts.
        self._generation = 0
        self._stopping = False
        # Asked to recompute (partition, first, last), a range no buffer covers; True: it
        # will (see `rewind`).
        self._on_gap = on_gap
        # The active's producer can publish no more (fenced, or failed for good): leave the
        # leadership, so that the next active (this engine again, perhaps) fences anew.
        self._on_fenced = on_fenced
        self._repairs: list[Repair] = []
        self._repair_started = 0.0
        self._lock = threading.RLock()
        self._metrics = metrics or NoMetrics()
        self._role = "none"
        self._epoch = 0
        self._zk_connected = False
        self._publisher: Publisher | None = None
        self._uncovered: list[Uncovered] = []
        # While active: rows whose commit failed or was held (SUSPENDED), in (partition,
        # msg_id) order, kept even if the ring has dropped them, until they are published.
        self._held: list[Output] = []
        # When this engine last took over, until its first transaction as active is
        # committed: that moment is logged, the part of a takeover a reader waits for.
        self._took_over_at: float | None = None
        self._takeovers: deque[TakeoverRecord] = deque(maxlen=TAKEOVER_HISTORY)

    def _part(self, partition: int) -> _Partition:
        part = self._parts.get(partition)
        if part is None:
            part = self._parts[partition] = _Partition()
        return part

    # -- what the streaming query calls -------------------------------------------------

    def on_batch(self, batch_id: int, rows: Sequence[Output]) -> int:
        """Take one batch's rows (any order). Returns how many were published, at once or
        while the batch was paused for room (see the module doc)."""
        published = self._take(batch_id, rows)
        return published + self._wait_for_room(batch_id)

    def _take(self, batch_id: int, rows: Sequence[Output]) -> int:
        with self._lock:
            fresh: list[Output] = []
            for partition, group in sorted(by_partition(rows).items()):
                part = self._part(partition)
                newest = part.buffer[-1].msg_id if part.buffer else -1
                mine = sorted((r for r in group if r.msg_id > newest), key=lambda r: r.msg_id)
                fresh += mine
            if len(fresh) < len(rows):
                self._log.info(
                    "batch %s repeats %s rows already buffered (replay after restart); dropped",
                    batch_id,
                    len(rows) - len(fresh),
                )
            # The batch may be larger than the buffer: what the active publishes is taken
            # before the ring drops anything.
            # A standby never publishes from here: it skips the work on every batch.
            pending = self._pending(fresh) if self._role == "active" else []
            for partition, group in by_partition(fresh).items():
                part = self._parts[partition]
                part.buffer.extend(group)
                part.last_processed = group[-1].msg_id
            self._trim()
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

    def _bound(self) -> int:
        return max(self._max_buffer_size, len(self._parts) * self._buffer_size)

    def _fill(self) -> int:
        return sum(len(p.buffer) for p in self._parts.values())

    def _over_bound(self) -> bool:
        if self._role == "active":
            return len(self._held) >= self._bound()
        return self._fill() >= self._bound() and any(p.floor_blocks() for p in self._parts.values())

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
                    self._log.warning(
                        "batch %s: query paused: %s",
                        batch_id,
                        self._paused,
                    )
                    self._metrics.paused(True)
            self._sleep(backoff)
            backoff = min(backoff * 2, 2.0)
        with self._lock:
            if self._paused is not None:
                self._log.warning(
                    "batch %s: query resumed after %.1f s paused",
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
                f"{self._bound()}); retrying the publish until Kafka takes them"
            )
        elsewhere = {p: part.published_elsewhere for p, part in sorted(self._parts.items())}
        position = elsewhere.get(0) if list(elsewhere) == [0] else elsewhere
        return (
            f"{self._fill()} buffered rows above the active's last published msg_id "
            f"{position} (max_buffered_msgs {self._bound()}); waiting for the active to publish"
        )

    def note_published(self, positions: Positions) -> None:
        """A standby learns the active's last published msg_id of each partition: rows above
        it are kept beyond `buffer_size` until it has passed them (the query pauses at the
        bound)."""
        with self._lock:
            for partition, msg_id in positions.items():
                part = self._part(partition)
                if part.published_elsewhere is None or msg_id > part.published_elsewhere:
                    part.published_elsewhere = msg_id
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
        last_committed: Callable[[], Positions],
    ) -> int:
        """Become the active: fence, find the last published msg_id of each partition,
        publish what the buffer holds after it. Returns the number of rows published at
        takeover. A partition `last_committed` does not name starts at msg_id 0."""
        with self._lock:
            started = time.monotonic()
            self._took_over_at = self._clock()
            won_at = self._wall_clock()
            publisher = fence()
            fenced = time.monotonic()
            try:
                last = dict(last_committed())
            except Exception:
                publisher.close()
                raise
            self._log.info(
                "fenced in %.3f s, read the last committed msg_id in %.3f s",
                fenced - started,
                time.monotonic() - fenced,
            )
            self._takeovers.appendleft(
                TakeoverRecord(epoch, won_at, self._clock() - self._took_over_at)
            )
            for partition in last:
                self._part(partition)
            for partition, part in self._parts.items():
                part.last_published = last.get(partition)
            self._publisher = publisher
            self._epoch = epoch
            self._zk_connected = True
            self._set_role("active")
            self._metrics.takeover()
            self._log.warning(
                "ACTIVE at epoch %s; last published msg_id %s, "
                "processed up to msg_id %s, buffer holds %s",
                epoch,
                self._positions("last_published"),
                self._positions("last_processed"),
                "; ".join(
                    f"{span([p.buffer[0], p.buffer[-1]])}" for p in self._parts.values() if p.buffer
                )
                or "nothing",
            )
            return self._publish(self._pending([]), None)

    def resumes_at(self, resume: Callable[[], Positions | None]) -> bool:
        """The new active's query continues at `resume()` (per partition: its checkpoint's
        position, for a query that has processed nothing since it started). A partition of
        which the gate holds nothing, whose query resumes past the last published msg_id + 1,
        has a gap no batch can fill: start its repair now, before the first batch, rather
        than when that batch's rows reach the gate (the batch of an engine restarted after
        both were killed, catching up in a cold JVM, took 11 s of a 30 s target). `resume`
        is read only then: a takeover with rows in hand reads no checkpoint. True: a repair
        was started."""
        with self._lock:
            if self._role != "active" or self._repairing() is not None or self._held:
                return False

            def holds(part: _Partition) -> bool:
                # What the gate holds decides, when the first batch comes.
                return bool(part.buffer) or part.last_processed is not None

            if self._parts and all(holds(part) for part in self._parts.values()):
                return False
            for partition, next_msg_id in sorted((resume() or {}).items()):
                part = self._part(partition)
                if holds(part):
                    continue
                gap = self._gap_before(part, next_msg_id)
                if gap not in (None, part.given_up_gap) and self._start_repair(partition, *gap):
                    return True
            return False

    def _gap_before(self, part: _Partition, msg_id: int) -> tuple[int, int] | None:
        """The msg_ids between the partition's last published one and `msg_id`, the next
        it would publish; None when `msg_id` follows on."""
        expected = 0 if part.last_published is None else part.last_published + 1
        return (expected, msg_id - 1) if msg_id > expected else None

    def _positions(self, name: str) -> object:
        """A position of every partition, for logs: the value alone for partition 0 only."""
        values = {p: getattr(part, name) for p, part in sorted(self._parts.items())}
        return values.get(0) if list(values) in ([0], []) else values

    def step_down(self, reason: str, rejoin: bool = True) -> None:
        with self._lock:
            was = self._role
            if self._publisher is not None:
                self._publisher.close()
                self._publisher = None
            if self._held:
                # What it could not publish stays, as on any standby a row the active has
                # not published does: a takeover (by this engine, re-elected) needs it.
                for partition, held in by_partition(self._held).items():
                    part = self._part(partition)
                    part.buffer = deque(merge(part.buffer, held))
                for part in self._parts.values():
                    part.published_elsewhere = part.last_published
            self._held = []
            self._set_role("standby" if rejoin else "none")
            if was == "active":
                self._log.warning(
                    "stepped down from active (%s); last published msg_id %s",
                    reason,
                    self._positions("last_published"),
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
        parts = dict(self._parts)
        processed = {p: v.last_processed for p, v in parts.items() if v.last_processed is not None}
        published = {p: v.last_published for p, v in parts.items() if v.last_published is not None}
        single = set(parts) <= {0}
        return GateStatus(
            role=self._role,
            epoch=self._epoch,
            zk_connected=self._zk_connected,
            last_msg_id_processed=processed.get(0) if single else None,
            last_msg_id_published=published.get(0) if single else None,
            buffer_fill=sum(len(p.buffer) for p in parts.values()),
            buffer_size=self._buffer_size,
            uncovered_ranges=list(self._uncovered),
            unpublished=len(self._held),
            paused=self._paused,
            repairs=list(self._repairs),
            processed=processed,
            published=published,
            takeovers=[replace(t) for t in list(self._takeovers)],
            buffer_fills={p: len(v.buffer) for p, v in sorted(parts.items())},
        )

    def rows_between(self, partition: int, first: int, last: int) -> Held:
        """This engine's rows of msg_id first..last of a partition, in msg_id order (for the
        agreement check, twinstream.core.agreement); NOT_YET when it has not processed
        `last` yet, NOT_HELD when its buffer does not start at or before `first` (the ring
        drops whole msg_ids only, so a msg_id it holds, it holds whole)."""
        with self._lock:
            part = self._parts.get(partition)
            if part is None or part.last_processed is None or part.last_processed < last:
                return NOT_YET
            if not part.buffer or part.buffer[0].msg_id > first:
                return NOT_HELD
            # The range is near the end of the ring (what the active published last):
            # read back from the end, not through the whole ring.
            found: list[Output] = []
            for row in reversed(part.buffer):
                if row.msg_id < first:
                    break
                if row.msg_id <= last:
                    found.append(row)
            found.reverse()
            return found

    def bound(self) -> int:
        """The most rows the buffers hold before the query pauses (max_buffered_msgs)."""
        with self._lock:
            return self._bound()

    def buffered(self) -> list[Output]:
        """Every buffered row, in (partition, msg_id) order."""
        with self._lock:
            return [r for _, part in sorted(self._parts.items()) for r in part.buffer]

    def rewind(self, next_msg_ids: Positions) -> None:
        """The query has been rewound to recompute from `next_msg_ids` (per partition):
        forget the rows it will bring again, so they are taken as new (not dropped as a
        replay)."""
        with self._lock:
            for partition, next_msg_id in next_msg_ids.items():
                part = self._part(partition)
                while part.buffer and part.buffer[-1].msg_id >= next_msg_id:
                    part.buffer.pop()
                part.last_processed = part.buffer[-1].msg_id if part.buffer else None
            self._held = [
                r
                for r in self._held
                if r.partition not in next_msg_ids or r.msg_id < next_msg_ids[r.partition]
            ]

    def repair_failed(self, why: str) -> None:
        """The engine could not recompute the range: report it as missing, and publish
        what follows it."""
        with self._lock:
            repair = self._repairing()
            if repair is None:
                return
            self._repairs.remove(repair)
            self._log.error(
                "repair of msg_id %s failed: %s",
                range_text(repair.partition, repair.first, repair.last),
                why,
            )
            self._report_uncovered(repair.partition, repair.first, repair.last)
            self._part(repair.partition).given_up_gap = (repair.first, repair.last)
            self._publish(self._pending([]), None)

    def _start_repair(self, partition: int, first: int, last: int) -> bool:
        """Ask the engine to recompute first..last; True: it will, hold everything later."""
        if self._on_gap is None or not self._on_gap(partition, first, last):
            return False
        self._repairs.append(Repair(first, last, partition=partition))
        self._repair_started = self._clock()
        self._log.warning(
            "GAP msg_id %s (%s messages): no buffer holds them; "
            "recomputing them before publishing anything later",
            range_text(partition, first, last),
            last - first + 1,
        )
        return True

    def _repairing(self) -> Repair | None:
        return next((r for r in self._repairs if r.seconds is None), None)

    def restore(self, rows: Sequence[Output]) -> None:
        """Load a snapshot's buffer (or none, for a cold rebuild) into a standby whose query
        is stopped; the restarted query continues after the last row of each partition."""
        with self._lock:
            if self._role == "active":
                raise RuntimeError("an active engine's buffer cannot be replaced")
            self._parts = {}
            for partition, group in by_partition(merge(rows)).items():
                part = self._part(partition)
                part.buffer.extend(group)
                part.last_processed = group[-1].msg_id
            self._held = []
            self._trim()

    @property
    def role(self) -> str:
        return self._role

    # -- internals ----------------------------------------------------------------------

    def _trim(self) -> None:
        """Drop each partition's oldest rows beyond `buffer_size` that nobody needs any more:
        on a standby those the active has published (none while its position is unknown),
        on the active all of them (it keeps its unpublished ones in `_held`), outside the
        election all of them. Never a row a takeover may need: past `max_buffered_msgs`
        the query pauses instead. A msg_id's rows are dropped together or not at all (a
        fan-out may keep a few rows more than `buffer_size`): a msg_id the ring holds, it
        holds whole."""
        for part in self._parts.values():
            buffer = part.buffer
            while len(buffer) > self._buffer_size:
                if self._role == "standby" and part.floor_blocks():
                    break
                head = buffer[0].msg_id
                rows = 1
                while rows < len(buffer) and buffer[rows].msg_id == head:
                    rows += 1
                if len(buffer) - rows < self._buffer_size:
                    break
                for _ in range(rows):
                    buffer.popleft()

    def _set_role(self, role: str) -> None:
        self._role = role
        self._metrics.role(role)

    def _pending(self, fresh: list[Output]) -> list[Output]:
        """Rows above each partition's last published msg_id, in (partition, msg_id)
        order: those held back by a failed or suspended commit, the buffered ones, and the
        new batch's (`fresh`, in that order already)."""

        def unpublished(row: Output) -> bool:
            last = self._parts[row.partition].last_published
            return last is None or row.msg_id > last

        # The ring is in msg_id order: read back from its end only as far as it is
        # unpublished, instead of scanning all num_buffered_msgs rows every batch.
        buffered = [
            row
            for _, part in sorted(self._parts.items())
            for row in list(takewhile(unpublished, reversed(part.buffer)))[::-1]
        ]
        held = [r for r in self._held if unpublished(r)]
        new = [r for r in fresh if unpublished(r)]
        if not held and not buffered:
            # The usual batch of an active that keeps up: `fresh` alone, already in
            # (partition, msg_id) order (`_take`), is what merge would return.
            return new
        return merge(held, buffered, new)

    def _publish(self, rows: list[Output], batch_id: int | None) -> int:
        if self._role != "active" or self._publisher is None:
            return 0
        if not rows:
            return 0
        if not self._zk_connected:
            self._held = rows
            self._log.warning(
                "ZooKeeper session suspended; holding msg_id %s",
                span(rows),
            )
            return 0
        for partition, group in sorted(by_partition(rows).items()):
            part = self._parts[partition]
            gap = self._gap_before(part, group[0].msg_id)
            if gap is None:
                continue
            if self._repairing() is not None:
                return 0  # the rewound query brings the missing rows first
            # A gap a failed repair gave up on is reported already: publish what follows.
            if gap != part.given_up_gap:
                if self._start_repair(partition, *gap):
                    return 0
                self._report_uncovered(partition, *gap)
        publishing = self._clock()
        try:
            self._publisher.publish(rows, self._epoch)
        except Fenced as exc:
            self._log.error(
                "cannot publish msg_id %s (%s); nothing of it was "
                "committed; stepping down, keeping the rows",
                span(rows),
                exc,
            )
            self.step_down("fenced, or its producer failed")
            if self._on_fenced is not None:
                self._on_fenced()
            return 0
        except TransientPublishError as exc:
            self._log.warning(
                "transaction for msg_id %s aborted (%s); retrying with the next batch",
                span(rows),
                exc,
            )
            self._held = rows
            return 0
        self._held = []
        for partition, group in by_partition(rows).items():
            self._parts[partition].last_published = group[-1].msg_id
        self._metrics.published(len(rows))
        if self._on_committed is not None:
            try:
                self._on_committed(rows)
            except Exception:
                self._log.exception("commit report failed")
        if self._took_over_at is not None:
            self._log.info(
                "first transaction as active (msg_id %s, %s rows) "
                "committed %.3f s after taking over; the transaction took %.3f s",
                span(rows),
                len(rows),
                self._clock() - self._took_over_at,
                self._clock() - publishing,
            )
            if self._takeovers and self._takeovers[0].epoch == self._epoch:
                self._takeovers[0].first_commit_s = self._clock() - self._took_over_at
            self._took_over_at = None
        repair = self._repairing()
        published = self._parts.get(repair.partition) if repair is not None else None
        if (
            repair is not None
            and published is not None
            and published.last_published is not None
            and published.last_published >= repair.last
        ):
            repair.seconds = round(self._clock() - self._repair_started, 3)
            self._metrics.repaired(repair.last - repair.first + 1)
            self._log.warning(
                "REPAIRED msg_id %s (%s messages) in %.1f s",
                range_text(repair.partition, repair.first, repair.last),
                repair.last - repair.first + 1,
                repair.seconds,
            )
        self._log.info(
            "batch %s: published msg_id %s (%s rows) at epoch %s",
            batch_id,
            span(rows),
            len(rows),
            self._epoch,
        )
        return len(rows)

    def _report_uncovered(self, partition: int, first: int, last: int) -> None:
        self._uncovered.append(Uncovered(partition, first, last))
        self._metrics.uncovered(first, last)
        self._log.error(
            "UNCOVERED msg_id %s (%s messages): no engine's "
            "buffer holds them; they are missing from the outbound topics",
            range_text(partition, first, last),
            last - first + 1,
        )
