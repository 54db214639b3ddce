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
  `twinstream.engine.pipeline.validated`). Every member is required and not null, unless listed
  in `optional`;
- `optional`: members that may be absent or JSON `null` (the transform reads NULL); when
  present with a value, still type-checked;
- `bounds`: member -> `Bound(min, max)`, the values a numeric member may take; a record
  outside is a dead letter (`out_of_range: amount is below 0`), and the same `Bound` gives
  the audit's expectation on a published column computed from it (`Bound.expectation`),
  so that nothing the guard publishes can fail the audit;
- `checks`: more rules a valid record obeys, reason -> SQL condition (`"amount >= 0"`);
  a record for which a condition is false or NULL is a dead letter with that reason;
- `keyed` (or `transform`, one of the two): state per key at any key count. A `Keyed`
  declares `step(state, record) -> (new_state, outputs)`, a pure Python function the
  framework calls once per valid record, in msg_id order, with the state of the record's
  key (`partition_by`): its Python calls per micro-batch do not grow with the number of
  keys (`twinstream.engine.state`). The way to write a stateful pipeline;
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
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from math import isfinite
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


class Reject(Exception):
    """Raised by a `Keyed.step` for a record it will not process: the record becomes its own
    dead letter with this reason, word for word (`bad_time: ...`), and the key's state stays
    as it was. Any other exception from the step does the same with the reason
    `error: <type>: <message>`."""


@dataclass(frozen=True)
class Keyed:
    """State per key at any key count: the framework's runner (`twinstream.engine.state`) calls
    `step` once per valid record of a key, in msg_id order, and keeps each key's state.

    - `step(state, record) -> (new_state, outputs)`: `state` is the key's last new_state
      (None for a key not seen, or forgotten); `record` a dict of the schema's members, the
      `derive`d columns and `msg_id`. `new_state` None forgets the key; `outputs` is None,
      one dict or a list of dicts of the `output` columns (a missing column is NULL), each
      published with the record's msg_id. Raise `Reject(reason)` to dead-letter the
      record. Pure and deterministic: the same records in the same order give the same
      outputs, whatever the batch boundaries.
    - `output`: the output columns, Spark DDL (`"host STRING, value STRING"`).
    - `state`: the state's shape, Spark DDL, for people and for `twinstream.testing`'s
      runner, which checks every new_state against it: a tuple of these fields in order.
      The engine stores the tuple pickled (about 40 bytes plus the values' own per key).
    - `derive`: column -> SQL expression over the record, computed in the JVM before the
      step (a time parsed by Spark, say); NULL for an invalid record.
    - `expire_after_ms` with `event_time` (a record column of epoch milliseconds): a key
      whose latest record is that much older than the newest record of its partition so
      far is forgotten: its next record sees state None. Decided in msg_id order, so every
      engine forgets the same keys at the same record (a processing-time TTL would not).
    """

    step: Callable[[Any, dict[str, Any]], tuple[Any, Any]]
    output: str
    state: str
    derive: Mapping[str, str] = field(default_factory=dict)
    expire_after_ms: int | None = None
    event_time: str | None = None

    def __post_init__(self) -> None:
        if not callable(self.step):
            raise ContractError(f"Keyed.step is {self.step!r}: give a function(state, record)")
        if (self.expire_after_ms is None) != (self.event_time is None):
            raise ContractError(
                "Keyed: expire_after_ms and event_time go together (a key expires by the "
                "event time of its partition): give both or neither"
            )
        if self.expire_after_ms is not None and self.expire_after_ms <= 0:
            raise ContractError(f"Keyed: expire_after_ms is {self.expire_after_ms}; want > 0")
        reserved = {MSG_ID, DEAD_LETTER, RAW} & set(_members(self.output))
        if reserved:
            raise ContractError(
                f"Keyed.output names {sorted(reserved)}, the framework's columns: rename them"
            )
        if not _members(self.state):
            raise ContractError("Keyed.state declares no field: give its DDL, 'count BIGINT'")


_NUMERIC = ("tinyint", "smallint", "int", "bigint", "float", "double", "byte", "short", "long")


@dataclass(frozen=True)
class Bound:
    """The values a numeric inbound member may take, inclusive unless `strict_min` /
    `strict_max` (GX's own words). One declaration serves both sides of the platform: the
    guard dead-letters a record outside it (`checks`) and the audit expects what follows
    from it on the published columns (`expectation`), so the two cannot disagree."""

    min: float | None = None
    max: float | None = None
    strict_min: bool = False
    strict_max: bool = False

    def __post_init__(self) -> None:
        if self.min is None and self.max is None:
            raise ContractError("a Bound needs min, max or both")
        for side in (self.min, self.max):
            if side is not None and (isinstance(side, bool) or not isfinite(side)):
                raise ContractError(f"a Bound's min and max are finite numbers, not {side!r}")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ContractError(f"a Bound's min {self.min} is above its max {self.max}")

    def checks(self, member: str) -> dict[str, str]:
        """reason -> SQL condition, as in `Pipeline.checks`. NULL passes: only an optional
        member can be NULL after the type checks, and absence is not out of range."""
        found: dict[str, str] = {}
        if self.min is not None:
            word, op = ("is not above", ">") if self.strict_min else ("is below", ">=")
            found[f"out_of_range: {member} {word} {self.min}"] = (
                f"`{member}` IS NULL OR `{member}` {op} {_sql_number(self.min)}"
            )
        if self.max is not None:
            word, op = ("is not below", "<") if self.strict_max else ("is above", "<=")
            found[f"out_of_range: {member} {word} {self.max}"] = (
                f"`{member}` IS NULL OR `{member}` {op} {_sql_number(self.max)}"
            )
        return found

    def expectation(self, column: str, of: Literal["value", "sum"] = "value") -> Any:
        """The Great Expectations expectation this bound implies for published `column`.

        `of="value"`: the column holds values of the member, or a mean, min or max of them:
        the same bound. `of="sum"`: a sum of one or more values: a min >= 0 holds (each
        value adds at least 0 to the first, which is >= min), a max <= 0 likewise; a side
        that does not hold for a sum is left out, and a bound with neither side that holds
        is a ContractError (an expectation that checks nothing would be a test that cannot
        fail)."""
        import great_expectations.expectations as gxe

        low, high = self.min, self.max
        if of == "sum":
            low = low if low is not None and low >= 0 else None
            high = high if high is not None and high <= 0 else None
            if low is None and high is None:
                raise ContractError(
                    f"{column}: a sum of values within {self} has no bound (only a min >= 0 "
                    "or a max <= 0 bounds a sum): expect something else of it"
                )
        elif of != "value":
            raise ContractError(f"{column}: of={of!r}; want 'value' or 'sum'")
        return gxe.ExpectColumnValuesToBeBetween(
            column=column,
            min_value=low,
            max_value=high,
            strict_min=self.strict_min and low is not None,
            strict_max=self.strict_max and high is not None,
        )


def _sql_number(value: float) -> str:
    # repr gives the shortest text that reads back as the same double (`0.1`, `1e-05`):
    # Spark SQL reads both; an integral int stays an integer literal (exact for BIGINT).
    return str(value) if isinstance(value, int) else repr(float(value))


@dataclass(frozen=True)
class Pipeline:
    name: str
    schema: str | StructType
    # One of the two: `keyed` (state per key, see Keyed) or a DataFrame `transform`.
    transform: Callable[[DataFrame], DataFrame] | None = None
    key: str | None = None
    value: Sequence[str] = ()
    value_format: Literal["json", "text"] = "json"
    checks: Mapping[str, str] = field(default_factory=dict)
    expectations: Callable[[], list[Any]] | None = None
    value_schema: str = ""
    sample: Callable[[int, int, int], Iterable[bytes]] | None = None
    # Spark settings the transform needs (state store options, say); the framework's own
    # win where they meet (see twinstream.engine.pipeline.spark_conf).
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    description: str = ""
    # The inbound member producers key records by, so that with several partitions a key's
    # records share one (the transform's state is per key, and only a partition's order is
    # kept). `twinstream publish` keys records by it.
    partition_by: str | None = None
    # Members that may be absent or JSON null: the transform reads NULL for them. Every
    # other member is required, and not null.
    optional: Sequence[str] = ()
    # member -> the values it may take (see Bound): checked by the guard before `checks`,
    # and the source of the audit's expectations on what is computed from it.
    bounds: Mapping[str, Bound] = field(default_factory=dict)
    keyed: Keyed | None = None
    # The owner's name for this version of the code ("2", "2026-11-28"): engines, status,
    # output headers and progress records show it with a digest of the code
    # (twinstream.platform.versions), which tells an undeclared change apart all the same.
    version: str = ""

    def __post_init__(self) -> None:
        if (self.transform is None) == (self.keyed is None):
            raise ContractError(
                f"pipeline {self.name}: declare keyed=Keyed(...) (state per key) or a "
                "transform, exactly one of them"
            )
        if self.keyed is not None:
            self._check_keyed(self.keyed)
        if not self.value:
            raise ContractError(f"pipeline {self.name}: value names no column")
        if not re.fullmatch(r"[A-Za-z0-9._-]{0,40}", self.version):
            raise ContractError(
                f"pipeline {self.name}: version {self.version!r}: up to 40 letters, digits, "
                "'.', '_' or '-' (it is a Kafka header and a metric label)"
            )
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
        self._check_members()

    def _check_keyed(self, keyed: Keyed) -> None:
        if not self.partition_by:
            raise ContractError(
                f"pipeline {self.name}: keyed state is per key: set partition_by to the member "
                "that is the key (producers partition by it, so a key's records keep order)"
            )
        columns = set(_members(keyed.output)) | ({self.key} if self.key else set())
        unknown = [c for c in (*self.value, *([self.key] if self.key else [])) if c not in columns]
        if unknown:
            raise ContractError(
                f"pipeline {self.name}: value/key name {unknown}, which Keyed.output does not "
                f"declare ({keyed.output}): add them to output"
            )
        clash = set(keyed.derive) & set(_members(self.schema))
        if clash:
            raise ContractError(
                f"pipeline {self.name}: Keyed.derive names members of the schema {sorted(clash)}: "
                "give derived columns new names"
            )
        if keyed.event_time is not None and keyed.event_time not in (
            set(_members(self.schema)) | set(keyed.derive)
        ):
            raise ContractError(
                f"pipeline {self.name}: Keyed.event_time {keyed.event_time!r} is neither a "
                "member nor a derived column: name one holding epoch milliseconds"
            )

    def _check_members(self) -> None:
        """optional, bounds and partition_by name members the schema declares, as they can."""
        if isinstance(self.optional, str):
            # ("amount") is a string, not a tuple: its letters are not members.
            raise ContractError(
                f"pipeline {self.name}: optional is a sequence of member names, not the string "
                f"{self.optional!r}: write optional=({self.optional!r},)"
            )
        members = _members(self.schema)
        declared = ", ".join(members) or "none"
        for what, names in (
            ("optional", list(self.optional)),
            ("bounds", list(self.bounds)),
            ("partition_by", [self.partition_by] if self.partition_by else []),
        ):
            unknown = [n for n in names if n not in members]
            if unknown:
                raise ContractError(
                    f"pipeline {self.name}: {what} names {', '.join(map(repr, unknown))}, which "
                    f"the schema does not declare (it declares {declared}): add it to the "
                    "schema or fix the name"
                )
        for name in self.optional:
            if members[name][1]:
                raise ContractError(
                    f"pipeline {self.name}: {name!r} is optional and declared NOT NULL in the "
                    "schema: drop NOT NULL (every member not in optional is required anyway) or "
                    "drop it from optional"
                )
        if self.partition_by in self.optional:
            raise ContractError(
                f"pipeline {self.name}: partition_by {self.partition_by!r} is optional, but a "
                "record without it has no key to keep it in its partition: make it required"
            )
        for name, bound in self.bounds.items():
            if not isinstance(bound, Bound):
                raise ContractError(
                    f"pipeline {self.name}: bounds[{name!r}] is {bound!r}: declare a "
                    "twinstream.contract.Bound(min=..., max=...)"
                )
            kind = members[name][0]
            if kind not in _NUMERIC and not kind.startswith("decimal"):
                raise ContractError(
                    f"pipeline {self.name}: bounds[{name!r}]: {name} is {kind}, and only a "
                    "number has bounds (write a check for other rules)"
                )
        clash = set(self.checks) & {r for n, b in self.bounds.items() for r in b.checks(n)}
        if clash:
            raise ContractError(
                f"pipeline {self.name}: checks repeat the bounds' reasons {sorted(clash)}: "
                "drop the check, the bound makes it"
            )

    @property
    def state_layout(self) -> str:
        """How the plan keeps state in the checkpoint; a snapshot resumes only its own
        layout (`twinstream.engine.snapshot.verify`). Bump the version when the keyed store's
        variables change."""
        return "keyed/1" if self.keyed is not None else "transform"

    @property
    def state_shape(self) -> str:
        """The shape of the keyed state (Keyed.state's DDL), "" for a transform (Spark keeps
        its operators' state and checks its schema itself). A new version that changes it
        cannot resume an older version's checkpoint: a deploy rebuilds the state by a
        replay (twinstream.ops.deploy)."""
        return self.keyed.state if self.keyed is not None else ""

    def rules(self) -> dict[str, str]:
        """Every rule a valid record obeys after its types, reason -> SQL condition, in the
        order the guard applies them: the bounds' (in `bounds` order), then `checks`."""
        found: dict[str, str] = {}
        for name, bound in self.bounds.items():
            found.update(bound.checks(name))
        return found | dict(self.checks)

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
    return {name: kind for name, (kind, _) in _members(schema).items()}


def _members(schema: str | StructType) -> dict[str, tuple[str, bool]]:
    """Top-level field -> (type name in lower case, declared NOT NULL), without Spark."""
    if not isinstance(schema, str):
        return {f.name: (f.dataType.simpleString(), not f.nullable) for f in schema.fields}
    fields: dict[str, tuple[str, bool]] = {}
    depth, start = 0, 0
    text = schema.strip()
    if text.lower().startswith("struct<") and text.endswith(">"):
        text = text[len("struct<") : -1]
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
            not_null = kind.upper().endswith(" NOT NULL")
            if not_null:
                kind = kind[: -len(" NOT NULL")]
            fields[name.strip("`")] = (kind.strip().lower(), not_null)
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
