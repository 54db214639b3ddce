"""The quarantine's search and its checkpoint surgery, without Spark: a failed range is
halved until one record fails alone (twice), offsets another engine quarantined are
excluded without a search, and the reason is the exception's own line."""

from __future__ import annotations

import json
from pathlib import Path

from twinstream.core.quarantine import (
    CONFIRMATIONS,
    FailedBatch,
    describe,
    failed_batch,
    forget_batch,
    next_step,
)

TOPIC = "p.in"


def _offsets(checkpoint: Path, batch: int, end: int) -> None:
    folder = checkpoint / "offsets"
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1}
    (folder / str(batch)).write_text(f"v1\n{json.dumps(meta)}\n{json.dumps({TOPIC: {'0': end}})}")
    (folder / f".{batch}.crc").write_text("crc")


def _commit(checkpoint: Path, batch: int) -> None:
    folder = checkpoint / "commits"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def test_the_failed_batch_is_the_planned_one_without_a_commit(tmp_path: Path):
    _offsets(tmp_path, 0, 100)
    _commit(tmp_path, 0)
    assert failed_batch(tmp_path, TOPIC) is None
    _offsets(tmp_path, 1, 350)
    assert failed_batch(tmp_path, TOPIC) == FailedBatch(1, 100, 350)
    forget_batch(tmp_path, 1)
    assert sorted(p.name for p in (tmp_path / "offsets").iterdir()) == [".0.crc", "0"]
    assert failed_batch(tmp_path, TOPIC) is None


def test_a_first_batch_starts_at_the_sources_initial_offset(tmp_path: Path):
    source = tmp_path / "sources" / "0"
    source.mkdir(parents=True)
    (source / "0").write_text(f"v1\n{json.dumps({TOPIC: {'0': 40}})}")
    _offsets(tmp_path, 0, 90)
    assert failed_batch(tmp_path, TOPIC) == FailedBatch(0, 40, 90)


def test_one_poison_record_among_many_is_found_by_halving_then_confirmed():
    poison, start, end = 1234, 1000, 2000
    search = None
    restarts = 0
    while True:
        failed = FailedBatch(restarts, start, end)
        step, search = next_step(failed, {}, {}, search)
        restarts += 1
        if step.action == "quarantine":
            break
        if step.action == "split":
            assert step.cap is not None
            # The query replans from `start` in batches of `cap`: the failing one holds poison.
            start += (poison - start) // step.cap * step.cap
            end = min(end, start + step.cap)
        else:
            assert step.action == "retry"
    assert step.offset == poison
    assert restarts <= 11 + CONFIRMATIONS  # log2(1000) halvings, then the confirmations


def test_offsets_another_engine_quarantined_are_excluded_without_a_search():
    failed = FailedBatch(7, 500, 1500)
    step, _ = next_step(failed, {1234: "quarantined: X: y"}, {}, None)
    assert step.action == "exclude"
    # Already excluded and still failing: something else in the range; search it.
    step, _ = next_step(failed, {1234: "quarantined: X: y"}, {1234: "quarantined: X: y"}, None)
    assert (step.action, step.cap) == ("split", 500)


def test_a_record_that_passes_alone_once_is_not_quarantined_on_one_failure():
    step, search = next_step(FailedBatch(1, 10, 11), {}, {}, None)
    assert (step.action, search.failures_alone) == ("retry", 1)
    step, search = next_step(FailedBatch(2, 10, 11), {}, {}, search)
    assert (step.action, step.offset) == ("quarantine", 10)


def test_the_reason_is_the_python_workers_exception_line():
    trace = (
        "An exception was thrown from the Python worker. Please see the stack trace below.\n"
        "Traceback (most recent call last):\n"
        '  File "pipeline.py", line 120, in per_host\n'
        "RuntimeError: fault injected: a record holds b'BOOM'\n"
        "\tat org.apache.spark.api.python.BasePythonRunner...\n"
    )

    class PythonException(Exception):
        pass

    reason = describe(PythonException(trace))
    assert reason == "PythonException: RuntimeError: fault injected: a record holds b'BOOM'"
