"""Checkpoint and snapshot locations: a local folder or a URL Spark and fsspec both know,
refused by name otherwise; where each engine's checkpoint and each pipeline's snapshots
go; what is missing to reach a file system, named with its fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from upath import UPath

from twinstream.platform import storage
from twinstream.platform.settings import SettingsError, load_settings


def test_a_plain_path_stays_local_and_a_url_goes_through_fsspec(tmp_path: Path):
    local = storage.location(str(tmp_path))
    assert storage.is_local(local)
    assert isinstance(local, Path)
    url = storage.location(f"file://{tmp_path}")
    assert not storage.is_local(url)
    assert isinstance(url, UPath)


def test_the_settings_place_checkpoints_and_snapshots_under_their_roots(tmp_path: Path):
    default = load_settings(state_dir=tmp_path, pipeline="hostmetrics")
    assert default.checkpoint_dir("a") == tmp_path / "engines" / "a" / "checkpoint"
    assert default.snapshot_dir == tmp_path / "snapshots" / "hostmetrics"
    assert storage.is_local(default.checkpoint_dir("a"))

    shared = load_settings(
        state_dir=tmp_path,
        pipeline="hostmetrics",
        checkpoint_root="hdfs://namenode:8020/twinstream/checkpoints",
        snapshot_root="s3a://bucket/twinstream/snapshots",
    )
    # Spark gets the URL as configured, namenode and port included.
    assert shared.checkpoint_uri("b") == "hdfs://namenode:8020/twinstream/checkpoints/hostmetrics/b"
    assert default.checkpoint_uri("a") == str(tmp_path / "engines" / "a" / "checkpoint")
    assert str(shared.checkpoint_dir("b")).endswith("/twinstream/checkpoints/hostmetrics/b")
    # Python reaches the same namenode (its str() leaves it out; its options keep it).
    on_hdfs = shared.checkpoint_dir("b")
    assert isinstance(on_hdfs, UPath)
    assert on_hdfs.storage_options == {"host": "namenode", "port": 8020}
    assert str(shared.snapshot_dir) == "s3a://bucket/twinstream/snapshots/hostmetrics"


@pytest.mark.parametrize("variable", ["TWINSTREAM_CHECKPOINT_ROOT", "TWINSTREAM_SNAPSHOT_ROOT"])
def test_a_scheme_spark_and_python_do_not_share_is_refused_by_name(monkeypatch, variable):
    monkeypatch.setenv(variable, "ftp://host/folder")
    with pytest.raises(SettingsError) as refused:
        load_settings()
    message = str(refused.value)
    assert variable in message
    assert "scheme 'ftp'" in message
    assert "hdfs://" in message
    assert "s3a://" in message


def test_a_file_system_python_cannot_reach_is_named_with_what_to_install():
    # gcsfs is not installed here: the engine refuses to start, saying so.
    with pytest.raises(storage.StorageError, match=r"gs://bucket/x: .*gcsfs.*pip install"):
        storage.check(storage.location("gs://bucket/x"))
    storage.check(storage.location("/tmp"))  # local: nothing to check


def test_copy_and_rename_work_within_and_across_file_systems(storage_root, tmp_path: Path):
    source = storage_root / "a"
    (source / "offsets").mkdir(parents=True)
    (source / "offsets" / "0").write_text("v1\n{}")
    (source / "metadata").write_bytes(b"{}")
    listing = {storage.relative(p, source): p.read_bytes() for p in storage.files(source)}
    assert listing == {"metadata": b"{}", "offsets/0": b"v1\n{}"}

    for target in (storage_root / "b", tmp_path / "local-copy"):
        storage.copy_tree(source, target)
        assert {storage.relative(p, target): p.read_bytes() for p in storage.files(target)} == (
            listing
        )
    storage.rename(storage_root / "b", storage_root / "c")
    assert not (storage_root / "b").exists()
    assert [p.name for p in storage.children(storage_root)] == ["a", "c"]
    # A file renamed over another replaces it (how a narrowed offsets entry lands).
    (source / "offsets" / ".0.narrowing").write_text("v1\nnew")
    storage.rename(source / "offsets" / ".0.narrowing", source / "offsets" / "0")
    assert (source / "offsets" / "0").read_text() == "v1\nnew"
    storage.remove_tree(storage_root / "c")
    storage.remove_tree(storage_root / "never-there")
    assert [p.name for p in storage.children(storage_root)] == ["a"]
