"""What an engine does when its query fails or a takeover finds a gap, with every client
mocked: search a failed batch's records (twinstream.core.quarantine), restart with backoff when
no record is to blame, and plan a gap's repair from checkpoint history or a snapshot."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import pytest

import twinstream.engine.app as engine_module
from twinstream.core.checkpoint import RewindPoint, batch_end
from twinstream.engine import snapshot
from twinstream.engine.snapshot import Manifest, SnapshotInfo


def _batch(checkpoint: Path, topic: str, batch: int, end: int, committed: bool = True) -> None:
    for log in ("offsets", "commits") if committed else ("offsets",):
        folder = checkpoint / log
        folder.mkdir(parents=True, exist_ok=True)
        body = f"v1\n{{}}\n{json.dumps({topic: {'0': end}})}" if log == "offsets" else "v1\n{}"
        (folder / str(batch)).write_text(body)


def _manifest(
    snapshot_id: str,
    next_offset: int,
    next_offsets: dict[int, int] | None = None,
    version: str = "0",
) -> Manifest:
    return Manifest(
        snapshot_id=snapshot_id,
        pipeline="hostmetrics",
        engine_id="b",
        pipeline_version=version,
        next_offset=next_offset,
        next_offsets=next_offsets or {},
        batch_id=1,
        created_at="2026-11-25T00:00:00Z",
        size_bytes=1,
        buffer_rows=0,
        buffer_last_msg_id=None,
        files={},
    )


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch, engine):
    query = mock.MagicMock(name="start_query")
    monkeypatch.setattr(engine_module, "start_query", query)
    engine.quarantine = mock.MagicMock(name="quarantine")
    engine.quarantine.entries.return_value = {}
    engine.recovery.quarantine = engine.quarantine
    engine.watermarks.log_starts.return_value = {0: 0}
    return query


def test_a_failed_batch_is_narrowed_to_half_its_records_and_run_again(engine, started):
    checkpoint = engine.settings.checkpoint_dir("a")
    topic = engine.settings.inbound_topic
    _batch(checkpoint, topic, 0, 100)
    _batch(checkpoint, topic, 1, 1100, committed=False)
    engine.recovery.batch_error = (1, "PythonException: RuntimeError: boom")
    engine._query.isActive = False
    engine.check_query()
    # Spark runs batch 1 again on the restart, with the offsets its entry now names.
    assert batch_end(checkpoint, 1, topic) == {0: 600}
    started.assert_called_once()
    assert engine.lifecycle.state == "running"


def test_a_failure_no_record_explains_restarts_with_backoff_and_leaves_after_three(engine, started):
    engine.gate.joined()
    engine._kafka_answers = mock.MagicMock(return_value=False)
    for failure in (1, 2, 3):
        engine._query = mock.MagicMock(name="query", isActive=False)
        engine.recovery.batch_error = (7, "KafkaException: all brokers down")
        engine.check_query()
        assert engine.lifecycle.state == "recovering"
        assert f"restarting in {min(30, 2**failure)} s" in engine.lifecycle.reason
    assert engine.gate.role == "none"  # left the election for a healthy standby
    started.assert_not_called()
    engine.recovery.restart_at = 0.0
    engine.check_query()  # the backoff is over: the query starts, the engine rejoins
    started.assert_called_once()
    assert engine.lifecycle.state == "running"
    assert engine.gate.role == "standby"
    engine.process_batch(mock.MagicMock(name="df"), 9)  # a batch goes through
    assert engine.recovery.failures == 0


def test_a_gap_is_planned_from_the_checkpoint_history_when_it_reaches(engine):
    checkpoint = engine.settings.checkpoint_dir("a")
    for batch, end in enumerate((100, 200, 300, 400), start=5):
        _batch(checkpoint, engine.settings.inbound_topic, batch, end)
    assert engine.takeover.on_gap(0, 350, 399) is True
    assert engine.takeover.plan == RewindPoint(7, {0: 300})


def test_a_gap_older_than_the_history_is_planned_from_the_newest_snapshot_before_it(
    engine, monkeypatch
):
    infos = [
        SnapshotInfo("s1", Path("s1"), _manifest("s1", 120), None),
        SnapshotInfo("s2", Path("s2"), _manifest("s2", 180), None),
        SnapshotInfo("s3", Path("s3"), _manifest("s3", 260), None),  # after the gap
        SnapshotInfo("bad", Path("bad"), None, "sha256 mismatch"),
        SnapshotInfo("s0", Path("s0"), _manifest("s0", 40), None),  # Kafka deleted it
    ]
    monkeypatch.setattr(snapshot, "list_snapshots", lambda *_: infos)
    engine.watermarks.log_starts.return_value = {0: 100}
    assert engine.takeover.on_gap(0, 200, 299) is True
    assert isinstance(engine.takeover.plan, Manifest)
    assert engine.takeover.plan.snapshot_id == "s2"


def test_a_gap_in_one_partition_takes_a_snapshot_before_it_there_kept_in_every_partition(
    engine, monkeypatch
):
    infos = [
        # Before the gap in partition 1, but Kafka deleted what it needs of partition 2.
        SnapshotInfo("s3", Path("s3"), _manifest("s3", 50, {0: 50, 1: 150, 2: 10}), None),
        SnapshotInfo("s2", Path("s2"), _manifest("s2", 40, {0: 40, 1: 120, 2: 30}), None),
        # After the gap in partition 1.
        SnapshotInfo("s4", Path("s4"), _manifest("s4", 60, {0: 60, 1: 260, 2: 40}), None),
    ]
    monkeypatch.setattr(snapshot, "list_snapshots", lambda *_: infos)
    engine.watermarks.log_starts.return_value = {0: 0, 1: 100, 2: 20}
    assert engine.takeover.on_gap(1, 200, 299) is True
    assert isinstance(engine.takeover.plan, Manifest)
    assert engine.takeover.plan.snapshot_id == "s2"


def test_a_gap_is_recomputed_only_from_a_snapshot_of_the_code_the_engine_runs(engine, monkeypatch):
    """Another version's state would recompute the gap with another starting point."""
    infos = [
        SnapshotInfo("v1", Path("v1"), _manifest("v1", 180, version="1+aaaaaaaaaaaa"), None),
        SnapshotInfo("v2", Path("v2"), _manifest("v2", 120, version="2+bbbbbbbbbbbb"), None),
    ]
    monkeypatch.setattr(snapshot, "list_snapshots", lambda *_: infos)
    engine.watermarks.log_starts.return_value = {0: 100}
    engine.takeover._version = "2+bbbbbbbbbbbb"
    assert engine.takeover.on_gap(0, 200, 299) is True
    assert isinstance(engine.takeover.plan, Manifest)
    assert engine.takeover.plan.snapshot_id == "v2"


def test_a_gap_nothing_reaches_is_not_planned(engine, monkeypatch, caplog):
    monkeypatch.setattr(snapshot, "list_snapshots", lambda *_: [])
    engine.watermarks.log_starts.return_value = {0: 0}
    assert engine.takeover.on_gap(0, 200, 299) is False
    assert engine.takeover.plan is None
    assert "msg_id 200..299 of partition 0 cannot be recomputed" in caplog.text


def test_status_reads_never_do_the_recovery_work(engine, started):
    """GET /pipeline must answer at once: restarting a query takes seconds."""
    engine._query.isActive = False
    engine.recovery.batch_error = (3, "PythonException: RuntimeError: boom")
    engine.pipeline()
    started.assert_not_called()
    assert engine.recovery.batch_error is not None  # left for the main loop's check_query


def test_a_batch_interrupted_by_a_stop_is_not_blamed_for_the_next_querys_failure(engine, started):
    engine.recovery.batch_error = (4, "Py4JJavaError: java.lang.InterruptedException")  # a persist
    engine._start_query()
    assert engine.recovery.batch_error is None


def test_a_record_that_fails_alone_twice_is_quarantined_and_the_search_ends(engine, started):
    checkpoint = engine.settings.checkpoint_dir("a")
    topic = engine.settings.inbound_topic
    engine.quarantine.add.return_value = "quarantined: RuntimeError: boom"
    _batch(checkpoint, topic, 0, 100)
    _batch(checkpoint, topic, 1, 101, committed=False)  # msg_id 100 alone
    failures = 0
    while not engine.quarantine.add.called and failures < 3:
        engine._query = mock.MagicMock(name="query", isActive=False)
        engine.recovery.batch_error = (1, "PythonException: RuntimeError: boom")
        engine.check_query()
        failures += 1
    assert failures == 2  # once more than needed: a passing fault is never the record's
    engine.quarantine.add.assert_called_once()
    assert engine.quarantine.add.call_args.args[0] == 100
    assert engine.recovery.search is None
    assert engine.lifecycle.state == "running"  # restarted at once, the record set aside


def test_a_query_that_fails_to_restart_after_a_repair_is_retried_after_the_backoff(engine, started):
    """A repair's rewind restarts a running query; a start that raises leaves the engine
    recovering, so the main loop tries again after the backoff instead of never."""
    started.side_effect = [RuntimeError("Kafka away"), mock.MagicMock(name="query")]
    engine._restart_query()
    assert engine.lifecycle.state == "recovering"
    assert "restarting the query failed: Kafka away; again in 2 s" in engine.lifecycle.reason
    engine._query = None
    engine.recovery.restart_at = 0.0
    engine.check_query()
    assert started.call_count == 2
    assert engine.lifecycle.state == "running"


def test_a_persist_whose_query_will_not_restart_leaves_the_engine_recovering(
    engine, started, monkeypatch
):
    """Not persisting for good: the main loop restarts the query after the backoff."""
    from twinstream.engine import persistence

    engine.gate.joined()
    monkeypatch.setattr(persistence, "write", mock.MagicMock(name="write"))
    monkeypatch.setattr(engine, "_stop_query_between_batches", lambda: None)
    started.side_effect = RuntimeError("Kafka away")
    with pytest.raises(RuntimeError, match="Kafka away"):
        engine.persist()
    assert engine.lifecycle.state == "recovering"
    started.side_effect = None
    engine._query = None
    engine.recovery.restart_at = 0.0
    engine.check_query()
    assert engine.lifecycle.state == "running"
