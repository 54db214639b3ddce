"""`twinstream new-pipeline NAME`: a runnable pipeline to start from, with its test, and
its entry for the pipelines file.

Writes `<dir>/<name>/__init__.py`, `pipeline.py` (a stateful pipeline on the contract:
per key, a running count and total, one output per valid input, none for a zero amount;
every field of `twinstream.contract.Pipeline` is declared in it, most with a comment) and
`test_pipeline.py` (a reference run in a local Spark: outputs as computed, a bad record
dead-lettered with its reason, every input accounted for, the audit's expectations met).
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
the bounds, the checks and the transform to your stream's; keep the one rule, a transform
deterministic in msg_id order (see docs/pipelines.md)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from twinstream.contract import Bound, Pipeline

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming.state import GroupState

# The inbound JSON object. Every member is required and not null, but those in `optional`.
SCHEMA = "key STRING, amount DOUBLE, ts STRING, note STRING"
OUTPUT = "msg_id BIGINT, key STRING, amount DOUBLE, count BIGINT, total DOUBLE"
# One declaration for the guard and the audit: a record with an amount below 0 is a dead
# letter (`out_of_range: amount is below 0`), and `expectations` derive from the same bound.
BOUNDS = {{"amount": Bound(min=0)}}


def per_key(
    key: tuple[Any, ...], batches: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    """One key's records in msg_id order: the running count and total after each."""
    import pandas as pd

    frame = pd.concat(list(batches), ignore_index=True).sort_values("msg_id")
    count, total = state.get if state.exists else (0, 0.0)
    rows = []
    for record in frame.itertuples(index=False):
        if record.amount == 0:
            continue  # nothing to say: no output (the input is still accounted for)
        count, total = count + 1, round(total + record.amount, 2)
        rows.append((record.msg_id, key[0], record.amount, count, total))
    state.update((count, total))
    yield pd.DataFrame(rows, columns=["msg_id", "key", "amount", "count", "total"])


def transform(records: DataFrame) -> DataFrame:
    from pyspark.sql.streaming.state import GroupStateTimeout

    # State per key: records are keyed by it (partition_by), so a key's records are in one
    # partition, in order.
    return records.groupBy("key").applyInPandasWithState(
        per_key,
        outputStructType=OUTPUT,
        stateStructType="count BIGINT, total DOUBLE",
        outputMode="append",
        timeoutConf=GroupStateTimeout.NoTimeout,
    )


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
    # Members that may be absent or JSON null (the transform reads NULL); type-checked when
    # present with a value.
    optional=("note",),
    bounds=BOUNDS,
    # More rules of a valid record: reason -> SQL condition over the schema's members.
    checks={{"wrong_type: key is empty": "key <> ''"}},
    transform=transform,
    key="key",  # the output's Kafka key
    value=["key", "amount", "count", "total"],  # the output's value: to_json of these
    value_format="json",  # or "text": one column the transform serialised itself
    # Producers key records by this member, so a key's records share a partition (state is
    # per key; only a partition's order exists). `twinstream publish` keys by it.
    partition_by="key",
    expectations=expectations,
    value_schema="key STRING, amount DOUBLE, count BIGINT, total DOUBLE",  # what they read
    sample=sample,  # for `twinstream publish --pipeline {name}` and the tests
    # Spark settings the transform needs; the framework's own win where they meet.
    spark_conf={{"spark.sql.session.timeZone": "UTC"}},
    description=__doc__ or "",
)
'''

TEST = '''"""{name}'s own test: a reference run of the pipeline in a local Spark, no stack needed.

    pytest {name}/test_pipeline.py
"""

from __future__ import annotations

import json

from {name}.pipeline import pipeline
from twinstream.config import load_settings
from twinstream.testing import expect, reference


def test_outputs_dead_letters_and_silences_are_as_computed():
    records = [
        b'{{"key": "a", "amount": 10.0, "ts": "2026-01-01T00:00:00Z", "note": "gift"}}',
        b'{{"key": "a", "amount": 0.0, "ts": "2026-01-01T00:00:01Z"}}',
        b'{{"key": "b", "amount": -3.0, "ts": "2026-01-01T00:00:02Z"}}',
        b'{{"key": "a", "amount": 2.5, "ts": "2026-01-01T00:00:03Z", "note": null}}',
        b"not json",
        b'{{"key": "c", "amount": 1.0, "ts": "2026-01-01T00:00:04Z", "note": 7}}',
    ]
    rows = reference.run(pipeline, list(enumerate(records)), load_settings(pipeline="{name}"))
    by_id = {{row.msg_id: row for row in rows}}
    assert sorted(by_id) == [0, 1, 2, 3, 4, 5]  # every input accounted for
    assert json.loads(by_id[0].value) == {{"key": "a", "amount": 10.0, "count": 1, "total": 10.0}}
    assert by_id[1].kind == "none"  # a zero amount: no output (and no note: it is optional)
    assert json.loads(by_id[2].value)["reason"] == "out_of_range: amount is below 0"
    # A null note is an absent one.
    assert json.loads(by_id[3].value) == {{"key": "a", "amount": 2.5, "count": 2, "total": 12.5}}
    assert json.loads(by_id[4].value)["reason"].startswith("not_json: ")
    # Present with a value, an optional member is type-checked.
    assert json.loads(by_id[5].value)["reason"] == "wrong_type: note is BIGINT, want string"


def test_the_output_does_not_depend_on_batch_boundaries_and_passes_the_audit():
    records = list(enumerate(pipeline.sample(300, 7, 50)))
    settings = load_settings(pipeline="{name}")
    rows = reference.run(pipeline, records, settings, batches=1)
    assert rows == reference.run(pipeline, records, settings, batches=5)
    # What the guard lets through meets what the audit expects of it.
    assert any(row.kind == "out" for row in rows)
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


def pipelines_entry(name: str, free: Sequence[tuple[str, int]], partitions: int = 3) -> str:
    """The pipelines-file block that lists pipeline `name`, each key with a comment: its
    module (the skeleton's), its partitions, and the engines and admin ports `free` gives
    ((engine id, admin port) pairs no pipeline of the stack uses:
    `twinstream.registry.free_engines`)."""
    if not free:
        raise ValueError(
            "no free engine ids: every letter is taken by a pipeline of the stack; remove a "
            "pipeline or name engines of your own in the entry"
        )
    engines = ", ".join(f'"{engine}"' for engine, _ in free)
    ports = ", ".join(str(port) for _, port in free)
    return (
        f"[{name}]\n"
        f'module = "{name}.pipeline"  # module[:attribute]; this file\'s folder is on the path\n'
        f"partitions = {partitions}  # of its four topics; Kafka cannot change it later\n"
        f"engines = [{engines}]  # its engines: ids the stack's, one pipeline each\n"
        f"admin_ports = [{ports}]  # one admin API port per engine, in the same order\n"
    )
