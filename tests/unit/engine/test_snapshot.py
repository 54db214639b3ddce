"""Snapshots on disk: atomic writes, checksums, `latest`, pruning, checkpoint checks."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from upath import UPath

from twinstream.core.rows import Output
from twinstream.engine import snapshot
from twinstream.engine.snapshot import SnapshotError
from twinstream.platform import storage
from twinstream.platform.storage import Location

TOPIC = "hostmetrics.in"
PIPELINE = "hostmetrics"


@pytest.fixture
def tmp_path(storage_root):
    """Every test here on a local folder and on fsspec's memory file system."""
    return storage_root


def fake_checkpoint(root: Location, committed: int = 2, end_offsets: int = 100) -> Location:
    """The layout Spark 4 writes: metadata, offsets/N (v1 log), commits/N, state/0/0."""
    cp = root / "checkpoint"
    (cp / "offsets").mkdir(parents=True)
    (cp / "commits").mkdir()
    (cp / "state" / "0" / "0").mkdir(parents=True)
    (cp / "metadata").write_text('{"id":"79ba76d0-f028-4f4c-801e-b4654d2b14d6"}')
    for batch in range(committed + 1):
        meta = json.dumps({"batchWatermarkMs": 0, "conf": {}})
        offsets = json.dumps({TOPIC: {"0": end_offsets * (batch + 1) // (committed + 1)}})
        (cp / "offsets" / str(batch)).write_text(f"v1\n{meta}\n{offsets}")
        (cp / "offsets" / f".{batch}.crc").write_bytes(b"crc")
        (cp / "state" / "0" / "0" / f"{batch + 1}.zip").write_bytes(b"rocksdb" * 100)
    for batch in range(committed):
        (cp / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    return cp


def rows(first: int, last: int) -> list[Output]:
    return [
        Output(i, "out", f"h{i % 3}", json.dumps({"msg_id": i})) for i in range(first, last + 1)
    ]


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


def write(
    root: Location,
    checkpoint: Location,
    clock: Clock,
    buffer: list[Output] | None = None,
    version: str = "0.1.0",
):
    return snapshot.write_snapshot(
        root,
        pipeline=PIPELINE,
        engine_id="b",
        pipeline_version=version,
        checkpoint=checkpoint,
        topic=TOPIC,
        buffer=rows(0, 65) if buffer is None else buffer,
        now=clock,
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_a_snapshot_holds_the_checkpoint_the_buffer_and_their_checksums(tmp_path, clock):
    cp = fake_checkpoint(tmp_path / "engine")
    manifest = write(tmp_path / "snaps", cp, clock)
    # commits/1 is the last committed batch; offsets/1 ends at 66 (100 * 2 // 3).
    assert (manifest.batch_id, manifest.next_offset) == (1, 66)
    assert manifest.buffer_rows == 66
    assert manifest.buffer_last_msg_id == 65
    path = tmp_path / "snaps" / manifest.snapshot_id
    assert snapshot.verify(path, PIPELINE) == manifest
    assert "checkpoint/offsets/.0.crc" in manifest.files
    assert "checkpoint/state/0/0/3.zip" in manifest.files
    assert snapshot.read_buffer(path / snapshot.BUFFER) == rows(0, 65)
    assert not list((tmp_path / "snaps").glob("*.tmp"))


def test_snapshot_ids_sort_by_creation_time(tmp_path, clock):
    cp = fake_checkpoint(tmp_path / "engine")
    ids = [write(tmp_path / "snaps", cp, clock).snapshot_id for _ in range(3)]
    assert ids == sorted(ids)
    assert [i.snapshot_id for i in snapshot.list_snapshots(tmp_path / "snaps")] == ids[::-1]


def test_a_checkpoint_without_a_committed_batch_is_not_persisted(tmp_path, clock):
    cp = fake_checkpoint(tmp_path / "engine", committed=0)
    with pytest.raises(SnapshotError, match="no committed batch"):
        write(tmp_path / "snaps", cp, clock)
    assert not (tmp_path / "snaps").exists() or not list((tmp_path / "snaps").iterdir())


def test_a_failed_write_leaves_no_folder_behind(tmp_path, clock, monkeypatch):
    cp = fake_checkpoint(tmp_path / "engine")

    def disk_full(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(snapshot, "write_buffer", disk_full)
    with pytest.raises(OSError, match="No space"):
        write(tmp_path / "snaps", cp, clock)
    assert list((tmp_path / "snaps").iterdir()) == []


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:5]), "damaged or truncated"),
        (lambda p: p.write_bytes(b"X" + p.read_bytes()[1:]), "damaged or truncated"),
        (lambda p: p.unlink(), "is missing"),
    ],
    ids=["truncated", "checksum-mismatch", "missing"],
)
def test_a_damaged_snapshot_is_skipped_by_latest_and_refused_by_name(
    tmp_path, clock, damage, reason
):
    snaps = tmp_path / "snaps"
    cp = fake_checkpoint(tmp_path / "engine")
    good = write(snaps, cp, clock)
    bad = write(snaps, cp, clock)
    damage(snaps / bad.snapshot_id / "checkpoint" / "state" / "0" / "0" / "2.zip")

    assert snapshot.choose(snaps, PIPELINE, "latest") == good
    with pytest.raises(SnapshotError, match=reason) as refused:
        snapshot.choose(snaps, PIPELINE, bad.snapshot_id)
    assert "checkpoint/state/0/0/2.zip" in str(refused.value)


def test_a_half_written_snapshot_is_never_used(tmp_path, clock):
    snaps = tmp_path / "snaps"
    cp = fake_checkpoint(tmp_path / "engine")
    good = write(snaps, cp, clock)
    newer = write(snaps, cp, clock)
    storage.rename(snaps / newer.snapshot_id, snaps / f"{newer.snapshot_id}.tmp")
    assert snapshot.choose(snaps, PIPELINE, "latest") == good
    with pytest.raises(SnapshotError, match="no snapshot"):
        snapshot.choose(snaps, PIPELINE, newer.snapshot_id)
    with pytest.raises(SnapshotError, match="half-written"):
        snapshot.verify(snaps / f"{newer.snapshot_id}.tmp")
    # What a crash leaves on storage without an atomic rename: the folder in place, every
    # file but its manifest (written last). Never used either.
    newest = write(snaps, cp, clock)
    (snaps / newest.snapshot_id / snapshot.MANIFEST).unlink()
    assert snapshot.choose(snaps, PIPELINE, "latest") == good
    with pytest.raises(SnapshotError, match=r"no manifest\.json"):
        snapshot.choose(snaps, PIPELINE, newest.snapshot_id)


def test_a_local_checkpoint_persists_to_and_installs_from_other_storage(tmp_path_factory, clock):
    """Across two file systems: a local checkpoint, snapshots on fsspec's memory file
    system (as on S3), installed back to a local folder byte for byte."""
    local = tmp_path_factory.mktemp("local")
    snaps = UPath(f"memory://snaps-{uuid.uuid4().hex}/snaps")
    try:
        cp = fake_checkpoint(local / "engine")
        manifest = write(snaps, cp, clock)
        assert [i.snapshot_id for i in snapshot.list_snapshots(snaps)] == [manifest.snapshot_id]
        target = local / "restored" / "checkpoint"
        assert snapshot.install(snaps, manifest, target) == rows(0, 65)
        assert {storage.relative(p, target): p.read_bytes() for p in storage.files(target)} == {
            storage.relative(p, cp): p.read_bytes() for p in storage.files(cp)
        }
    finally:
        snaps.fs.rm(snaps.path, recursive=True)


def test_a_damaged_manifest_and_another_pipeline_are_refused(tmp_path, clock):
    snaps = tmp_path / "snaps"
    cp = fake_checkpoint(tmp_path / "engine")
    first = write(snaps, cp, clock)
    second = write(snaps, cp, clock)
    (snaps / second.snapshot_id / snapshot.MANIFEST).write_text('{"snapshot_id": 1')
    with pytest.raises(SnapshotError, match=r"manifest.json is damaged"):
        snapshot.choose(snaps, PIPELINE, second.snapshot_id)
    with pytest.raises(SnapshotError, match="taken from pipeline hostmetrics, not other"):
        snapshot.choose(snaps, "other", first.snapshot_id)
    with pytest.raises(SnapshotError, match="no valid snapshot of pipeline other"):
        snapshot.choose(snaps, "other", "latest")
    with pytest.raises(SnapshotError, match="not a snapshot id"):
        snapshot.choose(snaps, PIPELINE, "../x")


def test_prune_keeps_the_newest_k_and_never_the_newest_valid_one(tmp_path, clock):
    snaps = tmp_path / "snaps"
    cp = fake_checkpoint(tmp_path / "engine")
    made = [write(snaps, cp, clock).snapshot_id for _ in range(5)]
    # The three newest are damaged: the newest valid one is the second oldest.
    for snapshot_id in made[2:]:
        (snaps / snapshot_id / snapshot.BUFFER).write_text("")
    (snaps / "20991231T000000.000000Z-a-b1.tmp").mkdir()  # a persist still writing

    deleted = snapshot.prune(snaps, PIPELINE, keep=3)
    assert deleted == [made[0]]
    left = sorted(p.name for p in snaps.iterdir())
    assert left == sorted([*made[1:], "20991231T000000.000000Z-a-b1.tmp"])
    assert snapshot.choose(snaps, PIPELINE, "latest").snapshot_id == made[1]
    with pytest.raises(SnapshotError, match="at least 1"):
        snapshot.prune(snaps, PIPELINE, keep=0)


def test_prune_with_all_valid_keeps_exactly_k(tmp_path, clock):
    snaps = tmp_path / "snaps"
    cp = fake_checkpoint(tmp_path / "engine")
    made = [write(snaps, cp, clock).snapshot_id for _ in range(4)]
    assert snapshot.prune(snaps, PIPELINE, keep=3) == [made[0]]
    assert snapshot.prune(snaps, PIPELINE, keep=3) == []


def test_install_replaces_the_checkpoint_and_returns_the_buffer(tmp_path, clock):
    snaps = tmp_path / "snaps"
    manifest = write(snaps, fake_checkpoint(tmp_path / "engine"), clock)
    target = tmp_path / "other" / "checkpoint"
    target.mkdir(parents=True)
    (target / "junk").write_text("old")
    buffer = snapshot.install(snaps, manifest, target)
    assert buffer == rows(0, 65)
    assert not (target / "junk").exists()
    position = snapshot.checkpoint_position(target, TOPIC)
    assert position == snapshot.CheckpointPosition(1, {0: 66})
    assert snapshot.checkpoint_problem(target, TOPIC) is None


def test_checkpoint_problems_are_named(tmp_path):
    cp = fake_checkpoint(tmp_path / "a")
    assert snapshot.checkpoint_problem(cp, TOPIC) is None
    assert "does not exist" in str(snapshot.checkpoint_problem(tmp_path / "none", TOPIC))

    (cp / "metadata").unlink()
    assert "metadata is missing" in str(snapshot.checkpoint_problem(cp, TOPIC))

    cp = fake_checkpoint(tmp_path / "b")
    (cp / "offsets" / "2").write_text("garbage")
    assert "offset or commit log" in str(snapshot.checkpoint_problem(cp, TOPIC))

    cp = fake_checkpoint(tmp_path / "c")
    (cp / "offsets" / "1").unlink()
    assert "offset or commit log" in str(snapshot.checkpoint_problem(cp, TOPIC))

    cp = fake_checkpoint(tmp_path / "d")
    (cp / "offsets" / "2").write_text('v1\n{}\n{"other.topic": {"0": 5}}')
    assert f"no offsets for topic {TOPIC}" in str(snapshot.checkpoint_problem(cp, TOPIC))

    cp = fake_checkpoint(tmp_path / "e")
    storage.remove_tree(cp / "state")
    assert "no state store" in str(snapshot.checkpoint_problem(cp, TOPIC))
    # A pipeline without keyed state (orders, a filter) has none: its engine must restart
    # (a kill -9 of a stateless pipeline's engine left it refusing its own checkpoint).
    assert snapshot.checkpoint_problem(cp, TOPIC, keyed=False) is None


def test_snapshot_ids_lists_finished_snapshots_without_reading_them(tmp_path, clock):
    snaps = tmp_path / "snaps"
    assert snapshot.snapshot_ids(snaps) == []
    cp = fake_checkpoint(tmp_path / "engine")
    made = [write(snaps, cp, clock).snapshot_id for _ in range(2)]
    (snaps / made[1] / snapshot.BUFFER).write_text("")  # damaged still counts as history
    (snaps / "20991231T000000.000000Z-a-b1.tmp").mkdir()
    assert snapshot.snapshot_ids(snaps) == made[::-1]


def test_the_buffer_keeps_each_rows_partition(tmp_path):
    rows_in = [Output(3, "out", "k", "v", 0), Output(3, "dlq", None, "x", 2)]
    snapshot.write_buffer(tmp_path / "b.jsonl", rows_in)
    assert snapshot.read_buffer(tmp_path / "b.jsonl") == rows_in


def test_a_snapshot_of_the_state_layout_before_keyed_is_refused_naming_cold(tmp_path, clock):
    """A snapshot taken before the pipeline kept its state with Keyed (no state_layout in
    its manifest) holds a checkpoint Spark cannot resume into the keyed plan: refused by
    id and skipped by `latest`, the message naming the fix; the same layout restores."""
    snaps = tmp_path / "snaps"
    cp = fake_checkpoint(tmp_path / "engine")
    old = write(snaps, cp, clock)
    manifest = json.loads((snaps / old.snapshot_id / snapshot.MANIFEST).read_text())
    del manifest["state_layout"]  # as every snapshot before this version was written
    (snaps / old.snapshot_id / snapshot.MANIFEST).write_text(json.dumps(manifest))
    assert snapshot.choose(snaps, PIPELINE, old.snapshot_id, "transform").state_layout == (
        "transform"
    )
    with pytest.raises(SnapshotError, match=r"keeps the state as 'transform'.*restore 'cold'"):
        snapshot.choose(snaps, PIPELINE, old.snapshot_id, "keyed/1")
    with pytest.raises(SnapshotError, match=r"no valid snapshot.*restore 'cold'"):
        snapshot.choose(snaps, PIPELINE, "latest", "keyed/1")
    new = snapshot.write_snapshot(
        snaps,
        pipeline=PIPELINE,
        engine_id="b",
        pipeline_version="0.2.0",
        checkpoint=cp,
        topic=TOPIC,
        buffer=rows(0, 65),
        state_layout="keyed/1",
        now=clock,
    )
    assert snapshot.choose(snaps, PIPELINE, "latest", "keyed/1").snapshot_id == new.snapshot_id


def test_an_engine_restores_only_a_snapshot_its_own_version_took(tmp_path, clock):
    """A deploy's second engine of version 2 must compute what its first computes: from a
    snapshot version 2 took, never from version 1's state (another starting point)."""
    cp = fake_checkpoint(tmp_path / "engine")
    old = write(tmp_path / "snaps", cp, clock, version="1+aaaaaaaaaaaa")
    new = write(tmp_path / "snaps", cp, clock, version="2+bbbbbbbbbbbb")
    newer_old = write(tmp_path / "snaps", cp, clock, version="1+aaaaaaaaaaaa")
    root = tmp_path / "snaps"
    assert snapshot.choose(root, PIPELINE, "latest", version="2+bbbbbbbbbbbb") == new
    assert snapshot.choose(root, PIPELINE, "latest", version="1+aaaaaaaaaaaa") == newer_old
    # An engine that does not know its version (no code loaded: a unit test's) takes any.
    assert snapshot.choose(root, PIPELINE, "latest") == newer_old
    with pytest.raises(SnapshotError, match=r"running version '1\+aaaaaaaaaaaa'.*'cold'"):
        snapshot.choose(root, PIPELINE, old.snapshot_id, version="2+bbbbbbbbbbbb")
    with pytest.raises(SnapshotError, match=r"no valid snapshot.*running version"):
        snapshot.choose(root, PIPELINE, "latest", version="3+cccccccccccc")
