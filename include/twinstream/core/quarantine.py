"""Quarantine: the last line behind the per-record guard.

Guarantee: when a micro-batch fails anyway (a bug in a transform, an error in the JVM,
anything the guard did not foresee), the engine finds the inbound offsets that make it fail
by itself, without a person, and no good record is skipped: an offset is quarantined only
after a micro-batch holding that record alone has failed `CONFIRMATIONS` times while Kafka
answered. Quarantined offsets live in ZooKeeper under the pipeline's path (with its ACL),
shared by every engine of the pipeline: an engine reads them before it excludes anything,
and the first engine's reason is the one every engine uses, so every replica emits the same
dead letter `quarantined: <exception class>: <message>` for the offset and keeps the same
state (a quarantined record never reaches the transform).

Records are named by record id (`twinstream.core.rows.record_id`: the offset itself on
partition 0), so one search and one quarantine serve any number of partitions.

How the offending records are found: the failed batch's offsets are in the checkpoint
(`offsets/N` without `commits/N`), and Spark runs such a batch again on the next start with
exactly those offsets. Narrowing `offsets/N` to half the suspected records (the first half
in partition, offset order; every other partition reading nothing) and restarting splits
it: a batch that fails again holds the offender; one that passes is committed and
published as usual, and the batch Spark plans next begins after it. Each failure halves the
suspects, so one poison record among n costs about log2(n) restarts of the query (seconds
each). (A cap on the batch size cannot split several partitions: Spark's rate limit gives
every partition with a backlog a share.)

Releasing an offset (`twinstream quarantine release`) removes it from the set: its dead
letter stays published (exactly once per offset), and a later replay of that offset (a
restore from an earlier snapshot, a cold rebuild) processes it normally.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.security import ACL

from twinstream.core.checkpoint import batch_end, end_offsets, forget_batches, numbered
from twinstream.core.rows import clean_reason, range_text, record_id, split_record_id
from twinstream.platform.storage import Location

log = logging.getLogger(__name__)

# How many times a batch holding one record alone must fail before the record is
# quarantined: once more than needed, so that a passing fault (a broker dying under the
# batch) is never taken for the record's.
CONFIRMATIONS = 2


class QuarantineStore:
    """The pipeline's quarantined records in ZooKeeper: one znode per record under `path`,
    named by its zero-padded record id (on partition 0 the offset), holding
    `{"reason", "engine"}` as JSON."""

    def __init__(self, client: KazooClient, path: str, acl: list[ACL] | None = None) -> None:
        self._client = client
        self._path = path
        self._acl = acl

    def _node(self, offset: int) -> str:
        return f"{self._path}/{offset:020d}"

    def entries(self) -> dict[int, str]:
        """offset -> reason, for every quarantined offset."""
        try:
            children = self._client.get_children(self._path)
        except NoNodeError:
            return {}
        found = {}
        for child in children:
            with contextlib.suppress(NoNodeError):  # released meanwhile
                data, _ = self._client.get(f"{self._path}/{child}")
                found[int(child)] = json.loads(data.decode())["reason"]
        return found

    def add(self, offset: int, reason: str, engine_id: str) -> str:
        """Quarantine `offset`; returns the reason in force (another engine's, if it was
        first), so that every engine writes the same dead letter."""
        value = json.dumps({"reason": clean_reason(reason), "engine": engine_id}).encode()
        with contextlib.suppress(NodeExistsError):  # another engine was first
            self._client.create(self._node(offset), value, acl=self._acl, makepath=True)
        data, _ = self._client.get(self._node(offset))
        stored: str = json.loads(data.decode())["reason"]
        return stored

    def release(self, offset: int) -> bool:
        """Remove `offset` from the quarantine; False if it was not quarantined."""
        try:
            self._client.delete(self._node(offset))
        except NoNodeError:
            return False
        return True


@dataclass(frozen=True)
class FailedBatch:
    """A batch Spark planned and never committed: in each partition, inbound offsets from
    `starts[p]` (where the last committed batch ended) up to `ends[p]` (exclusive)."""

    batch_id: int
    starts: dict[int, int]
    ends: dict[int, int]

    def ranges(self) -> dict[int, tuple[int, int]]:
        """[start, end) of every partition the batch reads records from. A partition the
        starts do not name is new to the query, which reads it from its first offset."""
        found = {p: (self.starts.get(p, 0), end) for p, end in sorted(self.ends.items())}
        return {p: r for p, r in found.items() if r[1] > r[0]}

    @property
    def size(self) -> int:
        return sum(end - start for start, end in self.ranges().values())

    def holds(self, record: int) -> bool:
        partition, offset = split_record_id(record)
        start, end = self.ranges().get(partition, (0, 0))
        return start <= offset < end

    def describe(self) -> str:
        """`msg_id 100..349` on partition 0 alone, `0:100..0:349, 2:7..2:9` across several."""
        text = ", ".join(range_text(p, s, e - 1) for p, (s, e) in self.ranges().items())
        return f"msg_id {text or 'none'}"


def failed_batch(checkpoint: Location, topic: str) -> FailedBatch | None:
    """The last planned batch if it was not committed, with its offset ranges."""
    planned = numbered(checkpoint / "offsets")
    committed = numbered(checkpoint / "commits")
    if not planned or (committed and committed[-1] >= planned[-1]):
        return None
    batch = planned[-1]
    ends = batch_end(checkpoint, batch, topic)
    if batch - 1 in planned:
        starts = batch_end(checkpoint, batch - 1, topic)
    else:
        initial = checkpoint / "sources" / "0" / "0"
        starts = end_offsets(initial, topic) if initial.exists() else None
    if starts is None or ends is None:
        return None
    failed = FailedBatch(batch, starts, ends)
    return failed if failed.size > 0 else None


def forget_batch(checkpoint: Location, batch_id: int) -> None:
    """Make Spark plan `batch_id` afresh on the next start (it was never committed)."""
    forget_batches(checkpoint, batch_id - 1)


@dataclass(frozen=True)
class Step:
    """What an engine does after a failed batch. `action`:
    - "exclude": records in the batch are quarantined already (by another engine): restart
      with them excluded;
    - "split": narrow the failed batch to the offsets `ends` (each partition's end; one
      holding half the suspects) and restart: Spark runs it again with those;
    - "retry": run the one-record batch again, to confirm;
    - "quarantine": quarantine `record` (a record id), then restart with it excluded.
    """

    action: str
    ends: dict[int, int] | None = None
    record: int | None = None


@dataclass
class Bisection:
    """The search for the offending record of one failed batch, across query restarts:
    the records still suspected, per partition [start, end), and how often the last one
    failed alone."""

    suspects: dict[int, tuple[int, int]]
    failures_alone: int = 0

    @property
    def size(self) -> int:
        return sum(end - start for start, end in self.suspects.values())


def _intersect(
    a: Mapping[int, tuple[int, int]], b: Mapping[int, tuple[int, int]]
) -> dict[int, tuple[int, int]]:
    both = {p: (max(a[p][0], b[p][0]), min(a[p][1], b[p][1])) for p in a if p in b}
    return {p: r for p, r in both.items() if r[1] > r[0]}


def _first_half(failed: FailedBatch, suspects: Mapping[int, tuple[int, int]]) -> dict[int, int]:
    """Each partition's end for a batch that reads, from where `failed` starts, the first
    half (in partition, offset order) of the suspects and nothing of any other partition."""
    wanted = math.ceil(sum(e - s for s, e in suspects.values()) / 2)
    ends = {p: failed.starts.get(p, 0) for p in failed.ends}
    for partition, (start, end) in sorted(suspects.items()):
        take = min(wanted, end - start)
        ends[partition] = start + take
        wanted -= take
        if wanted == 0:
            break
    return ends


def next_step(
    failed: FailedBatch,
    quarantined: Mapping[int, str],
    excluded: Mapping[int, str],
    search: Bisection | None,
) -> tuple[Step, Bisection]:
    """Decide what to do about `failed`, given the shared quarantine and what the failed
    query excluded (both by record id), and the search so far (None: the first failure).

    The offending record is among the records of every failed batch of the search: the
    suspects are the first failed batch's records, narrowed by each later failure to those
    it held too (a batch of the first half that passed is committed, so the next batch
    starts past it). A failure that holds none of them starts a new search."""
    if any(failed.holds(r) and r not in excluded for r in quarantined):
        return Step("exclude"), search or Bisection(failed.ranges())
    ranges = failed.ranges()
    suspects = _intersect(search.suspects, ranges) if search is not None else {}
    if search is None or not suspects:
        search = Bisection(ranges)
    elif suspects != search.suspects:
        search.suspects = suspects
    if search.size == 1 and failed.size == 1:
        search.failures_alone += 1
        if search.failures_alone >= CONFIRMATIONS:
            ((partition, (offset, _)),) = search.suspects.items()
            return Step("quarantine", record=record_id(partition, offset)), search
        return Step("retry"), search
    search.failures_alone = 0
    return Step("split", ends=_first_half(failed, search.suspects)), search


def describe(error: BaseException | str) -> str:
    """`<exception class>: <message>` of a failed batch, its first meaningful line: Spark
    wraps a Python worker's exception in many lines of JVM trace."""
    if isinstance(error, str):
        return clean_reason(error)
    text = str(error).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # A Python worker's own exception is the last "Xxx: message" line of its traceback.
    python = [line for line in lines if _looks_like_exception(line)]
    message = python[-1] if python else (lines[0] if lines else "")
    return clean_reason(f"{type(error).__name__}: {message}")


def _looks_like_exception(line: str) -> bool:
    head, sep, _ = line.partition(": ")
    return bool(sep) and head.isidentifier() and head.endswith(("Error", "Exception"))


def quarantine_reason(description: str) -> str:
    return clean_reason(f"quarantined: {description}")
