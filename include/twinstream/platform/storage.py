"""Where checkpoints and snapshots live: a local folder, or a URL of any file system that
both Spark (Hadoop's FileSystem API) and Python (fsspec, through universal-pathlib) know by
the same scheme: `hdfs://namenode:8020/twinstream`, `s3a://bucket/twinstream`,
`gs://bucket/twinstream`, `abfs://container@account.dfs.core.windows.net/twinstream`,
`file:///shared/twinstream`. Spark writes the checkpoint through Hadoop; the engine reads,
narrows, rewinds and copies it through fsspec; Airflow's tasks read the snapshots through
fsspec. Each scheme needs its fsspec package where Python touches it (s3fs, gcsfs, adlfs;
HDFS: pyarrow, already installed, with libhdfs and a Hadoop CLASSPATH) and its Hadoop
connector where Spark does (README, "On a Spark cluster").

Guarantee: on a local folder (a plain path) every operation is the POSIX one it was
before (rename is atomic, fsync reaches the disk). On any other file system a rename of a
folder is a copy and a delete, not atomic, and there is no fsync: the callers keep their
guarantees by other means there (a snapshot is written in place with its manifest last, and
a reader trusts a snapshot only when every file matches its manifest).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from upath import UPath

# A folder or file: a local path (pathlib.Path, or universal-pathlib's local subclass of
# it) or any other file system's UPath. The two share what checkpoint and snapshot code
# calls (/, name, iterdir, rglob, is_dir, is_file, exists, open, read_text, write_text,
# unlink, mkdir, stat); what differs is in this module.
Location = Path | UPath

# Schemes whose file systems Spark and fsspec both name the same way.
KNOWN_SCHEMES = ("file", "hdfs", "viewfs", "s3a", "s3", "gs", "abfs", "abfss", "wasb", "wasbs")


class StorageError(Exception):
    """A location that cannot be used; says why and what to install or set."""


def location(value: str | Path) -> Location:
    """A configured folder: a plain path stays a local path; a URL becomes the UPath of its
    file system (`file://` included, which takes fsspec's path as a remote one would)."""
    if isinstance(value, Path):
        return UPath(value)
    text = value.strip()
    scheme, sep, _rest = text.partition("://")
    if not sep:
        return UPath(Path(text))
    if scheme not in KNOWN_SCHEMES:
        raise StorageError(
            f"{text}: scheme {scheme!r} is not one Spark and Python both know; use a local "
            f"folder or one of {', '.join(s + '://' for s in KNOWN_SCHEMES)}"
        )
    return UPath(text)


def is_local(path: Location) -> bool:
    """A path of this machine's file system, reached with POSIX calls."""
    return isinstance(path, Path)


def check(path: Location) -> None:
    """Raise StorageError, naming what to install, when Python cannot reach `path`'s file
    system (a missing fsspec package, HDFS without libhdfs)."""
    if isinstance(path, Path):
        return  # local: nothing to load
    try:
        _ = path.fs  # built on first use: a missing package shows here
    except ImportError as exc:
        raise StorageError(f"{path}: {exc} (pip install it beside Twinstream)") from exc
    except OSError as exc:
        raise StorageError(f"{path}: its file system cannot be reached from Python: {exc}") from exc


def children(folder: Location) -> list[Location]:
    """What `folder` holds directly, in name order."""
    found: list[Location] = list(folder.iterdir())
    return sorted(found, key=lambda p: p.name)


def files(root: Location) -> list[Location]:
    """Every file under `root`, in path order."""
    return sorted((p for p in root.rglob("*") if p.is_file()), key=str)


def copy_tree(source: Location, target: Location) -> None:
    """Copy the folder `source` to `target` (which must not exist), on one file system or
    across two (a local snapshot of a remote checkpoint, or the reverse)."""
    if isinstance(source, Path) and isinstance(target, Path):
        shutil.copytree(source, target)
        return
    target.mkdir(parents=True)
    for file in files(source):
        destination = target / relative(file, source)
        # Folders exist on disks and HDFS (fsspec's local file system makes none for a
        # write); on an object store this is a no-op.
        destination.parent.mkdir(parents=True, exist_ok=True)
        with file.open("rb") as reader, destination.open("wb") as writer:
            shutil.copyfileobj(reader, writer, 1 << 20)


def relative(path: Location, root: Location) -> str:
    """`path`'s name under `root`, with `/` between its parts."""
    return str(path).removeprefix(str(root)).lstrip("/")


def rename(source: Location, target: Location) -> None:
    """Move a file or folder to `target`, replacing a file there: atomic on a local disk
    (and HDFS), a copy and a delete on an object store."""
    if isinstance(source, Path) and isinstance(target, Path):
        source.rename(target)
    elif source.is_dir():
        # fsspec's move of a folder is a copy and a delete as well, but not every file
        # system's delete of the nested folders it leaves works (the memory one's does not).
        remove_tree(target)
        copy_tree(source, target)
        remove_tree(source)
    else:
        assert isinstance(source, UPath), source
        assert isinstance(target, UPath), target
        source.rename(target)


def remove_tree(path: Location) -> None:
    """Delete the folder and everything in it; nothing happens if it does not exist."""
    if isinstance(path, Path):
        shutil.rmtree(path, ignore_errors=True)
        return
    assert isinstance(path, UPath)
    with contextlib.suppress(FileNotFoundError):
        path.fs.rm(path.path, recursive=True)


def sync_tree(root: Location) -> None:
    """Data and directory entries of a local folder on disk (before a rename publishes
    them); other file systems have made a file durable once it is closed."""
    if not isinstance(root, Path):
        return
    for folder, _dirs, names in os.walk(root):
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                os.fsync(f.fileno())
        sync_dir(Path(folder))


def sync_dir(folder: Location) -> None:
    """A local folder's entries on disk; nothing elsewhere."""
    if not isinstance(folder, Path):
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
