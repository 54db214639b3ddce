"""`twinstream new-pipeline NAME`: a runnable pipeline to start from, with its test.

Writes `<dir>/<name>/__init__.py`, `pipeline.py` (a stateful pipeline on the contract:
per key, a running count and total, one output per valid input, none for a zero amount)
and `test_pipeline.py` (a reference run in a local Spark: outputs as computed, a bad record
dead-lettered with its reason, every input accounted for). Nothing is overwritten.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")

PIPELINE = '''"""{name}: per key, a running count and total of the amounts (one output per input,
none for a zero amount). Written by `twinstream new-pipeline {name}`: change the schema,
the checks and the transform to your stream's; keep the one rule, a transform
deterministic in msg_id order (see docs/pipelines.md)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from twinstream.contract import Pipeline

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming.state import GroupState

SCHEMA = "key STRING, amount DOUBLE, ts STRING"
OUTPUT = "msg_id BIGINT, key STRING, amount DOUBLE, count BIGINT, total DOUBLE"


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

    return records.groupBy("key").applyInPandasWithState(
        per_key,
        outputStructType=OUTPUT,
        stateStructType="count BIGINT, total DOUBLE",
        outputMode="append",
        timeoutConf=GroupStateTimeout.NoTimeout,
    )


def sample(count: int, seed: int, broken_every: int) -> Iterator[bytes]:
    rng = random.Random(seed)
    for i in range(count):
        record: dict[str, Any] = {{
            "key": f"k-{{rng.randrange(10)}}",
            "amount": round(rng.choice([0.0, rng.uniform(1, 100)]), 2),
            "ts": f"2026-01-01T00:{{i // 60 % 60:02d}}:{{i % 60:02d}}Z",
        }}
        if broken_every and (i + 1) % broken_every == 0:
            record["amount"] = -1.0  # the check rejects it
        yield json.dumps(record).encode()


pipeline = Pipeline(
    name="{name}",
    schema=SCHEMA,
    checks={{"out_of_range: amount is negative": "amount >= 0"}},
    transform=transform,
    key="key",
    value=["key", "amount", "count", "total"],
    sample=sample,
)
'''

TEST = '''"""{name}'s own test: a reference run of the pipeline in a local Spark, no stack needed.

    pytest {name}/test_pipeline.py
"""

from __future__ import annotations

import json

from {name}.pipeline import pipeline
from twinstream.config import load_settings
from twinstream.testing import reference


def test_outputs_dead_letters_and_silences_are_as_computed():
    records = [
        b'{{"key": "a", "amount": 10.0, "ts": "2026-01-01T00:00:00Z"}}',
        b'{{"key": "a", "amount": 0.0, "ts": "2026-01-01T00:00:01Z"}}',
        b'{{"key": "b", "amount": -3.0, "ts": "2026-01-01T00:00:02Z"}}',
        b'{{"key": "a", "amount": 2.5, "ts": "2026-01-01T00:00:03Z"}}',
        b"not json",
    ]
    rows = reference.run(pipeline, list(enumerate(records)), load_settings(pipeline="{name}"))
    by_id = {{row.msg_id: row for row in rows}}
    assert sorted(by_id) == [0, 1, 2, 3, 4]  # every input accounted for
    assert json.loads(by_id[0].value) == {{"key": "a", "amount": 10.0, "count": 1, "total": 10.0}}
    assert by_id[1].kind == "none"  # a zero amount: no output
    assert json.loads(by_id[2].value)["reason"] == "out_of_range: amount is negative"
    assert json.loads(by_id[3].value) == {{"key": "a", "amount": 2.5, "count": 2, "total": 12.5}}
    assert json.loads(by_id[4].value)["reason"].startswith("not_json: ")


def test_the_output_does_not_depend_on_batch_boundaries():
    records = list(enumerate(pipeline.sample(300, 7, 50)))
    settings = load_settings(pipeline="{name}")
    assert reference.run(pipeline, records, settings, batches=1) == reference.run(
        pipeline, records, settings, batches=5
    )
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
