"""The quarantine's search and its checkpoint surgery, without Spark: a failed batch's
records (over every partition) are halved until one fails alone (twice), records another
engine quarantined are excluded without a search, and the reason is the exception's own
line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from twinstream.core.checkpoint import narrow_batch
from twinstream.core.quarantine import (
    CONFIRMATIONS,
    FailedBatch,
    Step,
    describe,
    failed_batch,
    forget_batch,
    next_step,
)
from twinstream.core.rows import record_id

TOPIC = "p.in"


@pytest.fixture
def tmp_path(storage_root):
    """Every test here on a local folder and on fsspec's memory file system."""
    return storage_root


def _offsets(checkpoint: Path, batch: int, end: int | dict[int, int]) -> None:
    """An offset log entry as the engines' plans write it: a line per source, and the plan
    reads the inbound topic twice (the transform's branch and the dead letters')."""
    folder = checkpoint / "offsets"
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1}
    ends = {0: end} if isinstance(end, int) else end
    offsets = json.dumps({TOPIC: {str(p): o for p, o in ends.items()}})
    (folder / str(batch)).write_text(f"v1\n{json.dumps(meta)}\n{offsets}\n{offsets}")
    (folder / f".{batch}.crc").write_text("crc")


def _commit(checkpoint: Path, batch: int) -> None:
    folder = checkpoint / "commits"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def failed(batch: int, starts: dict[int, int], ends: dict[int, int]) -> FailedBatch:
    return FailedBatch(batch, starts, ends)


def test_the_failed_batch_is_the_planned_one_without_a_commit(tmp_path: Path):
    _offsets(tmp_path, 0, 100)
    _commit(tmp_path, 0)
    assert failed_batch(tmp_path, TOPIC) is None
    _offsets(tmp_path, 1, 350)
    found = failed_batch(tmp_path, TOPIC)
    assert found == failed(1, {0: 100}, {0: 350})
    assert (found.size, found.describe()) == (250, "msg_id 100..349")
    forget_batch(tmp_path, 1)
    assert sorted(p.name for p in (tmp_path / "offsets").iterdir()) == [".0.crc", "0"]
    assert failed_batch(tmp_path, TOPIC) is None


def test_a_first_batch_starts_at_the_sources_initial_offset(tmp_path: Path):
    source = tmp_path / "sources" / "0"
    source.mkdir(parents=True)
    (source / "0").write_text(f"v1\n{json.dumps({TOPIC: {'0': 40, '1': 7}})}")
    _offsets(tmp_path, 0, {0: 90, 1: 7})
    found = failed_batch(tmp_path, TOPIC)
    assert found is not None
    assert found.ranges() == {0: (40, 90)}  # partition 1 read nothing


def test_narrowing_rewrites_only_the_uncommitted_batchs_offsets(tmp_path: Path):
    _offsets(tmp_path, 0, {0: 10, 1: 20, 2: 30})
    _commit(tmp_path, 0)
    _offsets(tmp_path, 1, {0: 110, 1: 220, 2: 330})
    narrow_batch(tmp_path, 1, TOPIC, {0: 10, 1: 120, 2: 30})
    lines = (tmp_path / "offsets" / "1").read_text().splitlines()
    assert lines[:2] == ["v1", json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1})]
    # Both sources: Spark runs each branch with its own line.
    assert [json.loads(line) for line in lines[2:]] == [{TOPIC: {"0": 10, "1": 120, "2": 30}}] * 2
    assert not (tmp_path / "offsets" / ".1.crc").exists()  # it checksummed the old entry
    assert sorted(p.name for p in (tmp_path / "offsets").iterdir()) == [".0.crc", "0", "1"]
    assert failed_batch(tmp_path, TOPIC) == failed(1, {0: 10, 1: 20, 2: 30}, {0: 10, 1: 120, 2: 30})
    with pytest.raises(ValueError, match="committed"):
        narrow_batch(tmp_path, 0, TOPIC, {0: 5, 1: 20, 2: 30})
    with pytest.raises(ValueError, match="partitions"):
        narrow_batch(tmp_path, 1, TOPIC, {0: 10})


def search(poison: tuple[int, int], starts: dict[int, int], ends: dict[int, int]) -> list[Step]:
    """Run the search as Spark and the engine do: a narrowed batch that holds the poison
    fails again; one that does not is committed, and the next batch Spark plans (here: up
    to `ends` again) starts after it."""
    steps: list[Step] = []
    bisection = None
    batch = failed(0, dict(starts), dict(ends))
    while len(steps) < 100:
        step, bisection = next_step(batch, {}, {}, bisection)
        steps.append(step)
        if step.action == "quarantine":
            return steps
        if step.action == "split":
            assert step.ends is not None
            narrowed = failed(batch.batch_id, batch.starts, step.ends)
            if narrowed.holds(record_id(*poison)):
                batch = narrowed
            else:  # committed; the next batch reads from its end to `ends`
                batch = failed(batch.batch_id + 1, step.ends, dict(ends))
    raise AssertionError(f"no end: {steps[-5:]}")


def test_one_poison_record_among_many_is_found_by_halving_then_confirmed():
    steps = search((0, 1234), {0: 1000}, {0: 2000})
    assert steps[-1].record == 1234
    assert [s.action for s in steps[-CONFIRMATIONS:]] == ["retry"] * (CONFIRMATIONS - 1) + [
        "quarantine"
    ]
    assert len(steps) <= 11 + CONFIRMATIONS  # about log2(1000) halvings, then the confirmations


@pytest.mark.parametrize("poison", [(0, 1000), (1, 5003), (2, 399), (2, 300)])
def test_a_poison_record_in_any_partition_is_found_and_named_by_its_record_id(poison):
    starts, ends = {0: 1000, 1: 5000, 2: 300}, {0: 1400, 1: 5400, 2: 400}
    steps = search(poison, starts, ends)
    assert steps[-1].record == record_id(*poison)
    assert len(steps) <= 11 + CONFIRMATIONS  # about log2(900) halvings, then the confirmations
    # Every narrowed batch reads a prefix of each partition from where the batch starts.
    for step in steps:
        if step.ends is not None:
            assert sorted(step.ends) == [0, 1, 2]


def test_the_first_half_is_taken_in_partition_then_offset_order():
    step, bisection = next_step(failed(3, {0: 10, 1: 0, 2: 50}, {0: 14, 1: 0, 2: 56}), {}, {}, None)
    assert bisection.suspects == {0: (10, 14), 2: (50, 56)}
    assert (step.action, step.ends) == ("split", {0: 14, 1: 0, 2: 51})


def test_offsets_another_engine_quarantined_are_excluded_without_a_search():
    batch = failed(7, {0: 500, 2: 0}, {0: 1500, 2: 100})
    other = {record_id(2, 42): "quarantined: X: y"}
    step, _ = next_step(batch, other, {}, None)
    assert step.action == "exclude"
    # Already excluded and still failing: something else in the batch; search it.
    step, _ = next_step(batch, other, other, None)
    assert (step.action, step.ends) == ("split", {0: 1050, 2: 0})


def test_a_record_that_passes_alone_once_is_not_quarantined_on_one_failure():
    step, bisection = next_step(failed(1, {1: 10}, {1: 11}), {}, {}, None)
    assert (step.action, bisection.failures_alone) == ("retry", 1)
    step, bisection = next_step(failed(1, {1: 10}, {1: 11}), {}, {}, bisection)
    assert (step.action, step.record) == ("quarantine", record_id(1, 10))


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
