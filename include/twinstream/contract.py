"""The pipeline contract: what a user declares to run a stream with hot-standby failover.

A pipeline is a `Pipeline` value in the user's own module (outside this package), named by
the pipelines file (`pipelines.toml`) as `module:attribute`. It declares:

- `name`: its topics are `<name>.in`, `.out`, `.dlq` and `.progress` unless the settings
  say otherwise, its election lives under `/twinstream/<name>`, its transactional id is
  `twinstream-<name>`;
- `schema`: the inbound record, a JSON object, as Spark DDL or a `StructType`. The
  framework parses it in the JVM (`from_json`) and dead-letters, with a reason, every record
  that is not such an object: not UTF-8, not JSON, a member missing, of the wrong type,
  named twice, a number that is not finite, over `max_record_bytes` (see
  `twinstream.pipeline.validated`);
- `checks`: more rules a valid record obeys, reason -> SQL condition (`"amount >= 0"`);
  a record for which a condition is false or NULL is a dead letter with that reason;
- `transform`: typed records -> output rows. It receives a streaming DataFrame with
  `msg_id` (the record's identity: its inbound offset; with several partitions, the
  partition x 2^48 + the offset, `twinstream.core.rows.record_id`), the schema's fields
  and `_raw` (the record's bytes, for a dead letter of its own), and returns a DataFrame
  with `msg_id` and
  the output columns: stateless, or stateful with Spark's own operators
  (`applyInPandasWithState`, `transformWithStateInPandas`). Each output row carries the
  msg_id of the input that caused it; an input may cause zero, one or several rows. An
  optional `dead_letter` column (a reason) turns a row into that input's dead letter (with
  `_raw` as its bytes if the row carries it);
- `key` and `value`: the output columns that make the Kafka key (cast to text) and the
  value: `to_json` of the value columns, or with `value_format="text"` the one value column
  as it is (a value the transform has serialised itself);
- `expectations`: optional Great Expectations expectations over the published value's
  fields (`value_schema`, DDL; the record's msg_id, as the transform saw it, is the
  column `header_msg_id`), which the audit adds to its own;
- `sample`: optional, `sample(count, seed, broken_every)` -> example inbound records
  (every `broken_every`-th one invalid, if not 0), for `twinstream publish` and tests.

The framework owns the rest: source, msg_id, validation, dead letters, serialisation, the
gate, election, fencing, persist and restore, quarantine and the audit of coverage.

The one rule: **the transform is deterministic in msg_id order.** Every engine runs it on
the same records in the same order, in micro-batches of different sizes; a takeover
publishes the standby's rows in place of the active's, so the output for a msg_id may
depend on the records up to it and on nothing else: not on batch boundaries, wall-clock
time, randomness, or an event-time watermark that emits later (a watermark advances per
batch). State keyed by the record's fields and updated in msg_id order is what it is for.
With several inbound partitions only a partition's order exists: state may be keyed only
by what producers partition the records by (`partition_by`).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

# Output columns with a meaning to the framework.
MSG_ID = "msg_id"
DEAD_LETTER = "dead_letter"
RAW = "_raw"


class ContractError(ValueError):
    """A pipeline that does not keep the contract; the message says what to change."""


@dataclass(frozen=True)
class Pipeline:
    name: str
    schema: str | StructType
    transform: Callable[[DataFrame], DataFrame]
    key: str | None
    value: Sequence[str]
    value_format: Literal["json", "text"] = "json"
    checks: Mapping[str, str] = field(default_factory=dict)
    expectations: Callable[[], list[Any]] | None = None
    value_schema: str = ""
    sample: Callable[[int, int, int], Iterable[bytes]] | None = None
    # Spark settings the transform needs (state store options, say); the framework's own
    # win where they meet (see twinstream.pipeline.spark_conf).
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    description: str = ""
    # The inbound member producers key records by, so that with several partitions a key's
    # records share one (the transform's state is per key, and only a partition's order is
    # kept). `twinstream publish` keys records by it.
    partition_by: str | None = None

    def __post_init__(self) -> None:
        if not self.value:
            raise ContractError(f"pipeline {self.name}: value names no column")
        if self.value_format == "text" and len(self.value) != 1:
            raise ContractError(
                f"pipeline {self.name}: value_format 'text' publishes one column as it is; "
                f"value names {list(self.value)}"
            )
        if self.expectations is not None and not self.value_schema:
            raise ContractError(
                f"pipeline {self.name}: expectations need value_schema, the DDL of the "
                "published value, for the audit to read the fields they name"
            )
        reserved = {MSG_ID, DEAD_LETTER, RAW} & {*self.value, self.key}
        if reserved:
            raise ContractError(
                f"pipeline {self.name}: {sorted(reserved)} are the framework's columns, "
                "not output columns"
            )

    def struct(self) -> StructType:
        """The schema as a StructType (DDL parsed by Spark's own parser)."""
        from pyspark.sql.types import StructType, _parse_datatype_string

        if isinstance(self.schema, StructType):
            return self.schema
        parsed = _parse_datatype_string(self.schema)
        if not isinstance(parsed, StructType):
            raise ContractError(f"pipeline {self.name}: schema is not a struct: {self.schema}")
        return parsed


def field_types(schema: str | StructType) -> dict[str, str]:
    """Top-level field -> type name (lower case), without Spark: for tools that type a CSV
    column or name a field. Nested types keep their text (`array<string>`)."""
    if not isinstance(schema, str):
        return {f.name: f.dataType.simpleString() for f in schema.fields}
    fields: dict[str, str] = {}
    depth, start = 0, 0
    text = schema.strip()
    for i, char in enumerate(text + ","):
        if char in "<(":
            depth += 1
        elif char in ">)":
            depth -= 1
        elif char == "," and depth == 0:
            part = text[start:i].strip()
            start = i + 1
            if not part:
                continue
            name, _, kind = part.replace(":", " ", 1).partition(" ")
            kind = kind.strip()
            if kind.upper().endswith(" NOT NULL"):
                kind = kind[: -len(" NOT NULL")]
            fields[name.strip("`")] = kind.strip().lower()
    return fields


def load(spec: str, root: Path | None = None) -> Pipeline:
    """The Pipeline named `module:attribute` (attribute defaults to `pipeline`). `root`, if
    given, goes first on sys.path (and PYTHONPATH, which Spark's Python workers inherit)."""
    if root is not None:
        add_to_path(root)
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ContractError(
            f"cannot import pipeline module {module_name!r} ({exc}); is its folder on the "
            "path? (the pipelines file's folder is; or set PYTHONPATH)"
        ) from exc
    found = getattr(module, attribute or "pipeline", None)
    if not isinstance(found, Pipeline):
        raise ContractError(
            f"{module_name} has no Pipeline named {attribute or 'pipeline'!r} "
            f"(found {type(found).__name__}); declare one with twinstream.contract.Pipeline"
        )
    return found


def add_to_path(root: Path) -> None:
    import os

    folder = str(root.resolve())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if folder not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([folder, *parts])
