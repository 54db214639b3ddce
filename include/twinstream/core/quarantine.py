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

How the offending offsets are found: the failed batch's offsets are in the checkpoint
(`offsets/N` without `commits/N`). Forgetting `offsets/N` makes Spark plan batch N afresh
from the end of batch N-1, and a restart with `maxOffsetsPerTrigger` half the failed range
splits it: each failure halves the range that fails, so one poison record among n costs
about log2(n) restarts of the query (seconds each), and the batches that pass are
committed and published as usual meanwhile. Once processing has passed the range, the
query is restarted with the normal batch size.

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
from pathlib import Path

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.security import ACL

from twinstream.core.checkpoint import batch_end, end_offsets, forget_batches, numbered
from twinstream.core.rows import clean_reason

log = logging.getLogger(__name__)

# How many times a batch holding one record alone must fail before the record is
# quarantined: once more than needed, so that a passing fault (a broker dying under the
# batch) is never taken for the record's.
CONFIRMATIONS = 2


class QuarantineStore:
    """The pipeline's quarantined offsets in ZooKeeper: one znode per offset under `path`,
    named by the zero-padded offset, holding `{"reason", "engine"}` as JSON."""

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
    """A batch Spark planned and never committed: inbound offsets [start, end)."""

    batch_id: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def failed_batch(checkpoint: Path, topic: str) -> FailedBatch | None:
    """The last planned batch if it was not committed, with its offset range."""
    planned = numbered(checkpoint / "offsets")
    committed = numbered(checkpoint / "commits")
    if not planned or (committed and committed[-1] >= planned[-1]):
        return None
    batch = planned[-1]
    # Partition 0's range: the search over several partitions' ranges is not built yet.
    end = (batch_end(checkpoint, batch, topic) or {}).get(0)
    if batch - 1 in planned:
        start = (batch_end(checkpoint, batch - 1, topic) or {}).get(0)
    else:
        initial = checkpoint / "sources" / "0" / "0"
        start = ((end_offsets(initial, topic) if initial.exists() else None) or {}).get(0)
    if start is None or end is None or end <= start:
        return None
    return FailedBatch(batch, start, end)


def forget_batch(checkpoint: Path, batch_id: int) -> None:
    """Make Spark plan `batch_id` afresh on the next start (it was never committed)."""
    forget_batches(checkpoint, batch_id - 1)


@dataclass(frozen=True)
class Step:
    """What an engine does after a failed batch. `action`:
    - "exclude": offsets in the range are quarantined already (by another engine): restart
      with them excluded;
    - "split": forget the batch and restart with at most `cap` offsets per batch;
    - "retry": run the one-record batch again, to confirm;
    - "quarantine": quarantine `offset`, then restart with it excluded.
    """

    action: str
    cap: int | None = None
    offset: int | None = None


@dataclass
class Bisection:
    """The search for the offending offsets of one failed range, across query restarts."""

    start: int
    end: int
    failures_alone: int = 0

    def covers(self, offset: int) -> bool:
        return self.start <= offset < self.end


def next_step(
    failed: FailedBatch,
    quarantined: Mapping[int, str],
    excluded: Mapping[int, str],
    search: Bisection | None,
) -> tuple[Step, Bisection]:
    """Decide what to do about `failed`, given the shared quarantine, what the failed query
    excluded, and the search so far (None: this is the first failure of the range)."""
    known = sorted(o for o in quarantined if failed.start <= o < failed.end and o not in excluded)
    if search is None or not search.covers(failed.start):
        search = Bisection(failed.start, failed.end)
    else:
        search.start, search.end = failed.start, failed.end
    if known:
        return Step("exclude"), search
    if failed.size > 1:
        search.failures_alone = 0
        return Step("split", cap=math.ceil(failed.size / 2)), search
    search.failures_alone += 1
    if search.failures_alone >= CONFIRMATIONS:
        return Step("quarantine", offset=failed.start), search
    return Step("retry", cap=1), search


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
