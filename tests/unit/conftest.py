"""Fixtures shared by the unit tests."""

from __future__ import annotations

import uuid
from pathlib import Path
from unittest import mock

import pytest

import twinstream.engine.app as engine_module
from twinstream.platform.settings import load_settings


@pytest.fixture(autouse=True)
def kafka_without_security(monkeypatch: pytest.MonkeyPatch) -> None:
    """No stack, so no Kafka credentials or CA: clients are built PLAINTEXT unless a test
    turns security on with credentials of its own (test_kafka_auth, test_render)."""
    monkeypatch.setenv("TWINSTREAM_KAFKA_SECURITY", "false")


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> engine_module.Engine:
    """An engine with every client mocked, its state in tmp_path, its query running."""
    # Nothing here may reach a network: every client the constructor builds is a mock.
    for name in (
        "zk_client",
        "InboundWatermarks",
        "LastPublishedReader",
        "KafkaPublisher",
        "ProgressFollower",
        "Election",
        "ArrivalSampler",
    ):
        monkeypatch.setattr(engine_module, name, mock.MagicMock(name=name))
    # No stack has run on a fresh clone: no secret files; the ZooKeeper client is a mock.
    settings = load_settings(zk_password="unit-test", state_dir=tmp_path)
    e = engine_module.Engine(settings, "a", mock.MagicMock(name="pipeline"))
    e._state = "running"
    e._query = mock.MagicMock(name="query")
    e._spark = mock.MagicMock(name="spark")
    return e


@pytest.fixture(params=["local", "file-url", "memory"])
def storage_root(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """A fresh empty folder: on a local disk by path, by a `file://` URL (through fsspec's
    local file system, as a remote one is reached), and on fsspec's in-memory file system.
    Code that passes on the last two calls no local-only API, as checkpoints and snapshots
    on HDFS or S3 (twinstream.platform.storage) need."""
    if request.param == "local":
        yield tmp_path_factory.mktemp("root")
        return
    from upath import UPath

    if request.param == "file-url":
        yield UPath(f"file://{tmp_path_factory.mktemp('root')}")
        return
    root = UPath(f"memory://twinstream-{uuid.uuid4().hex}/root")
    root.mkdir(parents=True)
    yield root
    root.fs.rm(root.path, recursive=True)
