"""Keyed state without Spark: the runner gives the same outputs and states whatever the
batch boundaries, for many keys interleaved; the processor keeps the store equal to the
runner's state through cache hits, a retried batch, a new worker and compaction."""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest

from twinstream.contract import ContractError, Keyed, Pipeline, Reject
from twinstream.engine.state import processor as processor_module
from twinstream.engine.state.processor import KeyedProcessor
from twinstream.testing import keyed as keyed_testing

SCHEMA = "user STRING, amount BIGINT, ts_ms BIGINT"


def step(state: tuple[int, int] | None, record: dict[str, Any]) -> tuple[Any, Any]:
    """Per user a count and a total; 13 rejects, 17 raises, 0 forgets the user, 5 emits
    two rows and 7 none."""
    amount = record["amount"]
    if amount == 13:
        raise Reject("out_of_range: thirteen")
    if amount == 17:
        raise ValueError("seventeen")
    if amount == 0:
        return None, None
    count, total = state if state is not None else (0, 0)
    new = (count + 1, total + amount)
    if amount == 7:
        return new, None
    row = {"user": record["user"], "count": new[0], "total": new[1]}
    return new, [row, {**row, "count": -1}] if amount == 5 else row


def pipeline(expire: int | None = None) -> Pipeline:
    return Pipeline(
        name="sessions",
        schema=SCHEMA,
        keyed=Keyed(
            step=step,
            output="user STRING, count BIGINT, total BIGINT",
            state="count BIGINT, total BIGINT",
            expire_after_ms=expire,
            event_time="ts_ms" if expire else None,
        ),
        key="user",
        value=["user", "count", "total"],
        partition_by="user",
    )


def records(count: int, keys: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {
            "msg_id": i,
            "user": f"u{rng.randrange(keys)}",
            "amount": rng.choice([1, 2, 3, 5, 7, 13, 17, 0, 40]),
            "ts_ms": 1_000 * i + rng.randrange(-5_000, 5_000),
        }
        for i in range(count)
    ]


@pytest.mark.parametrize("expire", [None, 20_000])
def test_the_outcome_is_the_same_whatever_the_batch_boundaries(expire):
    given = records(3_000, 400)
    one = keyed_testing.run(pipeline(expire), given, batches=1)
    kinds = {kind for kind, _ in one.records.values()}
    assert kinds == {"out", "none", "dlq"}
    assert len(one.outputs()) > 1_000
    for batches in (2, 7, 100, 3_000):
        many = keyed_testing.run(pipeline(expire), given, batches=batches)
        assert many.records == one.records, batches
        assert many.states == one.states, batches


def test_a_rejected_or_failing_record_is_a_dead_letter_and_leaves_the_state():
    given = [
        {"msg_id": 0, "user": "a", "amount": 2, "ts_ms": 0},
        {"msg_id": 1, "user": "a", "amount": 13, "ts_ms": 0},
        {"msg_id": 2, "user": "a", "amount": 17, "ts_ms": 0},
        {"msg_id": 3, "user": "a", "amount": 3, "ts_ms": 0},
        {"msg_id": 4, "user": "a", "amount": 0, "ts_ms": 0},
        {"msg_id": 5, "user": "a", "amount": 1, "ts_ms": 0},
    ]
    outcome = keyed_testing.run(pipeline(), given)
    assert outcome.records[1] == ("dlq", "out_of_range: thirteen")
    assert outcome.records[2] == ("dlq", "error: ValueError: seventeen")
    assert outcome.records[3][1] == [{"user": "a", "count": 2, "total": 5}]
    assert outcome.records[4] == ("none", [])  # forgotten
    assert outcome.records[5][1] == [{"user": "a", "count": 1, "total": 1}]


def test_a_key_idle_for_the_ttl_in_its_partitions_event_time_is_forgotten():
    given = [
        {"msg_id": 0, "user": "a", "amount": 2, "ts_ms": 0},
        {"msg_id": 1, "user": "b", "amount": 2, "ts_ms": 10_000},
        {"msg_id": 2, "user": "a", "amount": 3, "ts_ms": 10_000},  # idle 10 s: kept
        {"msg_id": 3, "user": "b", "amount": 2, "ts_ms": 40_001},
        {"msg_id": 4, "user": "a", "amount": 4, "ts_ms": 11_000},  # clock 40 001: gone
    ]
    outcome = keyed_testing.run(pipeline(expire=30_000), given)
    assert outcome.records[2][1] == [{"user": "a", "count": 2, "total": 5}]
    assert outcome.records[4][1] == [{"user": "a", "count": 1, "total": 4}]


def test_a_state_that_is_not_the_declared_tuple_is_refused_by_name():
    bad = Pipeline(
        name="bad",
        schema=SCHEMA,
        keyed=Keyed(step=lambda s, r: ({"n": 1}, None), output="user STRING", state="n BIGINT"),
        key="user",
        value=["user"],
        partition_by="user",
    )
    outcome = keyed_testing.run(bad, records(3, 2))
    assert all(
        kind == "dlq" and "Keyed.state declares a tuple of 1 (n)" in reason
        for kind, reason in outcome.records.values()
    )


def test_the_contract_refuses_a_keyed_pipeline_without_its_key_or_with_both_forms():
    keyed = Keyed(step=step, output="user STRING", state="n BIGINT")
    with pytest.raises(ContractError, match="set partition_by"):
        Pipeline(name="p", schema=SCHEMA, keyed=keyed, key="user", value=["user"])
    with pytest.raises(ContractError, match="exactly one of them"):
        Pipeline(
            name="p",
            schema=SCHEMA,
            keyed=keyed,
            transform=lambda df: df,
            value=["user"],
            partition_by="user",
        )
    with pytest.raises(ContractError, match="does not declare"):
        Pipeline(name="p", schema=SCHEMA, keyed=keyed, value=["total"], partition_by="user")
    with pytest.raises(ContractError, match="go together"):
        Keyed(step=step, output="user STRING", state="n BIGINT", expire_after_ms=5)


# -- the processor against a store in memory ---------------------------------------------


class Store:
    """The two state variables of one partition, with the commit a batch makes."""

    def __init__(self) -> None:
        self.meta: tuple[Any, ...] | None = None
        self.log: list[tuple[bytes, bytes | None]] = []
        self.reads = 0

    def copy(self) -> tuple[Any, list[Any]]:
        return self.meta, list(self.log)


class Value:
    def __init__(self, store: Store) -> None:
        self.store = store

    def get(self) -> Any:
        return self.store.meta

    def update(self, value: tuple[Any, ...]) -> None:
        self.store.meta = value


class Log:
    def __init__(self, store: Store) -> None:
        self.store = store

    def get(self) -> Iterator[tuple[bytes, bytes | None]]:
        self.store.reads += 1
        return iter(list(self.store.log))

    def put(self, values: list[Any]) -> None:
        self.store.log = list(values)

    def appendList(self, values: list[Any]) -> None:
        self.store.log.extend(values)


class Handle:
    def __init__(self, store: Store) -> None:
        self.store = store

    def getValueState(self, name: str, schema: str) -> Value:
        return Value(self.store)

    def getListState(self, name: str, schema: str) -> Log:
        return Log(self.store)


def frame(given: list[dict[str, Any]]) -> pd.DataFrame:
    """The rows as pyspark hands them to the processor (columns by position)."""
    return pd.DataFrame(
        {
            "msg_id": [r["msg_id"] for r in given],
            "_partition": [0] * len(given),
            "_reason": [None] * len(given),
            "_raw": [b"{}"] * len(given),
            "user": [r["user"] for r in given],
            "amount": pd.array([r["amount"] for r in given], dtype="Int64"),
            "ts_ms": pd.array([r["ts_ms"] for r in given], dtype="Int64"),
        }
    )


def processor(store: Store) -> KeyedProcessor:
    p = pipeline()
    assert p.keyed is not None
    proc = KeyedProcessor(
        p.keyed, "user", ["msg_id", "user", "amount", "ts_ms"], ["user", "count", "total"]
    )
    proc.init(Handle(store))  # type: ignore[arg-type]
    return proc


def outputs(proc: KeyedProcessor, given: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    (out,) = list(proc.handleInputRows((0,), iter([frame(given)]), None))  # type: ignore[arg-type]
    names = ["msg_id", "_kind", "_reason", "user", "count", "total"]
    columns = [out[name].tolist() for name in names]
    return sorted((int(row[0]), *row[1:]) for row in zip(*columns, strict=True))


def test_the_processor_keeps_the_store_equal_to_the_runner_through_retries_and_new_workers(
    monkeypatch,
):
    monkeypatch.setattr(processor_module, "_cache", OrderedDict())
    monkeypatch.setattr(processor_module, "COMPACT_MIN", 50)
    given = records(4_000, 300, seed=3)
    slices = [given[i : i + 250] for i in range(0, len(given), 250)]
    store = Store()
    seen: list[tuple[Any, ...]] = []
    proc = processor(store)
    for number, part in enumerate(slices):
        before = store.copy()
        got = outputs(proc, part)
        if number == 5:
            # The batch failed after Python ran (the sink, say): Spark rolls the store
            # back and runs it again. The cache went ahead of the store: not used.
            store.meta, store.log = before
            reads = store.reads
            assert outputs(proc, part) == got
            assert store.reads == reads + 1
        if number == 9:
            # Another Python worker (or a restarted engine) takes over: empty cache.
            processor_module._cache.clear()
            proc = processor(store)
        seen.extend(got)
        # The log stays within twice the live keys plus the batch's writes.
        assert len(store.log) <= 2 * 300 + processor_module.COMPACT_MIN + 250
    assert store.reads == 2  # the retry and the new worker: every other batch hit the cache
    reference = keyed_testing.run(pipeline(), given)
    expected = []
    for msg_id, (kind, rows) in reference.records.items():
        if kind == "out":
            expected += [(msg_id, "out", None, r["user"], r["count"], r["total"]) for r in rows]
        elif kind == "none":
            expected.append((msg_id, "none", None, None, None, None))
        else:
            expected.append((msg_id, "dlq", rows, None, None, None))
    assert sorted(seen) == sorted(expected)
    # And the store, read afresh, holds exactly the runner's states.
    processor_module._cache.clear()
    partition, _ = processor(store)._load()
    assert partition.states == reference.states[0]


def test_an_output_naming_an_undeclared_column_is_a_dead_letter_not_a_dropped_value():
    odd = Pipeline(
        name="odd",
        schema=SCHEMA,
        keyed=Keyed(
            step=lambda s, r: ((1,), {"user": r["user"], "totl": 3}),
            output="user STRING, total BIGINT",
            state="n BIGINT",
        ),
        key="user",
        value=["user", "total"],
        partition_by="user",
    )
    outcome = keyed_testing.run(odd, records(2, 2))
    assert outcome.records[0] == (
        "dlq",
        "error: the step's output names ['totl'], which Keyed.output does not declare "
        "(user, total)",
    )
    assert outcome.states == {0: {}}


def test_a_rejected_record_still_moves_its_keys_time_in_the_store(monkeypatch):
    """A key accepted at 0 s, rejected at 25 s (its state kept, its last time now 25 s),
    then seen at 40 s with a 30 s ttl: alive. A partition rebuilt from the store in
    between (a restart, another worker) must agree: the store learnt the 25 s."""
    monkeypatch.setattr(processor_module, "_cache", OrderedDict())
    given = [
        {"msg_id": 0, "user": "a", "amount": 2, "ts_ms": 0},
        {"msg_id": 1, "user": "a", "amount": 13, "ts_ms": 25_000},
        {"msg_id": 2, "user": "b", "amount": 1, "ts_ms": 40_000},
        {"msg_id": 3, "user": "a", "amount": 3, "ts_ms": 40_000},
    ]
    reference = keyed_testing.run(pipeline(expire=30_000), given)
    assert reference.records[3][1] == [{"user": "a", "count": 2, "total": 5}]
    store = Store()

    def fresh() -> KeyedProcessor:
        processor_module._cache.clear()
        p = pipeline(expire=30_000)
        assert p.keyed is not None
        proc = KeyedProcessor(
            p.keyed, "user", ["msg_id", "user", "amount", "ts_ms"], ["user", "count", "total"]
        )
        proc.init(Handle(store))  # type: ignore[arg-type]
        return proc

    seen = [row for record in given for row in outputs(fresh(), [record])]
    assert (3, "out", None, "a", 2, 5) in seen
