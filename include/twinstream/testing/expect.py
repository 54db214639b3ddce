"""A pipeline's own audit expectations over rows it computed, without a stack: what the
guard lets through must pass what the audit expects (`Pipeline.expectations`), or the
scheduled audit fails a whole pipeline on a record the engines published as valid.

`failed(pipeline, rows)` reads the published rows (kind `out`) as the audit job does
(`spark_jobs/audit_output.py`): the value's fields named by `value_schema`, and
`header_msg_id`, the record id the transform saw; then validates them with Great
Expectations in an ephemeral context (pandas) and returns each failed expectation, named.
A reference run (`twinstream.testing.reference.run`) gives the rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from twinstream.contract import Pipeline, field_types
from twinstream.core.rows import OUT, Output, record_id

if TYPE_CHECKING:
    import pandas as pd


def published(pipeline: Pipeline, rows: Iterable[Output]) -> pd.DataFrame:
    """The published rows as the audit reads them: `header_msg_id` and the value_schema's
    fields (a field a value lacks is null, as from_json reads it)."""
    import pandas as pd

    columns = list(field_types(pipeline.value_schema))
    records: list[dict[str, Any]] = []
    for row in rows:
        if row.kind != OUT:
            continue
        value = json.loads(row.value)
        if not isinstance(value, dict):
            raise ValueError(
                f"msg_id {row.msg_id}: the value is not a JSON object, so the audit cannot read "
                f"value_schema's fields from it: {row.value[:200]!r}"
            )
        records.append(
            {
                "header_msg_id": record_id(row.partition, row.msg_id),
                **{c: value.get(c) for c in columns},
            }
        )
    return pd.DataFrame.from_records(records, columns=["header_msg_id", *columns])


def failed(pipeline: Pipeline, rows: Iterable[Output]) -> list[str]:
    """Each of the pipeline's expectations the published rows fail, as `type(column):
    result`; [] when every one passes. A pipeline without expectations passes."""
    if pipeline.expectations is None:
        return []
    import great_expectations as gx

    frame = published(pipeline, rows)
    context = gx.get_context(mode="ephemeral")
    batch = (
        context.data_sources.add_pandas(f"{pipeline.name}-published")
        .add_dataframe_asset("values")
        .add_batch_definition_whole_dataframe("all")
        .get_batch(batch_parameters={"dataframe": frame})
    )
    found = []
    for expectation in pipeline.expectations():
        result = batch.validate(expectation)
        if not result.success:
            config = expectation.configuration
            found.append(
                f"{config.type}({config.kwargs.get('column') or config.kwargs}): "
                f"{dict(result.result)}"
            )
    return found
