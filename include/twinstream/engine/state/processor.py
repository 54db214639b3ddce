"""A pipeline's `Keyed.step` inside Spark: one `transformWithStateInPandas` processor per
inbound partition and micro-batch, every key's state in that partition's store.

Guarantee: the store holds, after each committed batch, exactly the runner's state of
every key (`twinstream.engine.state.keyed`), so a restart, a restore or a replay from the
checkpoint resumes it as if nothing had happened; a cache in the Python worker is used only
when it provably equals the store.

How, and why so: a state call is a round trip to the JVM (~80 µs), so one per key would
cost what `applyInPandasWithState` costs. The store keeps two variables per partition:

- `log`, a ListState of (key, state) entries, pickled: each batch appends the entries of
  the keys it wrote, in one call; a key's latest entry wins, a None state forgets it. When
  the log holds more than twice the live keys it is rewritten with the live ones only
  (`compact`), so its size stays within 2x the state's plus one batch.
- `meta`, a ValueState (token, log length, the partition's clock): the token is random and
  new at every batch. The worker keeps the partition's dict of states from the last batch
  under that token; the next batch finds it under the token the store holds, or rebuilds it
  from `log` (the first batch, after a restart, a retried batch whose cache went ahead of
  the store, another worker). So a batch costs three state calls plus one per 10,000
  written keys, whatever the key count.
"""

from __future__ import annotations

import logging
import pickle
import random
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from twinstream.contract import MSG_ID, RAW, Keyed
from twinstream.core.rows import DLQ, OUT
from twinstream.engine.state.keyed import Partition, Runner

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessorHandle, TimerValues

log = logging.getLogger(__name__)

# The columns a record carries into the processor beside its own: the guard's verdict
# (NULL for a valid record) and the partition it is grouped by.
REASON = "_reason"
PARTITION = "_partition"
KIND = "_kind"
META = "token BIGINT, log_len BIGINT, clock BIGINT"
LOG = "k BINARY, s BINARY"
# Entries per state call: one protobuf message each, well under its size limits.
CHUNK = 10_000
# Partitions' states a worker keeps (the live ones, and those of a query that stopped).
CACHED = 8
# A log shorter than this is not worth rewriting.
COMPACT_MIN = 10_000

_cache: OrderedDict[int, tuple[Partition, int]] = OrderedDict()


def output_schema(keyed_output: str) -> str:
    """The processor's rows: the record, its kind (out, none, dlq or quarantined), a dead
    letter's reason and bytes, and the step's output columns."""
    return f"{MSG_ID} BIGINT, {KIND} STRING, {REASON} STRING, {RAW} BINARY, {keyed_output}"


class KeyedProcessor(StatefulProcessor):
    def __init__(
        self,
        keyed: Keyed,
        key: str,
        inputs: Sequence[str],
        output_columns: Sequence[str],
        integral: Sequence[str] = (),
    ) -> None:
        self.keyed = keyed
        self.key = key
        # The record's columns the step sees (msg_id first, then as the plan selects them
        # after the partition, reason and raw bytes), and which of them are integers (pandas reads
        # a nullable integer column as Int64, whose NULL is pd.NA: the step gets None).
        self.inputs = list(inputs)
        self.integral = set(integral)
        self.columns = list(output_columns)

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.meta = handle.getValueState("meta", META)
        self.log = handle.getListState("log", LOG)
        self.runner = Runner(self.keyed, self.key, self.columns)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        import pandas as pd

        frame = pd.concat(list(rows), ignore_index=True)
        # By position: pyspark builds the frame from itertuples, which renames a column
        # whose name starts with an underscore. The plan selects them in this order.
        frame.columns = [MSG_ID, PARTITION, REASON, RAW, *self.inputs[1:]]
        frame = frame.sort_values(MSG_ID, kind="stable")
        partition, log_len = self._load()
        msg_ids = frame[MSG_ID].tolist()
        reasons = frame[REASON].tolist()
        raws = frame[RAW].tolist()
        valid = [i for i, r in enumerate(reasons) if r is None]
        records = self._records(frame, valid)
        result = self.runner.run(partition, records)
        self.runner.sweep(partition, result.changed)
        log_len = self._write(partition, result.changed, log_len)

        ids: list[int] = list(result.out_ids)
        kinds: list[str] = [OUT] * len(ids)
        letters: list[str | None] = [None] * len(ids)
        raw_out: list[bytes | None] = [None] * len(ids)
        for i, kind, letter in zip(valid, result.kinds, result.letters, strict=True):
            if kind == OUT:
                continue
            ids.append(msg_ids[i])
            kinds.append(kind)
            letters.append(letter)
            raw_out.append(raws[i] if kind == DLQ else None)
        for i, reason in enumerate(reasons):
            if reason is not None:
                ids.append(msg_ids[i])
                # The guard's reason, or "quarantined" (twinstream.engine.pipeline.QUARANTINED).
                kinds.append(reason if reason == "quarantined" else DLQ)
                letters.append(reason)
                raw_out.append(raws[i])
        padding = [None] * (len(ids) - len(result.out_ids))
        columns = {c: [*values, *padding] for c, values in result.outputs.items()}
        yield pd.DataFrame(
            {MSG_ID: ids, KIND: kinds, REASON: letters, RAW: raw_out, **columns}, dtype=object
        )

    def _records(self, frame: pd.DataFrame, rows: list[int]) -> list[dict[str, Any]]:
        """The valid records as dicts, NULL as None."""
        import pandas as pd

        if not rows:
            return []
        picked = frame.iloc[rows]
        columns = []
        for name in self.inputs:
            values = picked[name].tolist()
            if name in self.integral and picked[name].dtype.kind == "f":
                # Only if pandas fell back to float64 for a column with NULLs (the Int64
                # setting not in force): exact up to 2**53.
                values = [None if v != v else int(v) for v in values]
            elif name in self.integral or picked[name].dtype.kind == "f":
                values = [None if v is pd.NA or v != v else v for v in values]
            columns.append(values)
        names = self.inputs
        return [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]

    def _load(self) -> tuple[Partition, int]:
        """The partition's states: the worker's cache if it holds the store's token, else
        rebuilt from the log (logged: it costs a pass over every key of the partition)."""
        meta = self.meta.get()
        if meta is None:
            return Partition(), 0
        token, _, clock = meta
        cached = _cache.pop(int(token), None)
        if cached is not None:
            return cached
        partition = Partition(clock=None if clock is None else int(clock))
        entries = 0
        for k, s in self.log.get():
            entries += 1
            # The store holds only what this processor wrote: no foreign bytes.
            key = pickle.loads(k)  # noqa: S301
            if s is None:
                partition.states.pop(key, None)
                partition.last_seen.pop(key, None)
                continue
            state, last = pickle.loads(s)  # noqa: S301
            partition.states[key] = state
            partition.last_seen.pop(key, None)
            if last is not None:
                partition.last_seen[key] = last
        log.info(
            "keyed state rebuilt from the store: %s keys from %s entries",
            len(partition.states),
            entries,
        )
        return partition, entries

    def _write(self, partition: Partition, changed: dict[Any, Any], log_len: int) -> int:
        """Append the batch's writes to the log (or rewrite it when mostly dead), record a
        new token, and keep the partition's states in the cache under it."""
        live = len(partition.states)
        last_seen = partition.last_seen
        entries: list[tuple[bytes, bytes | None]]
        if log_len + len(changed) > 2 * live + COMPACT_MIN:
            entries = [
                (pickle.dumps(k), pickle.dumps((s, last_seen.get(k))))
                for k, s in partition.states.items()
            ]
            self.log.put(entries[:CHUNK])
            for first in range(CHUNK, len(entries), CHUNK):
                self.log.appendList(entries[first : first + CHUNK])
            log_len = len(entries)
        elif changed:
            entries = [
                (pickle.dumps(k), None if s is None else pickle.dumps((s, last_seen.get(k))))
                for k, s in changed.items()
            ]
            for first in range(0, len(entries), CHUNK):
                self.log.appendList(entries[first : first + CHUNK])
            log_len += len(entries)
        token = random.getrandbits(62)
        self.meta.update((token, log_len, partition.clock))
        _cache[token] = (partition, log_len)
        while len(_cache) > CACHED:
            _cache.popitem(last=False)
        return log_len

    def close(self) -> None:
        pass
