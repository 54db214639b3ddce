"""Fixtures shared by the unit tests."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest

import twinstream.engine as engine_module
from twinstream.config import load_settings


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> engine_module.Engine:
    """An engine with every client mocked, its state in tmp_path, its query running."""
    # Nothing here may reach a network: every client the constructor builds is a mock.
    for name in (
        "zk_client",
        "InboundWatermarks",
        "LastPublishedReader",
        "KafkaPublisher",
        "Election",
    ):
        monkeypatch.setattr(engine_module, name, mock.MagicMock(name=name))
    # No stack has run on a fresh clone: no secret files; the ZooKeeper client is a mock.
    settings = load_settings(zk_password="unit-test", state_dir=tmp_path)
    e = engine_module.Engine(settings, "a", mock.MagicMock(name="pipeline"))
    e._state = "running"
    e._query = mock.MagicMock(name="query")
    e._spark = mock.MagicMock(name="spark")
    return e
