"""The output audit: every inbound offset accounted for exactly once, and every output
well-formed, proved with Great Expectations.

Accounted for: every published transaction ends with a progress record, the msg_id range
it covers (`twinstream.core.outbound.progress_record`), so an input without output (a
filter, an alert that did not fire) is accounted for as much as one with three. The audit
checks that the ranges tile the inbound offsets, each exactly once, and that the outputs
and dead letters of each range are where its record says and as many.

Partitions: everything here holds per inbound partition p (the progress records of
partition p of `.progress` tile the offsets of inbound partition p); the cursor keeps a
position per partition and the findings name the partition of each range.

An audit covers the msg_ids [cursor.next_msg_id, end) of each partition, where `end`
(`UpTo`, `choose_ends`) is by default everything committed: the end of the last progress
record the pipeline has committed, so an audit right after a test covers all of it (inputs
the engines have not published yet are not gaps: no committed record claims them). On
request it is the inbound high watermark less an in-flight allowance, moved down to a
transaction's boundary, or an end given per partition, also moved down to a boundary
(below it, a msg_id no committed record covers is missing). It reads each topic from the
offset where the previous audit left it, so no range is skipped or read twice. A range
below the cursor was already accounted for by an earlier audit: it is a late duplicate, and
fails this one.
The cursor moves only when the audit passes; a failed audit is repeated until an operator
has dealt with it.

This module holds the parts that need no Spark: the cursor, the suites, range merging.
`spark_jobs/audit_output.py` reads the topics and runs it.
"""

from __future__ import annotations

import bisect
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SUITE_IDS = "twinstream_msg_ids"
SUITE_VALUES = "twinstream_output_values"
# Every audit's verdict, beside its cursor.
REPORT = "last-audit.json"


class UpToError(ValueError):
    """An `up_to` the audit cannot follow; the message names the forms it takes."""


class AuditFailed(Exception):
    """The audit found a gap, a duplicate or a malformed output; the message names them and
    what to do. Running the audit again over the same data finds the same."""


@dataclass
class Position:
    """Where the next audit starts in one partition: the first msg_id not yet proved, and
    the first offset of each output topic's partition not yet read."""

    next_msg_id: int = 0
    out_offset: int = 0
    dlq_offset: int = 0
    progress_offset: int = 0


@dataclass
class Cursor:
    """Where the next audit starts: partition 0's position in the fields (the cursor of a
    one-partition pipeline, as it always was), every other partition's in `partitions`."""

    next_msg_id: int = 0
    out_offset: int = 0
    dlq_offset: int = 0
    audits: int = 0
    progress_offset: int = 0
    partitions: dict[str, dict[str, int]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Cursor:
        if not path.exists():
            return cls()
        return cls(**json.loads(path.read_text()))

    def at(self, partition: int) -> Position:
        if partition == 0:
            return Position(
                self.next_msg_id, self.out_offset, self.dlq_offset, self.progress_offset
            )
        return Position(**self.partitions.get(str(partition), {}))

    def moved(self, positions: Mapping[int, Position]) -> Cursor:
        """The cursor after a passing audit: these positions, one audit more."""
        zero = positions.get(0, self.at(0))
        return Cursor(
            next_msg_id=zero.next_msg_id,
            out_offset=zero.out_offset,
            dlq_offset=zero.dlq_offset,
            audits=self.audits + 1,
            progress_offset=zero.progress_offset,
            partitions={
                **self.partitions,
                **{str(p): asdict(pos) for p, pos in positions.items() if p != 0},
            },
        )

    def save(self, path: Path) -> None:
        """Atomically: a crash leaves the old cursor or the new one, never half of one."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        tmp.replace(path)


def merge_ranges(ids: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted ids as inclusive (first, last) ranges: [3, 4, 5, 9] -> [(3, 5), (9, 9)]."""
    merged: list[tuple[int, int]] = []
    for i in sorted(set(ids)):
        if merged and merged[-1][1] == i - 1:
            merged[-1] = (merged[-1][0], i)
        else:
            merged.append((i, i))
    return merged


def format_ranges(ranges: list[tuple[int, int]], limit: int = 50) -> str:
    shown = [f"{a}" if a == b else f"{a}..{b}" for a, b in ranges[:limit]]
    more = f" and {len(ranges) - limit} more ranges" if len(ranges) > limit else ""
    return ", ".join(shown) + more if shown else "none"


@dataclass
class Findings:
    first: int
    end: int
    rows: int
    missing: list[tuple[int, int]] = field(default_factory=list)
    duplicated: list[tuple[int, int]] = field(default_factory=list)
    without_msg_id: int = 0
    # Transactions whose outputs or dead letters are not as many as their progress record
    # says (lost or repeated rows inside a covered range).
    mismatched: list[tuple[int, int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicated or self.without_msg_id or self.mismatched)

    def summary(self) -> str:
        if self.end <= self.first:
            return f"nothing to audit below msg_id {self.end}"
        head = f"msg_id {self.first}..{self.end - 1}: {self.rows} records"
        if self.ok:
            return f"{head}; every msg_id exactly once"
        return (
            f"{head}; missing: {format_ranges(self.missing)}; duplicated: "
            f"{format_ranges(self.duplicated)}; records without a msg_id: {self.without_msg_id}"
            f"; transactions whose outputs differ from their progress record: "
            f"{format_ranges(self.mismatched)}"
        )


@dataclass
class Audited:
    """An audit's findings in each inbound partition."""

    partitions: dict[int, Findings]

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.partitions.values())

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.partitions.values())

    def summary(self) -> str:
        if list(self.partitions) == [0]:
            return self.partitions[0].summary()
        return "; ".join(
            f"partition {p}: {f.summary()}" for p, f in sorted(self.partitions.items())
        )

    def report(self) -> dict[str, Any]:
        """The findings as the report's fields: partition 0's at the top (as a
        one-partition pipeline's always were), every partition's under `partitions`."""

        def fields(f: Findings) -> dict[str, Any]:
            return {
                "first_msg_id": f.first,
                "end_msg_id": f.end,
                "records": f.rows,
                "missing": f.missing,
                "duplicated": f.duplicated,
                "without_msg_id": f.without_msg_id,
                "mismatched": f.mismatched,
            }

        zero = self.partitions.get(0, Findings(0, 0, 0))
        return {
            **fields(zero),
            "records": self.rows,
            "partitions": {str(p): fields(f) for p, f in sorted(self.partitions.items())},
        }


@dataclass(frozen=True)
class Span:
    """One progress record: the transaction covered first..last, with these counts."""

    first: int
    last: int
    outputs: int
    dead_letters: int


def find_problems(
    spans: Iterable[Span],
    rows: Iterable[tuple[int | None, str, int]],
    first: int,
    end: int,
    clip: bool = False,
) -> Findings:
    """Compare the progress records' ranges (below `end`) with first..end-1, and the rows
    read (msg_id, "out" or "dlq", how many) with the counts of the range holding each.
    `clip`: a window that need not start or end at a transaction's boundary (a drill's):
    ranges are cut to it, and only those wholly inside it have their rows counted."""
    ordered = sorted(spans, key=lambda s: (s.first, s.last))
    if clip:
        ordered = [s for s in ordered if s.last >= first and s.first < end]
        whole = {i for i, s in enumerate(ordered) if s.first >= first and s.last < end}
        ordered = [
            Span(max(s.first, first), min(s.last, end - 1), s.outputs, s.dead_letters)
            for s in ordered
        ]
        rows = [r for r in rows if r[0] is None or first <= r[0] < end]
    else:
        whole = set(range(len(ordered)))
    missing: list[int] = []
    duplicated: list[int] = []
    covered_to = first  # every msg_id below it is covered once so far
    for span in ordered:
        if span.first > covered_to:
            missing.extend(range(covered_to, min(span.first, end)))
        if span.first < covered_to:  # an overlap, or below the cursor: a late duplicate
            duplicated.extend(range(span.first, min(covered_to, span.last + 1)))
        covered_to = max(covered_to, span.last + 1)
    missing.extend(range(covered_to, end))
    counted: dict[tuple[int, str], int] = {}
    without = 0
    total = 0
    starts = [s.first for s in ordered]
    misplaced: list[int] = []
    for msg_id, kind, count in rows:
        total += count
        if msg_id is None:
            without += count
            continue
        i = bisect.bisect_right(starts, msg_id) - 1
        if i < 0 or ordered[i].last < msg_id:
            misplaced.append(msg_id)
            continue
        key = (i, kind)
        counted[key] = counted.get(key, 0) + count
    mismatched = [
        (span.first, span.last)
        for i, span in enumerate(ordered)
        if i in whole
        and (counted.get((i, "out"), 0), counted.get((i, "dlq"), 0))
        != (span.outputs, span.dead_letters)
    ]
    return Findings(
        first,
        end,
        total,
        merge_ranges(missing),
        merge_ranges(duplicated + misplaced),
        without,
        mismatched,
    )


def find_id_problems(msg_ids: Iterable[int | None], first: int, end: int) -> Findings:
    """For an output of exactly one record per input and no progress records (the Flink
    and Kafka Streams baselines'): each msg_id first..end-1 read exactly once."""
    counts: dict[int, int] = {}
    without = 0
    rows = 0
    for msg_id in msg_ids:
        rows += 1
        if msg_id is None:
            without += 1
        else:
            counts[msg_id] = counts.get(msg_id, 0) + 1
    missing = (i for i in range(first, end) if i not in counts)
    duplicated = (i for i, c in counts.items() if c > 1 or i < first)
    return Findings(first, end, rows, merge_ranges(missing), merge_ranges(duplicated), without)


def from_records(
    records: Iterable[tuple[str, int | None, str]],
) -> tuple[list[Span], list[tuple[int | None, str, int]]]:
    """(spans, rows) from committed records as (kind, msg_id, value): kind "progress" for
    the progress topic's, "out" or "dlq" for the others'."""
    spans: list[Span] = []
    rows: list[tuple[int | None, str, int]] = []
    for kind, msg_id, value in records:
        if kind == "progress":
            p = json.loads(value)
            spans.append(Span(int(p["first"]), int(p["last"]), p["outputs"], p["dead_letters"]))
        else:
            rows.append((msg_id, kind, 1))
    return spans, rows


def window(records: Iterable[tuple[str, int | None, str]], first: int, end: int) -> Findings:
    """The findings of committed records (`from_records`) over msg_ids first..end-1, a
    window that need not start or end at a transaction's boundary (a drill's, a chaos
    round's)."""
    spans, rows = from_records(records)
    return find_problems(spans, rows, first, end, clip=True)


UP_TO_COMMITTED = "committed"
UP_TO_MARGIN = "margin"
_PARTITION_END = re.compile(r"(\d{1,5}):(\d{1,19})")


@dataclass(frozen=True)
class UpTo:
    """Where an audit ends in each partition (the DAG's `up_to` Param, the job's --up-to):
    "committed", everything the pipeline has committed; "margin", the inbound high watermark
    less the in-flight allowance (TWINSTREAM_AUDIT_INFLIGHT_MSGS); or `asked`, an end per
    partition ("0:5000,1:4200": the msg_ids below 5000 of partition 0 and below 4200 of
    partition 1; a partition not named is not audited this time)."""

    mode: str = UP_TO_COMMITTED
    asked: Mapping[int, int] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> UpTo:
        """The Param's text as an UpTo; UpToError naming the accepted forms."""
        text = text.strip()
        if text in ("", UP_TO_COMMITTED):
            return cls()
        if text == UP_TO_MARGIN:
            return cls(UP_TO_MARGIN)
        asked: dict[int, int] = {}
        for item in text.split(","):
            match = _PARTITION_END.fullmatch(item.strip())
            if match is None:
                raise UpToError(
                    f"up_to {text[:80]!r}: {item.strip()[:40]!r} is not <partition>:<msg_id>; "
                    f"write {UP_TO_COMMITTED!r} (everything committed), {UP_TO_MARGIN!r} (the "
                    "inbound end less the in-flight allowance) or an end per partition, e.g. "
                    "'0:5000' or '0:5000,1:4200' (the msg_ids below each end)"
                )
            partition, end = int(match[1]), int(match[2])
            if partition in asked:
                raise UpToError(
                    f"up_to {text[:80]!r} names partition {partition} twice: give each "
                    "partition one end"
                )
            asked[partition] = end
        return cls("explicit", asked)

    def __str__(self) -> str:
        if self.mode != "explicit":
            return self.mode
        return ",".join(f"{p}:{end}" for p, end in sorted(self.asked.items()))

    def check(self, highs: Mapping[int, int]) -> None:
        """An end per partition must name the inbound topic's partitions and ends no further
        than each one's high watermark (no msg_id exists there to cover)."""
        for partition, end in sorted(self.asked.items()):
            if partition not in highs:
                raise UpToError(
                    f"up_to names partition {partition}, but the inbound topic has partitions "
                    f"{', '.join(map(str, sorted(highs)))}: name only those"
                )
            if end > highs[partition]:
                raise UpToError(
                    f"up_to asks partition {partition} to be audited below msg_id {end}, but "
                    f"its inbound high watermark is {highs[partition]} (msg_ids are inbound "
                    f"offsets): ask for at most {partition}:{highs[partition]}, or 'committed'"
                )


def choose_ends(
    up_to: UpTo,
    starts: Mapping[int, int],
    spans: Mapping[int, Sequence[Span]],
    highs: Mapping[int, int],
    inflight: int,
) -> dict[int, int]:
    """Each partition's end (exclusive) for an audit from `starts` (the cursor's next_msg_id),
    given the committed progress records read from the cursor on (`spans`, partition ->
    records) and the inbound high watermarks. Never below the start, and never inside a
    transaction: a range is audited whole or not yet.

    - committed: the end of the last committed record, so everything committed is covered;
    - margin: the end of the last record below the high watermark less `inflight`;
    - explicit: the asked end, or the first msg_id of a record that straddles it. Without a
      record there (not published yet) the end stays as asked and the audit names the
      uncovered msg_ids as missing: the operator asked for them."""
    up_to.check(highs)
    ends: dict[int, int] = {}
    for p in sorted(highs):
        start = starts.get(p, 0)
        records = spans.get(p, ())
        if up_to.mode == UP_TO_COMMITTED:
            ends[p] = max([start, *(s.last + 1 for s in records)])
        elif up_to.mode == UP_TO_MARGIN:
            limit = max(start, highs[p] - inflight)
            ends[p] = max([start, *(s.last + 1 for s in records if s.last < limit)])
        elif p not in up_to.asked:
            ends[p] = start
        else:
            asked = up_to.asked[p]
            straddling = [s.first for s in records if s.first < asked <= s.last]
            ends[p] = max(start, min([asked, *straddling]))
    return ends


def id_expectations(ranges: Mapping[int, tuple[int, int]]) -> list[Any]:
    """The progress ranges (partition -> (first, end)): each starts once in its partition
    (column `start`: the record id of its first msg_id, twinstream.core.rows.record_id),
    and together they span exactly first..end-1 of each partition (the Python findings name
    the gaps and overlaps)."""
    import great_expectations.expectations as gxe

    span = sum(end - first for first, end in ranges.values())
    expectations = [
        gxe.ExpectColumnValuesToNotBeNull(column="first"),
        gxe.ExpectColumnValuesToBeUnique(column="start"),
        gxe.ExpectColumnSumToBeBetween(column="size", min_value=span, max_value=span),
    ]
    if list(ranges) == [0]:
        first, end = ranges[0]
        expectations += [
            gxe.ExpectColumnMinToBeBetween(column="first", min_value=first, max_value=first),
            gxe.ExpectColumnMaxToBeBetween(column="last", min_value=end - 1, max_value=end - 1),
        ]
    return expectations


@dataclass
class Validation:
    success: bool
    results_path: Path
    data_docs: Path
    statistics: dict[str, Any]
    # Each failed expectation, said in a line (`failed_expectations`).
    failed: list[str] = field(default_factory=list)


# Arguments that say where an expectation looks (its column or columns), or nothing about
# what it expects.
_WHERE = ("column", "column_A", "column_B", "column_list")
_NOT_BOUNDS = {*_WHERE, "batch_id", "result_format", "catch_exceptions", "meta", "rendered_content"}


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_expectation(suite: str, result: Mapping[str, Any]) -> str:
    """One failed expectation of a checkpoint result (an entry of `expectations` in its
    `describe_dict()`), as a line naming the suite, the expectation's type, its column(s),
    its bounds and what was observed: "twinstream_output_values:
    expect_column_values_to_be_between on mem_used_sum20 (min_value=0): 3 of 1000 values
    unexpected, e.g. -12.5, -3.0"."""
    kwargs = result.get("kwargs") or {}
    line = f"{suite}: {result.get('expectation_type', 'an expectation')}"
    where = [_short(kwargs[k]) for k in _WHERE if kwargs.get(k) is not None]
    if where:
        line += f" on {', '.join(where)}"
    bounds = [
        f"{k}={_short(v)}" for k, v in kwargs.items() if k not in _NOT_BOUNDS and v is not None
    ]
    if bounds:
        line += f" ({', '.join(bounds)})"
    exception = result.get("exception_info") or {}
    observed = result.get("result") or {}
    if isinstance(exception, Mapping) and exception.get("raised_exception"):
        return f"{line}: raised {_short(exception.get('exception_message'), 200)}"
    if "observed_value" in observed:
        return f"{line}: observed {_short(observed['observed_value'])}"
    if "unexpected_count" in observed:
        examples = observed.get("partial_unexpected_list") or []
        line += (
            f": {observed['unexpected_count']} of {observed.get('element_count', '?')} values "
            "unexpected"
        )
        if examples:
            line += f", e.g. {', '.join(_short(v, 40) for v in examples[:3])}"
        return line
    return f"{line}: failed"


def failed_expectations(results: Mapping[str, Any]) -> list[str]:
    """Every failed expectation in the suites' results (suite name -> its checkpoint
    result's `describe_dict()`, as `validate` keeps them), one line each."""
    return [
        describe_expectation(suite, expectation)
        for suite, described in results.items()
        for validation in described.get("validation_results", [])
        for expectation in validation.get("expectations", [])
        if not expectation.get("success")
    ]


def report_summary(findings: Audited, failed: Sequence[str], limit: int = 10) -> str:
    """The report's one-line verdict: the failed expectations first, by name (a reader of
    `twinstream status` sees what failed, not only that the msg_ids were all there), then
    the coverage findings."""
    if not failed:
        return findings.summary()
    more = f"; and {len(failed) - limit} more" if len(failed) > limit else ""
    count = f"{len(failed)} expectation{'s' if len(failed) > 1 else ''}"
    return f"{count} FAILED: {'; '.join(failed[:limit])}{more}. Coverage: {findings.summary()}"


@dataclass(frozen=True)
class VersionSuite:
    """The value suite of one version's outputs: its suite's name, the version (None: the
    code on disk, whose suite also takes outputs with no version header, published before
    outputs carried one), the DDL its values are read with and its expectations."""

    name: str
    version: str | None
    value_schema: str
    expectations: list[Any]


def _safe(version: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", version).strip("_") or "unversioned"


def versions_dir(audit_dir: Path) -> Path:
    """Where each audited version's value expectations are kept, one file a version."""
    return audit_dir / "versions"


def save_expectations(
    audit_dir: Path, version: str, value_schema: str, expectations: Sequence[Any]
) -> None:
    """Keep the value expectations of `version` (the code on disk now), so that its outputs
    are checked against them once another version's code replaced it on disk."""
    folder = versions_dir(audit_dir)
    folder.mkdir(parents=True, exist_ok=True)
    kept = {
        "version": version,
        "value_schema": value_schema,
        "expectations": [e.configuration.to_json_dict() for e in expectations],
    }
    path = folder / f"{_safe(version)}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(kept, indent=2))
    os.replace(tmp, path)


def saved_expectations(audit_dir: Path, version: str) -> tuple[str, list[Any]] | None:
    """The value schema and expectations kept for `version`, or None if none were (its code
    was never on disk at an audit)."""
    path = versions_dir(audit_dir) / f"{_safe(version)}.json"
    try:
        kept = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    if kept.get("version") != version:
        return None
    from great_expectations.expectations.expectation_configuration import (
        ExpectationConfiguration,
    )

    expectations = [
        ExpectationConfiguration(
            type=e["type"], kwargs=e.get("kwargs", {}), meta=e.get("meta")
        ).to_domain_obj()
        for e in kept["expectations"]
    ]
    return str(kept["value_schema"]), expectations


def version_suites(
    present: Iterable[str | None],
    on_disk: str,
    value_schema: str,
    expectations: list[Any],
    saved: Callable[[str], tuple[str, list[Any]] | None],
) -> tuple[list[VersionSuite], list[str]]:
    """A value suite per version whose outputs the audit reads (`present`, their version
    headers): the code on disk's own expectations for its outputs (SUITE_VALUES, as before
    any deploy) and every other version's kept ones for its outputs; and the versions
    whose expectations were never kept (outputs checked for exactly once, not for their
    values)."""
    suites = [VersionSuite(SUITE_VALUES, None, value_schema, expectations)]
    unchecked = []
    for version in sorted({v for v in present if v and v != on_disk}):
        kept = saved(version)
        if kept is None:
            unchecked.append(version)
            continue
        schema, theirs = kept
        if theirs:
            suites.append(VersionSuite(f"{SUITE_VALUES}_{_safe(version)}", version, schema, theirs))
    return suites, unchecked


def validate(
    gx_root: Path,
    run_name: str,
    ids_df: Any,
    ranges: Mapping[int, tuple[int, int]],
    value_suites: Sequence[tuple[str, list[Any], Any]] = (),
) -> Validation:
    """Run the suites on the (Spark) DataFrames with a file context under `gx_root`: the
    coverage suite on the progress ranges, and each (name, expectations, values) of
    `value_suites` (the pipeline's own, a version's each); keep the result as JSON and
    update the Data Docs."""
    import great_expectations as gx

    context = gx.get_context(mode="file", project_root_dir=str(gx_root))
    source = context.data_sources.add_or_update_spark(name="twinstream_outputs")
    success = True
    statistics: dict[str, Any] = {}
    results: dict[str, Any] = {}
    suites = [(SUITE_IDS, id_expectations(ranges), ids_df)]
    suites += [(name, expectations, df) for name, expectations, df in value_suites if expectations]
    for suite_name, expectations, df in suites:
        # New each run: the DataFrame is a batch parameter, the suite is this code.
        if suite_name in source.get_asset_names():
            source.delete_asset(suite_name)
        asset = source.add_dataframe_asset(name=suite_name)
        batch = asset.add_batch_definition_whole_dataframe(f"{suite_name}_batch")
        suite = context.suites.add_or_update(
            gx.ExpectationSuite(name=suite_name, expectations=expectations)
        )
        definition = context.validation_definitions.add_or_update(
            gx.ValidationDefinition(name=f"{suite_name}_validation", data=batch, suite=suite)
        )
        checkpoint = context.checkpoints.add_or_update(
            gx.Checkpoint(
                name=f"{suite_name}_checkpoint",
                validation_definitions=[definition],
                actions=[gx.checkpoint.UpdateDataDocsAction(name="data_docs")],
                result_format="SUMMARY",
            )
        )
        result = checkpoint.run(
            batch_parameters={"dataframe": df},
            run_id=gx.core.run_identifier.RunIdentifier(run_name=f"{run_name}-{suite_name}"),
        )
        success = success and bool(result.success)
        described = result.describe_dict()
        results[suite_name] = described
        statistics[suite_name] = {
            "success": bool(result.success),
            "expectations": [
                {
                    "type": r["expectation_type"],
                    "success": r["success"],
                    "kwargs": {k: v for k, v in r["kwargs"].items() if k != "batch_id"},
                }
                for v in described.get("validation_results", [])
                for r in v.get("expectations", [])
            ],
        }
    results_path = gx_root / "results" / f"{run_name}.json"
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(results, indent=2, default=str))
    return Validation(
        success,
        results_path,
        data_docs_site(gx_root) / "index.html",
        statistics,
        failed_expectations(results),
    )


def data_docs_site(audit_dir: Path) -> Path:
    """Where Great Expectations writes a pipeline's Data Docs site (its local_site)."""
    return audit_dir / "gx" / "uncommitted" / "data_docs" / "local_site"


# A cursor of its own (an audit of another copy of a pipeline's topics) is named by an id,
# never by a path: a trigger's Params cannot make the audit job read or write a file
# outside the pipeline's audit folder.
CURSOR_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")


def param_pattern(body: str) -> str:
    """A Param's JSON-schema pattern: `body` and nothing else. Airflow validates with
    Python's re.search, where "$" also matches before a final newline ("latest\n" passed
    "^latest$"); the lookahead refuses that, and is a no-op in the UI's JavaScript."""
    return f"^({body})$(?!\n)"


CURSOR_ID_PATTERN = param_pattern(f"({CURSOR_ID.pattern})?")
# The forms UpTo.parse reads: committed, margin, or <partition>:<msg_id>[,...].
UP_TO_PATTERN = param_pattern(r"committed|margin|\d{1,5}:\d{1,19}(,\d{1,5}:\d{1,19})*")
# Kafka's own rule for a topic name (the DAG's Params for other copies of the topics).
TOPIC_NAME_PATTERN = param_pattern(r"([A-Za-z0-9._-]{1,249})?")
# What restore_and_resync's snapshot Param takes: latest, cold, or a snapshot's id.
SNAPSHOT_PARAM_PATTERN = param_pattern(r"latest|proven|cold|\d{8}T\d{6}\.\d{6}Z-[a-z0-9-]+-b\d+")


def cursor_file(audit_dir: Path, cursor: str = "") -> Path:
    """The cursor an audit uses: the pipeline's own (empty), or the one named by an id,
    kept in the pipeline's audit folder (`cursors/<id>/cursor.json`, its report beside)."""
    if not cursor:
        return audit_dir / "cursor.json"
    if not CURSOR_ID.fullmatch(cursor):
        raise ValueError(
            f"cursor {cursor[:80]!r} is not a cursor id: lower-case letters, digits, '-' and "
            "'_', at most 63, starting with a letter or digit (a cursor is kept in the "
            f"pipeline's audit folder, {audit_dir}/cursors/<id>/, never at a path)"
        )
    return audit_dir / "cursors" / cursor / "cursor.json"


def verdict(report_path: Path, run_id: str) -> dict[str, Any]:
    """The report the audit job wrote for `run_id`; AuditFailed when it found a problem.
    A report of another run (the job crashed before writing its own) is an error."""
    try:
        report: dict[str, Any] = json.loads(report_path.read_text())
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"no readable audit report at {report_path}: {exc}") from exc
    if report.get("run_id") != run_id:
        raise RuntimeError(
            f"{report_path} is the report of run {report.get('run_id')!r}, not {run_id!r}: "
            "the audit job did not finish; see its log"
        )
    if not report["ok"]:
        what = report["summary"]
        if not report["expectations_met"]:
            what += f"; malformed output values: see {report['results']}"
        raise AuditFailed(
            f"audit FAILED: {what}. The cursor stays, so the next audit checks this range "
            "again: find the cause (the engines' logs, GET /pipeline uncovered_ranges), then "
            f"move the cursor past the range by hand once it is understood; Data Docs: "
            f"{report['data_docs']}"
        )
    return report


COPY_PARAMS = ("outbound_topic", "dlq_topic", "progress_topic", "cursor")


def chosen_pipelines(stack: Sequence[str], params: Mapping[str, Any]) -> list[str]:
    """The pipelines an audit_output_topic run audits: the one its `pipeline` Param names,
    else every pipeline of the stack. Other copies of topics (or another cursor) belong to
    one pipeline: refused when that pipeline is not named and the stack runs several."""
    named = str(params.get("pipeline") or "")
    if named:
        if named not in stack:
            raise ValueError(f"pipeline {named!r} is not one of the stack's: {', '.join(stack)}")
        return [named]
    copies = [k for k in COPY_PARAMS if params.get(k)]
    if copies and len(stack) > 1:
        raise ValueError(
            f"{', '.join(copies)} name another copy of one pipeline's topics: set the "
            f"`pipeline` Param too (one of {', '.join(stack)})"
        )
    return list(stack)


def job_args(pipeline: str, params: Mapping[str, Any], run_id: str) -> list[str]:
    """spark_jobs/audit_output.py's arguments for one pipeline of the run. An `up_to` the
    job cannot follow fails here, before a Spark job is submitted."""
    args = ["--pipeline", pipeline]
    for key in COPY_PARAMS:
        if params.get(key):
            args += [f"--{key.replace('_', '-')}", str(params[key])]
    up_to = UpTo.parse(str(params.get("up_to") or ""))
    return [*args, "--up-to", str(up_to), "--run-id", run_id]


def below_the_engines(niceness: int) -> Callable[[Any], None]:
    """The audit job's `pre_execute`: the task's thread, and so the spark-submit it starts
    and the Spark JVM under it (children inherit it), at `niceness` below the engines
    (TWINSTREAM_JOB_NICENESS): the audit can wait a minute, an output cannot."""

    def pre_execute(context: Any) -> None:
        from twinstream.stack.launch import lower_priority

        lower_priority(niceness)

    return pre_execute


def audit_verdict(audit_dir: Path, params: Mapping[str, Any], run_id: str) -> dict[str, Any]:
    """The `verdict` task: the report the job wrote for this run (its cursor's), recorded
    as the run's `verdict` (twinstream.ops.audit_runs); a finding fails the task at once
    (the same data gives the same finding), a missing report is an error to retry."""
    from airflow.sdk.exceptions import AirflowFailException

    from twinstream.ops.audit_runs import outcome_of

    report = cursor_file(audit_dir, str(params.get("cursor") or "")).parent / REPORT
    with outcome_of(audit_dir, run_id, "verdict") as say:
        try:
            found = verdict(report, run_id)
        except AuditFailed as exc:
            raise AirflowFailException(str(exc)) from exc
        say(str(found.get("summary", "passed")))
        return found
