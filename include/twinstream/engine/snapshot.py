"""Snapshots of a standby's state: the Spark checkpoint (offsets, commits, RocksDB state)
and the gate's ring buffer, with a manifest of checksums.

Guarantee: a snapshot directory without `.tmp` in its name is complete. On a local folder
it is written under `<id>.tmp/`, every file and directory is fsynced, and only then is it
renamed into place, so a crash mid-persist leaves a `.tmp` folder that no reader ever takes.
On shared storage without an atomic rename (twinstream.platform.storage: HDFS, S3, ...) it is
written
in place with its manifest last, so a crash leaves a folder without one, which no reader
takes either. A reader trusts a
snapshot only after every file's sha256 matches its manifest: `latest` is the newest
snapshot that verifies, and a named snapshot that does not verify is refused with the
reason. Nothing here needs Spark, Kafka or Airflow.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import BaseModel, ValidationError

from twinstream.core.checkpoint import end_offsets, numbered
from twinstream.core.rows import Output
from twinstream.platform import storage
from twinstream.platform.storage import Location

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
BUFFER = "buffer.jsonl"
CHECKPOINT = "checkpoint"
TMP_SUFFIX = ".tmp"
# Spark's checksum sidecar files (.N.crc) are part of the checkpoint and copied with it.


class SnapshotError(Exception):
    """A snapshot that must not be used, or an operation that cannot be done; says why."""


# The snapshot selector of the newest snapshot that proves good (Manifest.proven).
PROVEN = "proven"


class Manifest(BaseModel):
    snapshot_id: str
    pipeline: str
    engine_id: str
    pipeline_version: str
    # The inbound offset the restored query reads first in partition 0 (end offset of the
    # last committed batch): Kafka must still hold it. `next_offsets`: every partition's;
    # absent from snapshots taken before partitions were, which had partition 0 only.
    next_offset: int
    next_offsets: dict[int, int] = {}
    batch_id: int
    created_at: str
    size_bytes: int
    buffer_rows: int
    buffer_last_msg_id: int | None
    files: dict[str, str]
    # How the checkpoint keeps the pipeline's state (`Pipeline.state_layout`): a checkpoint
    # resumes only the plan that wrote it. Snapshots from before Keyed state had none.
    state_layout: str = "transform"
    # The persisting engine's agreement with the active when it persisted
    # (twinstream.core.agreement): "agrees" (the ranges it had compared, up to
    # `agreed_through` per partition, were all equal to the published ones), "disagrees",
    # or "unchecked" (nothing compared yet; every snapshot from before agreement existed).
    # Only an "agrees" snapshot proves good: `choose(..., "proven")`.
    agreement: str = "unchecked"
    agreed_through: dict[int, int] = {}

    @property
    def proven(self) -> bool:
        return self.agreement == "agrees"

    def positions(self) -> dict[int, int]:
        """The inbound offset the restored query reads first, per partition."""
        return dict(self.next_offsets) or {0: self.next_offset}


@dataclass(frozen=True)
class SnapshotInfo:
    snapshot_id: str
    path: Location
    manifest: Manifest | None
    problem: str | None

    @property
    def valid(self) -> bool:
        return self.problem is None


# -- the checkpoint ---------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointPosition:
    batch_id: int
    # Partition -> the inbound offset a restarted query reads first.
    next_offsets: dict[int, int]

    @property
    def next_offset(self) -> int:
        """Partition 0's (the only one of a one-partition topic)."""
        return self.next_offsets.get(0, 0)


def _batch_offsets(checkpoint: Location, batch_id: int, topic: str) -> dict[int, int]:
    """The end offset of each partition of `topic` in offsets/<batch_id> (Spark's v1 log:
    a version line, the batch metadata, then one JSON line per source)."""
    path = checkpoint / "offsets" / str(batch_id)
    lines = path.read_text().splitlines()
    if not lines or lines[0] != "v1":
        raise SnapshotError(f"{path}: not a Spark offset log (first line {lines[:1]})")
    end = end_offsets(path, topic)
    if end is None:
        raise SnapshotError(f"{path}: no offsets for topic {topic}")
    return end


def checkpoint_position(checkpoint: Location, topic: str) -> CheckpointPosition | None:
    """Where a query restarted on this checkpoint continues: the last committed batch and
    its end offset. None for a checkpoint that has not committed a batch yet."""
    commits = numbered(checkpoint / "commits")
    if not commits:
        return None
    batch = commits[-1]
    return CheckpointPosition(batch, _batch_offsets(checkpoint, batch, topic))


def checkpoint_problem(checkpoint: Location, topic: str, keyed: bool = True) -> str | None:
    """Why Spark could not resume from this checkpoint, or None when it looks intact. Catches
    what a lost or half-copied disk leaves: no metadata, unreadable logs, a commit without
    its offsets, a keyed query (`keyed`: Pipeline.keyed) without its state. A query without
    keyed state has no state store unless its transform keeps state in Spark's own
    operators, whose missing files Spark itself refuses when the query starts: a stateless
    pipeline (orders, a filter) never has one, and its restarted engine must start."""
    if not checkpoint.exists():
        return f"{checkpoint} does not exist"
    metadata = checkpoint / "metadata"
    try:
        json.loads(metadata.read_text())["id"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{metadata} is missing or unreadable ({exc})"
    try:
        position = checkpoint_position(checkpoint, topic)
        offsets = numbered(checkpoint / "offsets")
        if offsets:
            _batch_offsets(checkpoint, offsets[-1], topic)
    except (OSError, ValueError, KeyError, TypeError, SnapshotError) as exc:
        return f"the offset or commit log of {checkpoint} is damaged ({exc})"
    if keyed and position is not None and not (checkpoint / "state" / "0").is_dir():
        return f"{checkpoint} has committed batch {position.batch_id} but no state store"
    return None


# -- writing ----------------------------------------------------------------------------


def new_snapshot_id(engine_id: str, batch_id: int, now: datetime) -> str:
    """Sorts by creation time: the newest snapshot has the greatest id."""
    return f"{now.astimezone(UTC):%Y%m%dT%H%M%S.%fZ}-{engine_id}-b{batch_id}"


def _sha256(path: Location) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_buffer(path: Location, rows: Iterable[Output]) -> int:
    count = 0
    with path.open("w") as f:
        for row in rows:
            fields: list[object] = [row.msg_id, row.kind, row.key, row.value]
            if row.partition:
                fields.append(row.partition)
            f.write(json.dumps(fields) + "\n")
            count += 1
    return count


def read_buffer(path: Location) -> list[Output]:
    rows = []
    with path.open() as f:
        for line in f:
            # [msg_id, kind, key, value], and the partition unless it is 0.
            msg_id, kind, key, value, *partition = json.loads(line)
            rows.append(
                Output(int(msg_id), kind, key, value, int(partition[0] if partition else 0))
            )
    return rows


def write_snapshot(
    snapshot_dir: Location,
    *,
    pipeline: str,
    engine_id: str,
    pipeline_version: str,
    checkpoint: Location,
    topic: str,
    buffer: Sequence[Output],
    state_layout: str = "transform",
    agreement: str = "unchecked",
    agreed_through: Mapping[int, int] | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> Manifest:
    """Copy a stopped query's checkpoint and the buffer into a new snapshot, atomically."""
    position = checkpoint_position(checkpoint, topic)
    if position is None:
        raise SnapshotError(f"{checkpoint} has no committed batch yet: nothing to persist")
    created = now()
    snapshot_id = new_snapshot_id(engine_id, position.batch_id, created)
    snapshot_dir.mkdir(parents=True, exist_ok=True)
    final = snapshot_dir / snapshot_id
    # A local folder is written under <id>.tmp and renamed into place, atomically. Elsewhere
    # a folder's rename is a copy: the snapshot is written in place, its manifest last, and
    # a reader trusts no folder without a manifest that every file matches.
    staged = storage.is_local(snapshot_dir)
    tmp = snapshot_dir / f"{snapshot_id}{TMP_SUFFIX}" if staged else final
    try:
        storage.copy_tree(checkpoint, tmp / CHECKPOINT)
        rows = write_buffer(tmp / BUFFER, buffer)
        files = {storage.relative(p, tmp): _sha256(p) for p in storage.files(tmp)}
        manifest = Manifest(
            snapshot_id=snapshot_id,
            pipeline=pipeline,
            engine_id=engine_id,
            pipeline_version=pipeline_version,
            next_offset=position.next_offset,
            next_offsets=position.next_offsets,
            batch_id=position.batch_id,
            created_at=created.astimezone(UTC).isoformat(),
            size_bytes=sum((tmp / name).stat().st_size for name in files),
            buffer_rows=rows,
            buffer_last_msg_id=buffer[-1].msg_id if buffer else None,
            files=files,
            state_layout=state_layout,
            agreement=agreement,
            agreed_through=dict(agreed_through or {}),
        )
        (tmp / MANIFEST).write_text(manifest.model_dump_json(indent=2))
        storage.sync_tree(tmp)
        if staged:
            storage.rename(tmp, final)
            storage.sync_dir(snapshot_dir)
    except BaseException:
        storage.remove_tree(tmp)
        raise
    log.info(
        "pipeline %s engine %s: snapshot %s written (next offset %s, %s buffered rows, %s bytes)",
        pipeline,
        engine_id,
        snapshot_id,
        manifest.next_offset,
        rows,
        manifest.size_bytes,
    )
    return manifest


# -- reading ----------------------------------------------------------------------------


def verify(path: Location, pipeline: str | None = None, layout: str | None = None) -> Manifest:
    """The snapshot's manifest, once every file matches it; SnapshotError says what does not.
    `layout`, if given, is the state layout the pipeline's plan keeps now: a snapshot of
    another one is refused (its checkpoint cannot resume the plan)."""
    if path.name.endswith(TMP_SUFFIX):
        raise SnapshotError(f"{path.name} is a half-written snapshot (its persist never finished)")
    if not path.is_dir():
        raise SnapshotError(f"no snapshot {path.name} in {path.parent}")
    try:
        manifest = Manifest.model_validate_json((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise SnapshotError(f"{path.name}: no {MANIFEST}") from None
    except ValidationError as exc:
        raise SnapshotError(
            f"{path.name}: {MANIFEST} is damaged ({exc.errors()[0]['msg']})"
        ) from None
    if layout is not None and manifest.state_layout != layout:
        raise SnapshotError(
            f"{path.name}: its checkpoint keeps the state as {manifest.state_layout!r}, the "
            f"pipeline now keeps it as {layout!r} (a new version of the pipeline): Spark "
            "cannot resume the new plan from it; restore 'cold' (rebuild the state from "
            "Kafka) or a snapshot taken since"
        )
    if manifest.snapshot_id != path.name:
        raise SnapshotError(f"{path.name}: the manifest names snapshot {manifest.snapshot_id}")
    if pipeline is not None and manifest.pipeline != pipeline:
        raise SnapshotError(f"{path.name}: taken from pipeline {manifest.pipeline}, not {pipeline}")
    for name, expected in sorted(manifest.files.items()):
        file = path / name
        if not file.is_file():
            raise SnapshotError(f"{path.name}: {name} is missing")
        actual = _sha256(file)
        if actual != expected:
            raise SnapshotError(
                f"{path.name}: {name} has sha256 {actual[:12]}..., the manifest says "
                f"{expected[:12]}... (damaged or truncated)"
            )
    if BUFFER not in manifest.files or not any(n.startswith(CHECKPOINT) for n in manifest.files):
        raise SnapshotError(f"{path.name}: the manifest lists no checkpoint or no buffer")
    return manifest


def snapshot_ids(snapshot_dir: Location) -> list[str]:
    """The finished snapshots' ids, newest first, without reading them (no checksums)."""
    if not snapshot_dir.is_dir():
        return []
    names = (p.name for p in storage.children(snapshot_dir) if p.is_dir())
    return sorted((n for n in names if not n.endswith(TMP_SUFFIX)), reverse=True)


def list_snapshots(
    snapshot_dir: Location, pipeline: str | None = None, layout: str | None = None
) -> list[SnapshotInfo]:
    """Every snapshot folder, newest first, each verified (half-written ones included, as
    invalid, so that an operator sees them)."""
    if not snapshot_dir.is_dir():
        return []
    infos = []
    for path in reversed(storage.children(snapshot_dir)):
        if not path.is_dir():
            continue
        snapshot_id = path.name.removesuffix(TMP_SUFFIX)
        try:
            infos.append(SnapshotInfo(snapshot_id, path, verify(path, pipeline, layout), None))
        except SnapshotError as exc:
            infos.append(SnapshotInfo(snapshot_id, path, None, str(exc)))
    return infos


def other_code(manifest: Manifest, version: str) -> str | None:
    """Why `manifest`'s state must not be restored into an engine running `version` (a
    twinstream.platform.versions.CodeVersion's text; "" for an engine that does not know its
    own, which takes any): it was computed by other code. A new version's engines must all
    compute the same rows, so each rebuilds from a snapshot of its own version, never from
    an older version's state (which would give it another starting point than the first)."""
    if not version or manifest.pipeline_version == version:
        return None
    return (
        f"{manifest.snapshot_id} was taken by an engine running version "
        f"{manifest.pipeline_version!r}, and this engine runs {version!r}: its state was "
        "computed by other code; restore a snapshot of this version, or 'cold' (a replay of "
        "the retained input)"
    )


def choose(
    snapshot_dir: Location,
    pipeline: str,
    requested: str,
    layout: str | None = None,
    version: str = "",
) -> Manifest:
    """`latest` (the newest snapshot that verifies, skipping damaged ones with a warning),
    `proven` (the newest that verifies and was taken by an engine that agreed with the
    active then: `Manifest.proven`) or a snapshot id (refused with the reason when it does
    not verify). With `version`, only a snapshot taken by an engine of that version
    (other_code)."""
    if requested in ("latest", PROVEN):
        problem = ""
        for info in list_snapshots(snapshot_dir, pipeline, layout):
            if info.manifest is not None and other_code(info.manifest, version):
                problem = problem or str(other_code(info.manifest, version))
                continue
            if info.manifest is not None and (requested == "latest" or info.manifest.proven):
                return info.manifest
            if info.manifest is not None:
                problem = problem or (
                    f"{info.snapshot_id} was taken by an engine whose agreement with the "
                    f"active was {info.manifest.agreement!r}"
                )
                continue
            problem = info.problem or ""
            log.warning(
                "pipeline %s: skipping snapshot %s: %s", pipeline, info.snapshot_id, info.problem
            )
        raise SnapshotError(
            f"no {'proven' if requested == PROVEN else 'valid'} snapshot of pipeline "
            f"{pipeline} in {snapshot_dir}" + (f" (the newest: {problem})" if problem else "")
        )
    if "/" in requested or requested in ("", ".", ".."):
        raise SnapshotError(f"{requested!r} is not a snapshot id")
    manifest = verify(snapshot_dir / requested, pipeline, layout)
    refused = other_code(manifest, version)
    if refused is not None:
        raise SnapshotError(refused)
    return manifest


def install(snapshot_dir: Location, manifest: Manifest, checkpoint: Location) -> list[Output]:
    """Replace `checkpoint` with the snapshot's copy; return the buffered rows. The copy goes
    to a sibling first, so a failure leaves either the old or the new checkpoint whole."""
    source = snapshot_dir / manifest.snapshot_id
    staging = checkpoint.with_name(checkpoint.name + ".restoring")
    storage.remove_tree(staging)
    storage.copy_tree(source / CHECKPOINT, staging)
    storage.remove_tree(checkpoint)
    storage.rename(staging, checkpoint)
    return read_buffer(source / BUFFER)


def prune(snapshot_dir: Location, pipeline: str, keep: int) -> list[str]:
    """Delete all but the newest `keep` snapshots; the newest valid one is never deleted, even
    when newer damaged ones fill the `keep` slots. Half-written `.tmp` folders are left to
    the persist that may still be writing them. Returns the deleted ids."""
    if keep < 1:
        raise SnapshotError(f"keep must be at least 1, got {keep}")
    done = [
        i for i in list_snapshots(snapshot_dir, pipeline) if not i.path.name.endswith(TMP_SUFFIX)
    ]
    newest_valid = next((i for i in done if i.valid), None)
    deleted = []
    for info in done[keep:]:
        if info is newest_valid:
            continue
        # Renamed first (locally) or its manifest deleted first (elsewhere), so that a reader
        # never sees a half-deleted snapshot as a snapshot.
        with contextlib.suppress(FileNotFoundError):
            if storage.is_local(info.path):
                doomed = info.path.with_name(info.path.name + ".deleting" + TMP_SUFFIX)
                storage.rename(info.path, doomed)
            else:
                doomed = info.path
                (doomed / MANIFEST).unlink(missing_ok=True)
            storage.remove_tree(doomed)
            deleted.append(info.snapshot_id)
    return deleted
