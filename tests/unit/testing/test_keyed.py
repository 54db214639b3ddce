"""`twinstream.testing.keyed.run` gives what the engines publish, not what the step
returned: an output column the step left unset or None is absent, as Spark's to_json
leaves it out of the published value; numbers are of the column's declared type; dead
letters carry the reason as published; a value the engines would not publish as given is
refused by name."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from twinstream.contract import ContractError, Keyed, Pipeline, Reject
from twinstream.testing import keyed

SCHEMA = "user STRING, amount BIGINT"
OUTPUT = "user STRING, count BIGINT, total DOUBLE, note STRING, tags ARRAY<STRING>"


def step(state: tuple[int] | None, record: dict[str, Any]) -> tuple[Any, Any]:
    """amount 1: total and tags unset, note None; 2: every column; 3: rejected; 4: raises;
    5: no output; 6: two outputs, the second only the user."""
    count = (state[0] if state is not None else 0) + 1
    amount = record["amount"]
    if amount == 3:
        raise Reject("out_of_range: three")
    if amount == 4:
        raise ValueError("four")
    if amount == 5:
        return (count,), None
    if amount == 1:
        return (count,), {"user": record["user"], "count": count, "note": None}
    row = {"user": record["user"], "count": count, "total": 10, "note": "n", "tags": ("x",)}
    return (count,), [row, {"user": record["user"]}] if amount == 6 else row


def pipeline(
    output: str = OUTPUT, spark_conf: dict[str, str] | None = None, **fields: Any
) -> Pipeline:
    declared: dict[str, Any] = {
        "key": "user",
        "value": ["user", "count", "total", "note", "tags"],
        **fields,
    }
    return Pipeline(
        name="totals",
        schema=SCHEMA,
        keyed=Keyed(step=step, output=output, state="count BIGINT"),
        partition_by="user",
        spark_conf=spark_conf or {},
        **declared,
    )


def given(*amounts: int) -> list[dict[str, Any]]:
    return [{"msg_id": i, "user": "a", "amount": a} for i, a in enumerate(amounts)]


def test_an_unset_or_none_column_is_absent_as_in_the_published_json() -> None:
    outcome = keyed.run(pipeline(), given(1, 2))
    # What `to_json(struct(user, count, total, note, tags))` publishes for these rows: a
    # NULL field left out, a DOUBLE written as one, an array as a list.
    first = json.loads('{"user":"a","count":1}')
    second = json.loads('{"user":"a","count":2,"total":10.0,"note":"n","tags":["x"]}')
    assert outcome.outputs() == [{"msg_id": 0, **first}, {"msg_id": 1, **second}]
    assert outcome.records == {0: ("out", [first]), 1: ("out", [second])}
    assert isinstance(outcome.outputs()[1]["total"], float)  # the step gave the int 10
    assert keyed.published(pipeline(), {"user": "a", "count": 1, "note": None}) == first


def test_every_kind_of_record_and_the_dead_letters_by_msg_id() -> None:
    outcome = keyed.run(pipeline(), given(3, 4, 5, 6))
    assert outcome.records == {
        0: ("dlq", "out_of_range: three"),
        1: ("dlq", "error: ValueError: four"),
        2: ("none", []),
        3: (
            "out",
            [
                {"user": "a", "count": 2, "total": 10.0, "note": "n", "tags": ["x"]},
                {"user": "a"},
            ],
        ),
    }
    assert outcome.dead_letters() == {0: "out_of_range: three", 1: "error: ValueError: four"}
    assert [row["msg_id"] for row in outcome.outputs()] == [3, 3]


def test_the_value_holds_only_the_value_columns_not_the_key_alone() -> None:
    outcome = keyed.run(pipeline(value=["count"]), given(1))
    assert outcome.outputs() == [{"msg_id": 0, "count": 1}]


def test_a_pipeline_that_keeps_null_fields_publishes_them_as_null() -> None:
    conf = {"spark.sql.jsonGenerator.ignoreNullFields": "false"}
    outcome = keyed.run(pipeline(spark_conf=conf), given(1, 2))
    assert outcome.outputs() == [
        {"msg_id": 0, "user": "a", "count": 1, "total": None, "note": None, "tags": None},
        {"msg_id": 1, "user": "a", "count": 2, "total": 10.0, "note": "n", "tags": ["x"]},
    ]


def test_a_text_value_is_the_text_and_none_is_a_tombstone() -> None:
    text = pipeline(value=["note"], value_format="text")
    assert keyed.run(text, given(2, 1)).outputs() == [{"msg_id": 0, "note": "n"}, {"msg_id": 1}]


@pytest.mark.parametrize(
    ("output", "wanted"),
    [
        ("user STRING, count STRING, total DOUBLE, note STRING, tags ARRAY<STRING>", "count"),
        ("user STRING, count BOOLEAN, total DOUBLE, note STRING, tags ARRAY<STRING>", "count"),
        ("user STRING, count BIGINT, total BIGINT, note BIGINT, tags ARRAY<STRING>", "note"),
    ],
)
def test_a_value_not_of_its_declared_type_is_refused_naming_the_column(
    output: str, wanted: str
) -> None:
    with pytest.raises(ContractError, match=rf"^msg_id 0: .* output column {wanted} is declared"):
        keyed.run(pipeline(output), given(2))


def test_a_value_that_is_not_json_is_refused() -> None:
    with pytest.raises(ContractError, match="no NaN or infinity"):
        keyed.published(pipeline(), {"user": "a", "total": math.nan})
    with pytest.raises(ContractError, match="is not JSON"):
        keyed.published(pipeline(), {"user": "a", "tags": [object()]})
