"""The per-record guard: decoding an untrusted record without letting it fail a batch.

Guarantee: `load_json` returns the decoded value or a `Rejected` with a reason code; it
never raises, whatever the bytes (deep nesting, numbers of any length, invalid UTF-8,
duplicate members, lone surrogates). The limits are checked before the work they protect
(nesting before the recursive decoder, a number's length before `int()`), so a hostile
record costs no more than a legitimate one of the same size. Reason codes:

- `oversize`: more bytes than `max_bytes`
- `too_deep`: arrays and objects nested deeper than `max_depth`
- `number_too_long`: a number literal longer than `max_number_chars`
- `not_json`: not UTF-8, not JSON, or not the JSON type asked for
- `duplicate_key`: an object names a member twice (decoders disagree on which one wins)
- `bad_encoding`: a string holds a lone surrogate, which no UTF-8 output can carry
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from twinstream.core.rows import clean_reason


@dataclass(frozen=True)
class Limits:
    max_bytes: int = 64 * 1024
    max_depth: int = 64
    max_number_chars: int = 64


@dataclass(frozen=True)
class Rejected:
    """Why a record cannot be used; `reason` starts with a code (see the module doc)."""

    reason: str


class _Reject(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_SURROGATE = re.compile("[\ud800-\udfff]")


def nesting_depth(data: bytes) -> int:
    """How deep arrays and objects nest, brackets inside strings not counted."""
    if data.count(b"[") + data.count(b"{") == 0:
        return 0
    depth = deepest = 0
    for byte in _STRING.sub(b"", data):
        if byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


def load_json(raw: bytes | None, limits: Limits) -> Any:
    """The decoded JSON value, or Rejected. Never raises."""
    data = raw or b""
    if len(data) > limits.max_bytes:
        return Rejected(f"oversize: {len(data)} bytes > {limits.max_bytes}")
    # Only a record with more brackets than the limit can nest deeper than it: the exact
    # scan runs for those alone.
    if data.count(b"[") + data.count(b"{") > limits.max_depth:
        depth = nesting_depth(data)
        if depth > limits.max_depth:
            return Rejected(f"too_deep: nested {depth} levels > {limits.max_depth}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return Rejected("not_json: not UTF-8")

    def number(kind: type[int] | type[float]) -> Any:
        def convert(literal: str) -> int | float:
            if len(literal) > limits.max_number_chars:
                raise _Reject(
                    f"number_too_long: a number of {len(literal)} characters > "
                    f"{limits.max_number_chars}"
                )
            return kind(literal)

        return convert

    def members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) < len(pairs):
            names = [k for k, _ in pairs]
            twice = next(k for i, k in enumerate(names) if k in names[:i])
            raise _Reject(f"duplicate_key: {twice[:64]!r} appears more than once")
        return obj

    try:
        value = json.loads(
            text,
            parse_int=number(int),
            parse_float=number(float),
            object_pairs_hook=members,
        )
    except _Reject as exc:
        return Rejected(exc.reason)
    except json.JSONDecodeError as exc:
        return Rejected(f"not_json: {exc.msg} at char {exc.pos}")
    except Exception as exc:  # the last line: whatever else decoding raises
        return Rejected(clean_reason(f"not_json: {type(exc).__name__}: {exc}"))
    # Valid UTF-8 holds no surrogate: only a JSON \u escape can decode to a lone one.
    if "\\u" not in text:
        return value
    if _has_surrogate(value):
        return Rejected("bad_encoding: a string holds a lone surrogate")
    return value


def _has_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return _SURROGATE.search(value) is not None
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_surrogate(v) for v in value)
    return False
