"""A `Keyed` pipeline's step in plain Python, as the engines run it and as they publish
what it returns: for a user's unit tests and the platform's reference runs, no Spark.

`run(pipeline, records, batches)` feeds the records (dicts as the step receives them:
the schema's members, derived columns and `msg_id`) through `twinstream.engine.state.keyed.Runner`
partition by partition, in `batches` slices, and checks every new state against the
pipeline's `Keyed.state` (a tuple of that many fields). The outcome does not depend on
`batches`: a test that compares two batchings checks the contract's one rule.

Its outputs are what the engines publish, not what the step returned: the engine turns an
output dict into a row of `Keyed.output`'s types (Arrow, in the Python worker) and
publishes `to_json` of the `value` columns (Spark, in the JVM: `_row_columns` in
`twinstream.engine.pipeline`), which leaves a NULL column out. Neither runs without Spark,
so `published` mirrors them for what a step returns: scalars of the declared type, and
lists and dicts of them. `tests/integration/test_keyed.py` compares this mirror with what
engines publish.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from twinstream.contract import MSG_ID, ContractError, Keyed, Pipeline, field_types
from twinstream.core.rows import DLQ, OUT, clean_reason, encode
from twinstream.engine.state.keyed import Partition, Runner

# Spark's to_json leaves a NULL field out of the object unless the session says otherwise.
IGNORE_NULL_FIELDS = "spark.sql.jsonGenerator.ignoreNullFields"

# Declared type -> the Python type a value of it must be (bool is no int here: Arrow
# refuses True for a BIGINT column).
_SCALARS: dict[str, type] = {
    **dict.fromkeys(("tinyint", "byte", "smallint", "short", "int", "integer"), int),
    **dict.fromkeys(("bigint", "long"), int),
    **dict.fromkeys(("float", "real", "double"), float),
    "string": str,
    "boolean": bool,
}


@dataclass
class Outcome:
    """What `run` found, every output as the engines publish it (see `published`).

    `records` is keyed by msg_id, as the records gave it (with several partitions,
    partition x 2^48 + offset: `twinstream.core.rows.split_record_id`), and holds every
    record given, partition by partition, each in msg_id order:

    - `("out", [value, ...])`: the record's outputs, in the order the step returned them,
      each its published value parsed (`{"user": "a", "count": 2}`: the `value` columns the
      step set, a column it left out or set to None absent);
    - `("none", [])`: a valid record with no output (nothing is published for it; the
      progress record accounts for it);
    - `("dlq", reason)`: the record is its own dead letter, with this reason as published
      (a `Reject`'s text, or `error: <type>: <message>`).

    `states`: partition -> {key: state} after the last record (a forgotten or expired key
    is absent). Two outcomes are equal when both are.
    """

    records: dict[int, tuple[str, Any]] = field(default_factory=dict)
    states: dict[int, dict[Any, Any]] = field(default_factory=dict)

    def outputs(self) -> list[dict[str, Any]]:
        """Every output as published, in msg_id order: `{"msg_id": ..., **value}`, the
        value as `records` holds it. The Kafka key (`Pipeline.key`) is not in it unless
        the key's column is one of `value`'s."""
        return [
            {MSG_ID: msg_id, **value}
            for msg_id, (kind, values) in sorted(self.records.items())
            if kind == OUT
            for value in values
        ]

    def dead_letters(self) -> dict[int, str]:
        """msg_id -> the reason of its dead letter, in msg_id order."""
        return {
            msg_id: reason for msg_id, (kind, reason) in sorted(self.records.items()) if kind == DLQ
        }


def published(pipeline: Pipeline, output: Mapping[str, Any]) -> dict[str, Any]:
    """One output dict of the step as the engines publish its value, parsed back as JSON:
    the `value` columns in order, each as its declared type makes it (an int in a DOUBLE
    column is the float 5.0, a tuple is a list), a column that is missing or None absent
    (with `spark_conf` setting `spark.sql.jsonGenerator.ignoreNullFields` to false: null).
    With `value_format="text"`: {the column: the text}, absent for None (a tombstone).

    Raises ContractError for a value the engine would not publish as given: not of its
    column's declared type, not a finite number, or not JSON (a datetime, a Decimal)."""
    if pipeline.keyed is None:
        raise ContractError(f"pipeline {pipeline.name} declares no Keyed step")
    types = field_types(pipeline.keyed.output)
    keep_nulls = pipeline.spark_conf.get(IGNORE_NULL_FIELDS, "true").strip().lower() == "false"
    value: dict[str, Any] = {}
    for column in pipeline.value:
        item = output.get(column)
        if item is not None:
            value[column] = _typed(pipeline, column, types.get(column, ""), item)
        elif keep_nulls and pipeline.value_format == "json":
            value[column] = None
    try:
        parsed: dict[str, Any] = json.loads(encode(value))
    except (TypeError, ValueError) as exc:
        raise ContractError(
            f"pipeline {pipeline.name}: the output {dict(output)!r} is not JSON ({exc}): give "
            "the value columns numbers, strings, booleans, lists or dicts of them, and no "
            "NaN or infinity"
        ) from exc
    return parsed


def _typed(pipeline: Pipeline, column: str, kind: str, item: Any) -> Any:
    """`item` as a column of type `kind` holds it: the conversions Arrow makes exactly."""
    wanted = str if kind.startswith(("varchar", "char")) else _SCALARS.get(kind)
    if wanted is float and isinstance(item, int) and not isinstance(item, bool):
        return float(item)
    if wanted is int and isinstance(item, float) and item.is_integer():
        return int(item)
    if wanted is not None and (
        not isinstance(item, wanted) or isinstance(item, bool) != (wanted is bool)
    ):
        raise ContractError(
            f"pipeline {pipeline.name}: the step's output column {column} is declared "
            f"{kind.upper()} in Keyed.output and the step gave {item!r} "
            f"({type(item).__name__}): the engine would fail the micro-batch or publish "
            f"another value; give it a {wanted.__name__}, or change its type in Keyed.output"
        )
    return item


def checked(keyed: Keyed) -> Callable[[Any, dict[str, Any]], tuple[Any, Any]]:
    """The step, wrapped to refuse a new state that is not a tuple of `Keyed.state`'s
    fields (what the engine stores)."""
    names = list(field_types(keyed.state))

    def step(state: Any, record: dict[str, Any]) -> tuple[Any, Any]:
        new_state, outputs = keyed.step(state, record)
        if new_state is not None and (
            not isinstance(new_state, tuple) or len(new_state) != len(names)
        ):
            raise ContractError(
                f"the step returned the state {new_state!r}; Keyed.state declares a tuple of "
                f"{len(names)} ({', '.join(names)}): return one, or None to forget the key"
            )
        return new_state, outputs

    return step


def run(
    pipeline: Pipeline,
    records: Sequence[Mapping[str, Any]],
    batches: int = 1,
    partition_of: Callable[[Mapping[str, Any]], int] = lambda record: 0,
) -> Outcome:
    """Runs `pipeline`'s step over `records` (each with `msg_id`) as the engines do, in
    `batches` slices of each partition (`partition_of(record)`, 0 for all by default), and
    returns the Outcome: `outputs()` and `records` as published (see Outcome).

    Raises ContractError for a pipeline without a Keyed step, and for an output the
    engines would not publish as the step gave it (`published`)."""
    if pipeline.keyed is None or pipeline.partition_by is None:
        raise ContractError(f"pipeline {pipeline.name} declares no Keyed step")
    keyed = replace(pipeline.keyed, step=checked(pipeline.keyed))
    columns = list(field_types(keyed.output))
    runner = Runner(keyed, pipeline.partition_by, columns)
    by_partition: dict[int, list[Mapping[str, Any]]] = {}
    for record in records:
        by_partition.setdefault(partition_of(record), []).append(record)
    outcome = Outcome()
    for number, part in sorted(by_partition.items()):
        part.sort(key=lambda r: int(r[MSG_ID]))
        state = Partition()
        size = max(1, -(-len(part) // max(1, batches)))
        for first in range(0, len(part), size):
            chunk = part[first : first + size]
            result = runner.run(state, chunk)
            runner.sweep(state, result.changed)
            position = 0
            for record, kind, letter in zip(chunk, result.kinds, result.letters, strict=True):
                msg_id = int(record[MSG_ID])
                if kind == DLQ:
                    # As `twinstream.engine.pipeline.assemble` publishes it.
                    reason = clean_reason(letter or "error: no reason")
                    outcome.records[msg_id] = (DLQ, reason)
                    continue
                emitted = []
                while position < len(result.out_ids) and result.out_ids[position] == msg_id:
                    row = {c: result.outputs[c][position] for c in columns}
                    emitted.append(_published_at(pipeline, msg_id, row))
                    position += 1
                outcome.records[msg_id] = (kind, emitted)
        outcome.states[number] = dict(state.states)
    return outcome


def _published_at(pipeline: Pipeline, msg_id: int, row: Mapping[str, Any]) -> dict[str, Any]:
    """`published`, its error naming the record."""
    try:
        return published(pipeline, row)
    except ContractError as exc:
        raise ContractError(f"msg_id {msg_id}: {exc}") from exc
