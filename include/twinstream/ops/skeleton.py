"""`twinstream new-pipeline NAME`: a runnable pipeline to start from, with its test, and
its entry for the pipelines file.

Writes `<dir>/<name>/__init__.py`, `pipeline.py` (a pipeline on `twinstream.contract.Keyed`:
per key, a running count and total, one output per valid input, none for a zero amount, a
`Reject` for a total past its limit, idle keys forgotten by event time; every field of
`twinstream.contract.Pipeline` is declared in it, most with a comment) and
`test_pipeline.py` (the step in plain Python, one batch against one per record; a reference
run in a local Spark: outputs as computed, bad records dead-lettered with their reasons,
every input accounted for, one batch against five, the audit's expectations met).
Nothing is overwritten. `pipelines_entry` gives the `pipelines.toml` block to list it.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Sequence
from pathlib import Path

NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")

PIPELINE = '''"""{name}: per key, a running count and total of the amounts (one output per input,
none for a zero amount). Written by `twinstream new-pipeline {name}`: change the schema,
the bounds, the checks and the step to your stream's; keep the one rule, a step
deterministic in msg_id order (see docs/pipelines.md)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

from twinstream.contract import Bound, Keyed, Pipeline, Reject

# The inbound JSON object. Every member is required and not null, but those in `optional`.
SCHEMA = "key STRING, amount DOUBLE, ts STRING, note STRING"
# What the step returns per output (a dict of these columns; msg_id is added for it) and
# what it keeps per key (a tuple of these fields, in order).
OUTPUT = "key STRING, amount DOUBLE, count BIGINT, total DOUBLE"
STATE = "count BIGINT, total DOUBLE"
# One declaration for the guard and the audit: a record with an amount below 0 is a dead
# letter (`out_of_range: amount is below 0`), and `expectations` derive from the same bound.
BOUNDS = {{"amount": Bound(min=0)}}
# A key's total stays below this: well under 2**46 (7e13), from where a double's steps are
# wider than a cent. Only the step can apply it (it needs the key's state): `Reject`.
TOTAL_MAX = 1e12
# A key quiet for this long in event time is forgotten (its next record starts from
# nothing): without it, every key ever seen stays in the state for good.
IDLE_MS = 30 * 24 * 3600 * 1000


def step(
    state: tuple[int, float] | None, record: dict[str, Any]
) -> tuple[tuple[int, float] | None, dict[str, Any] | None]:
    """One valid record of a key, in msg_id order: (the key's new state, its output).

    `state` is what this returned for the key's last record (None for a new or forgotten
    key); `record` holds the schema's members (None for an absent optional one), the
    derived `ts_ms` and `msg_id`. Pure: the same records in the same order give the same
    outputs, however the engines cut them into batches."""
    count, total = state if state is not None else (0, 0.0)
    if record["amount"] == 0:
        return state, None  # nothing to say: no output (the input is still accounted for)
    count, total = count + 1, round(total + record["amount"], 2)
    if total > TOTAL_MAX:
        # The record becomes its dead letter with this reason; the key's state stays.
        raise Reject(f"overflow: the total of {{record['key']!r}} would pass {{TOTAL_MAX:,.0f}}")
    output = {{"key": record["key"], "amount": record["amount"], "count": count, "total": total}}
    return (count, total), output


def expectations() -> list[Any]:
    """What the scheduled audit expects of every published value (Great Expectations),
    on top of its own msg_id checks."""
    import great_expectations.expectations as gxe

    return [
        BOUNDS["amount"].expectation("amount"),
        # A sum of amounts >= 0 is >= 0 (rounded to cents, still >= 0).
        BOUNDS["amount"].expectation("total", of="sum"),
        gxe.ExpectColumnValuesToBeBetween(column="count", min_value=1),
        gxe.ExpectColumnValuesToNotBeNull(column="key"),
    ]


def sample(count: int, seed: int, broken_every: int) -> Iterator[bytes]:
    rng = random.Random(seed)
    for i in range(count):
        record: dict[str, Any] = {{
            "key": f"k-{{rng.randrange(10)}}",
            "amount": round(rng.choice([0.0, rng.uniform(1, 100)]), 2),
            "ts": f"2026-01-01T00:{{i // 60 % 60:02d}}:{{i % 60:02d}}Z",
        }}
        if i % 3 == 0:
            record["note"] = "gift"  # optional: absent in most records
        if broken_every and (i + 1) % broken_every == 0:
            record["amount"] = -1.0  # the bound rejects it
        yield json.dumps(record).encode()


pipeline = Pipeline(
    # Names its topics (<name>.in, .out, .dlq, .progress), ZooKeeper paths and snapshots.
    name="{name}",
    schema=SCHEMA,
    # Members that may be absent or JSON null (the step reads None); type-checked when
    # present with a value.
    optional=("note",),
    bounds=BOUNDS,
    # More rules of a valid record: reason -> SQL condition over the schema's members
    # (what a record alone decides; what needs the key's state, the step rejects).
    checks={{
        "wrong_type: key is empty": "key <> ''",
        "bad_time: ts is not an ISO 8601 time": "try_to_timestamp(ts) IS NOT NULL",
    }},
    # State per key (the key is partition_by): the framework calls step once per valid
    # record in msg_id order and keeps every key's state, at microseconds per record
    # whatever the number of keys (docs/pipelines.md, "Keyed state").
    keyed=Keyed(
        step=step,
        output=OUTPUT,
        state=STATE,
        # Columns Spark computes for the step from a valid record (SQL over the schema).
        derive={{"ts_ms": "unix_millis(try_to_timestamp(ts))"}},
        # Forget a key idle for IDLE_MS by its partition's event time (the same record on
        # every engine; a wall-clock TTL would not be).
        expire_after_ms=IDLE_MS,
        event_time="ts_ms",
    ),
    # Instead of keyed, a function DataFrame -> DataFrame: stateless work (select, explode,
    # SQL), or Spark's own state operators at ~3 ms per key per batch (docs/pipelines.md).
    transform=None,
    key="key",  # the output's Kafka key
    value=["key", "amount", "count", "total"],  # the output's value: to_json of these
    value_format="json",  # or "text": one column the step serialised itself
    # Producers key records by this member, so a key's records share a partition, in
    # order (only a partition's order exists). Keyed state is per this key.
    # `twinstream publish` keys by it.
    partition_by="key",
    expectations=expectations,
    value_schema="key STRING, amount DOUBLE, count BIGINT, total DOUBLE",  # what they read
    sample=sample,  # for `twinstream publish --pipeline {name}` and the tests
    # Spark settings the pipeline needs; the framework's own win where they meet.
    spark_conf={{"spark.sql.session.timeZone": "UTC"}},
    description=__doc__ or "",
    # Your name for this version of the code: engines, status and every output's headers
    # show it with a digest of this folder's code, which sees an undeclared change too.
    version="1",
)
'''

TEST = '''"""{name}'s own tests: the step in plain Python (no Spark, milliseconds), and a reference
run of the whole pipeline in a local Spark (the guard, derive, the step), no stack needed.

    pytest {name}/test_pipeline.py
"""

from __future__ import annotations

import json

from twinstream.platform.settings import load_settings
from twinstream.testing import expect, keyed, reference

from .pipeline import IDLE_MS, pipeline


def test_the_step_counts_forgets_idle_keys_and_rejects_an_overflow():
    day = 24 * 3600 * 1000
    records = [
        {{"msg_id": 0, "key": "a", "amount": 10.0, "ts_ms": 0}},
        {{"msg_id": 1, "key": "a", "amount": 2.5, "ts_ms": day}},
        {{"msg_id": 2, "key": "b", "amount": 1.0, "ts_ms": day + IDLE_MS + 1}},
        # a is idle for longer than IDLE_MS by the partition's clock: it starts again.
        {{"msg_id": 3, "key": "a", "amount": 1.0, "ts_ms": day + IDLE_MS + 2}},
        {{"msg_id": 4, "key": "b", "amount": 2e12, "ts_ms": day + IDLE_MS + 3}},
        {{"msg_id": 5, "key": "b", "amount": 0.0, "ts_ms": day + IDLE_MS + 4}},
    ]
    outcome = keyed.run(pipeline, records)
    totals = [(row["key"], row["count"], row["total"]) for row in outcome.outputs()]
    assert totals == [("a", 1, 10.0), ("a", 2, 12.5), ("b", 1, 1.0), ("a", 1, 1.0)]
    assert outcome.records[4] == ("dlq", "overflow: the total of 'b' would pass 1,000,000,000,000")
    assert outcome.records[5] == ("none", [])
    # The rejected record left b's state as it was; every state is a tuple of Keyed.state.
    assert outcome.states[0] == {{"a": (1, 1.0), "b": (1, 1.0)}}
    # The contract's one rule: the same outputs whatever the batch boundaries.
    assert keyed.run(pipeline, records, batches=6) == outcome


def test_outputs_dead_letters_and_silences_are_as_computed():
    records = [
        b'{{"key": "a", "amount": 10.0, "ts": "2026-01-01T00:00:00Z", "note": "gift"}}',
        b'{{"key": "a", "amount": 0.0, "ts": "2026-01-01T00:00:01Z"}}',
        b'{{"key": "b", "amount": -3.0, "ts": "2026-01-01T00:00:02Z"}}',
        b'{{"key": "a", "amount": 2.5, "ts": "2026-01-01T00:00:03Z", "note": null}}',
        b"not json",
        b'{{"key": "c", "amount": 1.0, "ts": "2026-01-01T00:00:04Z", "note": 7}}',
        b'{{"key": "c", "amount": 1.0, "ts": "yesterday"}}',
        b'{{"key": "c", "amount": 2e12, "ts": "2026-01-01T00:00:05Z"}}',
    ]
    rows = reference.run(pipeline, list(enumerate(records)), load_settings(pipeline="{name}"))
    by_id = {{row.msg_id: row for row in rows}}
    assert sorted(by_id) == [0, 1, 2, 3, 4, 5, 6, 7]  # every input accounted for
    assert json.loads(by_id[0].value) == {{"key": "a", "amount": 10.0, "count": 1, "total": 10.0}}
    assert by_id[1].kind == "none"  # a zero amount: no output (and no note: it is optional)
    assert json.loads(by_id[2].value)["reason"] == "out_of_range: amount is below 0"
    # A null note is an absent one.
    assert json.loads(by_id[3].value) == {{"key": "a", "amount": 2.5, "count": 2, "total": 12.5}}
    assert json.loads(by_id[4].value)["reason"].startswith("not_json: ")
    # Present with a value, an optional member is type-checked.
    assert json.loads(by_id[5].value)["reason"] == "wrong_type: note is BIGINT, want string"
    assert json.loads(by_id[6].value)["reason"] == "bad_time: ts is not an ISO 8601 time"
    # The step's Reject: its reason, word for word.
    assert by_id[7].kind == "dlq"
    assert json.loads(by_id[7].value)["reason"] == (
        "overflow: the total of 'c' would pass 1,000,000,000,000"
    )


def test_the_output_does_not_depend_on_batch_boundaries_and_passes_the_audit():
    records = list(enumerate(pipeline.sample(300, 7, 50)))
    settings = load_settings(pipeline="{name}")
    rows = reference.run(pipeline, records, settings, batches=1)
    assert rows == reference.run(pipeline, records, settings, batches=5)
    # What the guard lets through meets what the audit expects of it.
    assert any(row.kind == "out" for row in rows)
    assert any(row.kind == "dlq" for row in rows)  # the sample's broken records
    assert expect.failed(pipeline, rows) == []
'''


def write(name: str, folder: Path) -> list[Path]:
    """The skeleton's files, written; ValueError for a bad name or an existing folder."""
    if not NAME.match(name) or keyword.iskeyword(name):
        raise ValueError(
            f"{name!r} is not a pipeline name: lower case letters, digits and _, starting "
            "with a letter (it names a Python package and Kafka topics)"
        )
    package = folder / name
    if package.exists():
        raise ValueError(f"{package} exists already: choose another name or folder")
    package.mkdir(parents=True)
    files = {
        "__init__.py": f'"""The {name} pipeline (twinstream new-pipeline)."""\n',
        "pipeline.py": PIPELINE.format(name=name),
        "test_pipeline.py": TEST.format(name=name),
    }
    written = []
    for filename, text in files.items():
        path = package / filename
        path.write_text(text)
        written.append(path)
    return written


def pipelines_entry(
    name: str, free: Sequence[tuple[str, int]], partitions: int = 3, package: str = ""
) -> str:
    """The pipelines-file block that lists pipeline `name`, each key with a comment: its
    module (the skeleton's, in `package`: "pipelines" for the folder beside the pipelines
    file, "" for a folder on the path), its partitions, and the engines and admin ports `free` gives
    ((engine id, admin port) pairs no pipeline of the stack uses:
    `twinstream.platform.registry.free_engines`)."""
    if not free:
        raise ValueError(
            "no free engine ids: every letter is taken by a pipeline of the stack; remove a "
            "pipeline or name engines of your own in the entry"
        )
    module = f"{package}.{name}.pipeline" if package else f"{name}.pipeline"
    engines = ", ".join(f'"{engine}"' for engine, _ in free)
    ports = ", ".join(str(port) for _, port in free)
    return (
        f"[{name}]\n"
        f'module = "{module}"  # module[:attribute]; this file\'s folder is on the path\n'
        f"partitions = {partitions}  # of its four topics; Kafka cannot change it later\n"
        f"engines = [{engines}]  # its engines: ids the stack's, one pipeline each\n"
        f"admin_ports = [{ports}]  # one admin API port per engine, in the same order\n"
        # Runs nothing as printed: a relative source would be read from the stack's state
        # folder (its programs' working directory), so the placeholder is an absolute path.
        f'publishers = {{ source = "/path/to/{name}.jsonl", count = 0 }}  # optional, none '
        f"as it is; with the absolute path of a file (or folder) and count = 2, make up "
        f"runs two publisher adapters following it into {name}.in (README, Adapters)\n"
    )
