"""A hostile corpus for the hostmetrics pipeline: what real producers send by mistake and
what attackers try, each case with the reason code the pipeline must give it (`"out"`:
the record is valid and must be published). Most codes come from the framework's
validation in the JVM (`twinstream.engine.pipeline.validated`), `bad_time` and `overflow` from the
example's transform.

Sizes are built around the record size limit in force, so the corpus exercises its edge on
any configuration. Nesting and number length have no limit of their own: the JVM parser
does not recurse on a Python stack (Jackson refuses nesting past 1,000 levels), and a
number is read as the type its field declares or refused. Cases that share a host come in
order and must be sent in that order (the second relies on the first being in the state).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

GOOD: dict[str, Any] = {
    "host": "hostile-1",
    "ts": "2026-01-01T00:00:00.000Z",
    "cpu_user": 12.5,
    "cpu_system": 3.0,
    "mem_used_mb": 2048,
    "mem_free_mb": 6144,
}
INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Case:
    name: str
    raw: bytes | None  # None: a tombstone (a record with no value)
    expect: str  # a reason code, or "out"


def _json(**changes: Any) -> bytes:
    record = {**GOOD, **changes}
    return json.dumps({k: v for k, v in record.items() if v is not ...}).encode()


def _sized(size: int, **changes: Any) -> bytes:
    """A valid record of exactly `size` bytes (a padding member fills it up)."""
    base = _json(**changes, pad="")
    if size < len(base):
        raise ValueError(f"{size} bytes is too small for a record")
    return _json(**changes, pad="x" * (size - len(base)))


def _nested(depth: int) -> bytes:
    """A valid record whose `extra` member nests arrays so that the record is `depth` deep
    (the record's own object is the first level)."""
    inner = "[" * (depth - 1) + "]" * (depth - 1)
    return _json(extra="PLACEHOLDER").replace(b'"PLACEHOLDER"', inner.encode())


# Jackson's nesting limit (StreamReadConstraints): past it, a record is no JSON to Spark.
JACKSON_MAX_DEPTH = 1000


def cases(max_bytes: int) -> list[Case]:
    fields = ("host", "ts", "cpu_user", "cpu_system", "mem_used_mb", "mem_free_mb")
    wrong: dict[str, Any] = {
        "host": 7,
        "ts": 1767225600000,
        "cpu_user": "12.5",
        "cpu_system": None,
        "mem_used_mb": 2048.5,
        "mem_free_mb": [1],
    }
    corpus = [
        # Nesting: deep but within Jackson's limit, past it, and far past it.
        Case("depth_64", _nested(64), "out"),
        Case("depth_past_jackson", _nested(JACKSON_MAX_DEPTH + 1), "not_json"),
        Case(
            "arrays_nested_far",
            b"[" * (max_bytes // 2) + b"]" * (max_bytes // 2),
            "not_json",
        ),
        # An object nested as deep as the size limit allows: past Jackson's limit, no
        # JSON; within it (a small size limit), an object without the schema's members.
        Case(
            "objects_nested_far",
            (b'{"a":' * (max_bytes // 6)) + b"1" + b"}" * (max_bytes // 6),
            "not_json" if max_bytes // 6 > JACKSON_MAX_DEPTH else "missing_field",
        ),
        # Brackets inside strings are text, not nesting.
        Case("brackets_in_a_string", _json(note="[" * 2000), "out"),
        # Sizes: at the limit, one past it, and a record near Kafka's own message limit.
        Case("size_at_limit", _sized(max_bytes), "out"),
        Case("size_past_limit", _sized(max_bytes + 1), "oversize"),
        Case("size_900k", _sized(900_000), "oversize"),
        # Numbers: long ones are read as the double they denote; 401 digits is past a
        # double's range; a literal NaN or Infinity is not JSON.
        Case("long_integer", _json(mem_used_mb=int("1" * 18)), "out"),
        Case(
            "float_of_65_chars",
            _json(cpu_user=1.0).replace(b"1.0", b"1." + b"0" * 63),
            "out",
        ),
        Case("int_401_digits", _json(cpu_user=int("9" * 401)), "out_of_range"),
        Case("float_1e400", _json().replace(b"12.5", b"1e400"), "out_of_range"),
        Case("nan_literal", _json().replace(b"12.5", b"NaN"), "not_json"),
        Case("infinity_literal", _json().replace(b"3.0", b"-Infinity"), "not_json"),
        Case("int64_max", _json(host="hostile-int64", mem_used_mb=INT64_MAX), "out"),
        # The window's sum leaves 64 bits with the second one: rejected, state untouched.
        Case("int64_sum_overflow", _json(host="hostile-int64", mem_used_mb=INT64_MAX), "overflow"),
        Case("int64_past_max", _json(mem_free_mb=INT64_MAX + 1), "out_of_range"),
        Case("int64_min", _json(mem_free_mb=-(2**63)), "out"),
        # A bound the pipeline declares (mem_used_mb >= 0): dead-lettered by the guard, so
        # the audit's expectation derived from it (mem_used_sum20 >= 0) cannot fail.
        Case("negative_mem_used", _json(mem_used_mb=-5), "out_of_range"),
        Case("double_max", _json(host="hostile-double", cpu_user=1.7976931348623157e308), "out"),
        # Two 1e308 for one host: math.fsum overflows on the second.
        Case("double_sum_overflow", _json(host="hostile-double", cpu_user=1e308), "overflow"),
        Case("after_overflow_state_intact", _json(host="hostile-double", cpu_user=1.0), "out"),
        Case("negative_zero", _json(cpu_user=-0.0), "out"),
        Case("exponent_in_an_int_field", _json().replace(b"2048", b"2e3"), "wrong_type"),
        # Encodings.
        Case("not_utf8", b'{"host": "\xff\xfe"}', "not_json"),
        Case("utf8_bom", b"\xef\xbb\xbf" + _json(), "not_json"),
        Case(
            "lone_surrogate",
            _json(host="PLACEHOLDER").replace(b"PLACEHOLDER", b"\\ud800"),
            "bad_encoding",
        ),
        Case(
            "surrogate_pair",
            _json(host="PLACEHOLDER").replace(b"PLACEHOLDER", b"\\ud83d\\ude00"),
            "out",
        ),
        Case("unicode_host", _json(host="хост-☃-𝄞"), "out"),
        Case("nul_in_host", _json(host="a\u0000b"), "out"),
        # Duplicate members: decoders disagree on which wins.
        Case(
            "duplicate_host",
            _json(host="PLACEHOLDER").replace(b'"PLACEHOLDER"', b'"a", "host": "b"'),
            "duplicate_key",
        ),
        Case(
            "duplicate_number",
            _json().replace(b'"cpu_user": 12.5', b'"cpu_user": 1, "cpu_user": 2'),
            "duplicate_key",
        ),
        # Empty and null values, tombstones, other JSON types, broken syntax.
        Case("empty_value", b"", "not_json"),
        Case("tombstone", None, "not_json"),
        Case("json_null", b"null", "not_json"),
        Case("json_string", b'"hello"', "not_json"),
        Case("json_array", b"[1, 2, 3]", "not_json"),
        Case("empty_object", b"{}", "missing_field"),
        Case("truncated", _json()[:-5], "not_json"),
        Case("trailing_garbage", _json() + b" x", "not_json"),
        Case("single_quotes", _json().replace(b'"', b"'"), "not_json"),
        Case("whitespace_padded", b"  \n\t" + _json() + b"\n  ", "out"),
        Case("unknown_fields", _json(extra={"nested": [1, {"x": None}]}), "out"),
        # Time edge cases.
        Case("leap_second", _json(ts="2026-12-31T23:59:60Z"), "bad_time"),
        Case("year_9999", _json(host="hostile-time", ts="9999-12-31T23:59:59.999Z"), "out"),
        Case("year_1", _json(host="hostile-time-1", ts="0001-01-01T00:00:00Z"), "out"),
        Case("local_offset", _json(ts="2026-01-01T02:00:00+02:00"), "bad_time"),
        Case("no_zone", _json(ts="2026-01-01T00:00:00"), "bad_time"),
        Case("ts_huge_text", _json(ts="2" * (max_bytes // 2)), "bad_time"),
        Case("empty_host", _json(host=""), "wrong_type"),
        Case("bool_as_number", _json(cpu_system=True), "wrong_type"),
    ]
    # Every field missing in turn, and every field of the wrong type in turn.
    corpus += [Case(f"missing_{f}", _json(**{f: ...}), "missing_field") for f in fields]
    corpus += [Case(f"wrong_{f}", _json(**{f: wrong[f]}), "wrong_type") for f in fields]
    return corpus


def interleave(
    good: Iterable[bytes | None], corpus: list[Case], every: int
) -> Iterator[tuple[bytes | None, Case | None]]:
    """The good records (case None) with one hostile record after every `every` of them,
    in corpus order, until both are used up."""
    hostile = iter(corpus)
    for i, record in enumerate(good, start=1):
        yield record, None
        if i % every == 0:
            case = next(hostile, None)
            if case is not None:
                yield case.raw, case
    for case in hostile:
        yield case.raw, case
