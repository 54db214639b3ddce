"""Rewinding a checkpoint for a gap repair: to the newest committed batch that ends at or
before the gap, never to the oldest retained one (its state may be purged first)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from twinstream.core.checkpoint import (
    RewindPoint,
    numbered,
    resume_point,
    rewind,
    rewind_point,
    unread,
)

TOPIC = "p.in"


@pytest.fixture
def tmp_path(storage_root):
    """Every test here on a local folder and on fsspec's memory file system."""
    return storage_root


def _batch(checkpoint: Path, batch: int, end: int | dict[str, int], committed: bool = True) -> None:
    ends = {"0": end} if isinstance(end, int) else end
    for log in ("offsets", "commits") if committed else ("offsets",):
        folder = checkpoint / log
        folder.mkdir(parents=True, exist_ok=True)
        body = f"v1\n{{}}\n{json.dumps({TOPIC: ends})}" if log == "offsets" else "v1\n{}"
        (folder / str(batch)).write_text(body)
        (folder / f".{batch}.crc").write_text("crc")


def test_the_rewind_point_is_the_newest_batch_ending_at_or_before_the_gap(tmp_path: Path):
    for batch, end in enumerate((100, 200, 300, 400, 500), start=10):
        _batch(tmp_path, batch, end)
    _batch(tmp_path, 15, 600, committed=False)
    assert rewind_point(tmp_path, TOPIC, 0, 350) == RewindPoint(12, {0: 300})
    assert rewind_point(tmp_path, TOPIC, 0, 300) == RewindPoint(12, {0: 300})
    assert rewind_point(tmp_path, TOPIC, 0, 150) is None  # only the oldest entry reaches back


def test_rewinding_forgets_every_later_batch_in_both_logs(tmp_path: Path):
    for batch, end in enumerate((100, 200, 300, 400), start=1):
        _batch(tmp_path, batch, end)
    rewind(tmp_path, RewindPoint(2, {0: 200}))
    assert numbered(tmp_path / "offsets") == [1, 2]
    assert numbered(tmp_path / "commits") == [1, 2]
    assert not (tmp_path / "offsets" / ".3.crc").exists()


def test_unread_counts_from_the_last_planned_batch_or_the_topics_start(tmp_path: Path):
    """An engine skips its warm-up when it has at least that many records to catch up on."""
    assert unread(tmp_path, TOPIC, {0: 5_000}) == 5_000  # no checkpoint: the whole topic
    _batch(tmp_path, 7, 300)
    _batch(tmp_path, 8, 450, committed=False)  # planned, replayed on restart: counted read
    assert unread(tmp_path, TOPIC, {0: 5_000}) == 4_550
    assert unread(tmp_path, TOPIC, {0: 400}) == 0


def test_with_several_partitions_the_rewind_point_is_found_in_the_gaps_partition(
    tmp_path: Path,
):
    for batch, ends in enumerate(({"0": 10, "1": 100}, {"0": 20, "1": 200}, {"0": 30, "1": 300})):
        _batch(tmp_path, batch, ends)
    # A gap at 1:250: batch 1 ended there at 200, and partition 0 replays from 20.
    assert rewind_point(tmp_path, TOPIC, 1, 250) == RewindPoint(1, {0: 20, 1: 200})
    assert rewind_point(tmp_path, TOPIC, 0, 25) == RewindPoint(1, {0: 20, 1: 200})
    # Unread: every partition's records after the last planned batch.
    assert unread(tmp_path, TOPIC, {0: 35, 1: 300, 2: 7}) == 5 + 0 + 7


def test_a_batch_starts_where_the_one_before_ended_and_the_first_where_the_query_started(
    tmp_path: Path,
):
    from twinstream.core.checkpoint import batch_start

    assert batch_start(tmp_path, 0, TOPIC) is None  # no checkpoint yet
    sources = tmp_path / "sources" / "0"
    sources.mkdir(parents=True)
    (sources / "0").write_text(f"v1\n{json.dumps({TOPIC: {'0': 40, '1': 7}})}")
    _batch(tmp_path, 0, {"0": 90, "1": 7})
    _batch(tmp_path, 1, {"0": 120, "1": 30}, committed=False)
    assert batch_start(tmp_path, 0, TOPIC) == {0: 40, 1: 7}
    assert batch_start(tmp_path, 1, TOPIC) == {0: 90, 1: 7}


def test_a_restarted_query_resumes_after_its_last_committed_batch(tmp_path: Path):
    """A planned batch without its commit is run again from the end of the one before; with
    no commit, where the query started; with neither, unknown."""
    assert resume_point(tmp_path, TOPIC) is None
    (tmp_path / "sources" / "0").mkdir(parents=True)
    (tmp_path / "sources" / "0" / "0").write_text(f"v1\n{json.dumps({TOPIC: {'0': 40}})}")
    assert resume_point(tmp_path, TOPIC) == {0: 40}
    _batch(tmp_path, 0, 300)
    _batch(tmp_path, 1, {"0": 450, "1": 7})
    _batch(tmp_path, 2, 900, committed=False)
    assert resume_point(tmp_path, TOPIC) == {0: 450, 1: 7}
