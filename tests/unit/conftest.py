"""Fixtures shared by the unit tests."""

from __future__ import annotations

import uuid
from pathlib import Path
from unittest import mock

import pytest

from tests.unit.fakes import engine_clients
from twinstream.engine.app import Engine
from twinstream.engine.lifecycle import State
from twinstream.engine.priority import Priority
from twinstream.platform.settings import load_settings


@pytest.fixture(autouse=True)
def kafka_without_security(monkeypatch: pytest.MonkeyPatch) -> None:
    """No stack, so no Kafka credentials or CA: clients are built PLAINTEXT unless a test
    turns security on with credentials of its own (test_kafka_auth, test_render)."""
    monkeypatch.setenv("TWINSTREAM_KAFKA_SECURITY", "false")


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    """An engine built from fake clients (tests.unit.fakes.engine_clients: nothing reaches
    a network, no thread starts), its state in tmp_path, its query running."""
    # No stack has run on a fresh clone: no secret files; the ZooKeeper client is a fake.
    settings = load_settings(pipeline="hostmetrics", zk_password="unit-test", state_dir=tmp_path)
    definition = mock.MagicMock(name="pipeline")
    definition.state_shape = "count BIGINT"
    e = Engine(settings, "a", definition, engine_clients())
    # Never the test process's own threads' niceness (twinstream.engine.priority).
    e.priority = Priority(False, 0, raise_=lambda: 0, lower=lambda _niceness: 0)
    e.lifecycle.move(State.RUNNING, "")
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
