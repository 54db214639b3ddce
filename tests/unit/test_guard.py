"""The per-record guard: no record's bytes can make decoding or the window raise, a
rejected record leaves the state as it was, and a dead letter always fits one message."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from twinstream.core.rows import MAX_REASON_CHARS, dead_letter
from twinstream.guard import Limits, Rejected, load_json, nesting_depth
from twinstream.hostmetrics import Window, process_host, process_record, reference
from twinstream.testing.hostile import GOOD, cases

HOUR_MS = 3_600_000
LIMITS = Limits(max_bytes=4096, max_depth=8, max_number_chars=24)


def _reason(raw: bytes | None, limits: Limits = LIMITS) -> str:
    value = load_json(raw, limits)
    assert isinstance(value, Rejected), value
    return value.reason


def test_nesting_is_measured_outside_strings():
    assert nesting_depth(b'{"a": [[1]], "b": "[[[[[[["}') == 3
    assert nesting_depth(b'{"a": "\\"[[[["}') == 1
    assert nesting_depth(b"42") == 0


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"[" * 3000 + b"]" * 3000, "oversize"),  # 6000 bytes > 4096
        (b"[" * 2000 + b"]" * 2000, "too_deep"),  # json.loads alone: RecursionError
        (b'{"a":' * 9 + b"1" + b"}" * 9, "too_deep"),
        (b'{"n": ' + b"9" * 25 + b"}", "number_too_long"),
        (b'{"n": 1.' + b"0" * 23 + b"}", "number_too_long"),
        (b'{"a": 1, "a": 2}', "duplicate_key"),
        (b'{"h": "\\udc00"}', "bad_encoding"),
        (b"\xc3\x28", "not_json"),
        (b"{", "not_json"),
        (None, "not_json"),
    ],
)
def test_hostile_bytes_are_rejected_with_a_code_and_never_raise(raw, code):
    assert _reason(raw).startswith(f"{code}: ")


def test_values_within_every_limit_decode():
    assert load_json(b'{"n": ' + b"9" * 24 + b"}", LIMITS) == {"n": int("9" * 24)}
    assert load_json(b"[" * 8 + b"]" * 8, LIMITS) == [[[[[[[[]]]]]]]]
    assert load_json(b'{"h": "\\ud83d\\ude00"}', LIMITS) == {"h": "\U0001f600"}


def test_the_whole_hostile_corpus_gets_the_declared_reason_through_the_reference():
    """The corpus the integration test sends: each case's reason as the pipeline gives it."""
    for limits in (Limits(max_bytes=4096), Limits()):
        corpus = cases(limits)
        assert len(corpus) >= 25
        assert len({c.expect for c in corpus}) >= 10
        outputs = list(reference([(i, c.raw) for i, c in enumerate(corpus)], HOUR_MS, limits))
        for case, output in zip(corpus, outputs, strict=True):
            if case.expect == "out":
                assert output.kind == "out", (case.name, output.value[:200])
            else:
                reason = json.loads(output.value)["reason"]
                assert reason.startswith(f"{case.expect}: "), (case.name, reason)


def test_a_rejected_record_never_touches_the_state():
    big = json.dumps({**GOOD, "cpu_user": 1e308}).encode()
    window, first = process_record(None, 1, big, HOUR_MS, LIMITS)
    assert first.kind == "out"
    assert window is not None
    after, second = process_record(window, 2, big, HOUR_MS, LIMITS)
    assert second.kind == "dlq"
    assert json.loads(second.value)["reason"].startswith("overflow: ")
    assert after is window


def test_an_exception_anywhere_in_a_record_becomes_a_dead_letter(monkeypatch):
    import twinstream.hostmetrics as hostmetrics

    def broken_step(window: Window | None, event: object, retention_ms: int) -> None:
        raise KeyError("a bug in the transform")

    monkeypatch.setattr(hostmetrics, "step", broken_step)
    good = json.dumps(GOOD).encode()
    window, outputs = process_host(None, [(5, good), (6, b"x")], HOUR_MS, LIMITS)
    assert window is None
    reasons = [json.loads(o.value)["reason"] for o in outputs]
    assert reasons[0] == "error: KeyError: 'a bug in the transform'"
    assert reasons[1].startswith("not_json: ")


def test_a_dead_letter_always_fits_one_message_and_says_what_it_cut():
    raw = bytes(range(256)) * 4000  # 1,024,000 bytes: base64 alone would be 1.37 MB
    limit = 1_000_000
    output = dead_letter(7, "oversize: " + "é" * 5000, raw, limit)
    assert len(output.value.encode()) < limit - 1024
    value = json.loads(output.value)
    assert value["truncated"] is True
    assert value["raw_bytes"] == len(raw)
    assert value["raw_sha256"] == hashlib.sha256(raw).hexdigest()
    prefix = base64.b64decode(value["raw"])
    assert raw.startswith(prefix)
    assert len(prefix) > limit // 2
    assert len(value["reason"]) == MAX_REASON_CHARS


def test_a_small_dead_letter_is_unchanged_and_whole():
    value = json.loads(dead_letter(3, "not_json: x", b"abc", 1_000_000).value)
    assert value == {"msg_id": 3, "reason": "not_json: x", "raw": "YWJj"}
