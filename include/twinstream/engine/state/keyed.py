"""One partition's records through a pipeline's `Keyed.step`, in msg_id order.

Guarantee: the outputs and the state after a partition's records are those of calling
`step` record by record on them in msg_id order, whatever the batch boundaries: each key's
state is its last `new_state`, a step that raises leaves it as it was, and a key expires
(`Keyed.expire_after_ms`) at the same record on every engine, because the partition's
clock is the newest event time of its records so far, in msg_id order.

Cost: per record one dict lookup and one call of the step; per batch one pass. No object
per key per batch beyond what the step builds. The state of every key lives in one dict
(`Partition.states`); `changed` collects the keys a batch wrote, for the store's log.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from twinstream.contract import MSG_ID, Keyed, Reject
from twinstream.core.rows import DLQ as LETTER
from twinstream.core.rows import NONE, OUT

# A reason is at most this long: a step's exception message can be anything.
MAX_REASON = 500


@dataclass
class Partition:
    """Everything the runner knows of one inbound partition: every live key's state, and
    with expiry each key's latest event time and the partition's clock."""

    states: dict[Any, Any] = field(default_factory=dict)
    last_seen: dict[Any, int] = field(default_factory=dict)
    clock: int | None = None


@dataclass
class Result:
    """A batch's outcome, one entry per record in msg_id order (`kinds`, `letters`) and
    one per output (`out_ids`, `outputs`: column -> values)."""

    kinds: list[str] = field(default_factory=list)
    letters: list[str | None] = field(default_factory=list)
    out_ids: list[int] = field(default_factory=list)
    outputs: dict[str, list[Any]] = field(default_factory=dict)
    # key -> new state (None: forgotten), the keys this batch wrote or expired.
    changed: dict[Any, Any] = field(default_factory=dict)


class Runner:
    """Runs `keyed.step` for a pipeline whose key is the record's member `key`."""

    def __init__(self, keyed: Keyed, key: str, output_columns: Sequence[str]) -> None:
        self.step = keyed.step
        self.key = key
        self.columns = list(output_columns)
        self.known = frozenset(self.columns)
        self.ttl = keyed.expire_after_ms
        self.event_time = keyed.event_time

    def run(self, partition: Partition, records: Iterable[Mapping[str, Any]]) -> Result:
        """`records` (dicts with msg_id, the key and the step's inputs) in msg_id order."""
        result = Result(outputs={c: [] for c in self.columns})
        states = partition.states
        changed = result.changed
        kinds, letters = result.kinds, result.letters
        step, key_name, ttl = self.step, self.key, self.ttl
        for record in records:
            key = record[key_name]
            state = states.get(key)
            if ttl is not None:
                state = self._expire(partition, key, state, record, changed)
            try:
                new_state, outputs = step(state, dict(record))
            except Reject as exc:
                kinds.append(LETTER)
                letters.append(str(exc)[:MAX_REASON])
                continue
            except Exception as exc:  # every failure on a record's path is its dead letter
                kinds.append(LETTER)
                letters.append(f"error: {type(exc).__name__}: {exc}"[:MAX_REASON])
                continue
            unknown = self._unknown(outputs)
            if unknown:
                kinds.append(LETTER)
                letters.append(
                    f"error: the step's output names {unknown}, which Keyed.output does not "
                    f"declare ({', '.join(self.columns)})"[:MAX_REASON]
                )
                continue
            if new_state is None:
                if key in states:
                    del states[key]
                    partition.last_seen.pop(key, None)
                    changed[key] = None
            else:
                states[key] = new_state
                changed[key] = new_state
            emitted = self._emit(result, record[MSG_ID], outputs)
            kinds.append(OUT if emitted else NONE)
            letters.append(None)
        return result

    def _expire(
        self,
        partition: Partition,
        key: Any,
        state: Any,
        record: Mapping[str, Any],
        changed: dict[Any, Any],
    ) -> Any:
        """The key's state as the record sees it: None if the key has been idle for the ttl
        by the partition's clock. Advances the clock and the key's last time."""
        assert self.ttl is not None
        assert self.event_time is not None
        moment = record.get(self.event_time)
        clock = partition.clock
        if moment is not None:
            clock = moment if clock is None else max(clock, moment)
            partition.clock = clock
        last = partition.last_seen.get(key)
        if state is not None and last is not None and clock is not None and clock - last > self.ttl:
            state = None
            del partition.states[key]
            changed[key] = None
        if moment is not None:
            # Moved to the end: `last_seen` is in the order keys were last written.
            partition.last_seen.pop(key, None)
            partition.last_seen[key] = (
                moment if last is None or state is None else max(last, moment)
            )
            if state is not None:
                # Its last time moved: the store must learn it even if the step then rejects
                # the record, or a partition rebuilt from the store expires the key earlier.
                changed[key] = state
        return state

    def sweep(self, partition: Partition, changed: dict[Any, Any], budget: int = 10_000) -> int:
        """Forget up to `budget` keys idle for the ttl (the oldest written first). Their
        next record would see None anyway (`_expire`), so when a key is swept does not
        change any output: only the memory it takes."""
        if self.ttl is None or partition.clock is None:
            return 0
        cutoff = partition.clock - self.ttl
        gone = 0
        for key, last in list(partition.last_seen.items())[:budget]:
            if last >= cutoff:
                break
            del partition.last_seen[key]
            if partition.states.pop(key, None) is not None:
                changed[key] = None
            gone += 1
        return gone

    def _unknown(self, outputs: Any) -> list[str]:
        """Columns an output names that `Keyed.output` does not: its record is a dead letter
        (its state unchanged), never a value silently dropped."""
        if outputs is None:
            return []
        rows = [outputs] if isinstance(outputs, Mapping) else outputs
        known = self.known
        return sorted({str(c) for row in rows for c in row if c not in known})

    def _emit(self, result: Result, msg_id: int, outputs: Any) -> int:
        if outputs is None:
            return 0
        rows = [outputs] if isinstance(outputs, Mapping) else outputs
        count = 0
        for row in rows:
            result.out_ids.append(msg_id)
            for column, values in result.outputs.items():
                values.append(row.get(column))
            count += 1
        return count
