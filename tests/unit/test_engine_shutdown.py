"""An engine's shutdown: it must leave ZooKeeper and close its clients even when Spark is
already going down around it (SIGTERM reaches the whole process group, JVM included)."""

from unittest import mock

import pytest

import twinstream.engine as engine_module
from twinstream.config import load_settings


@pytest.fixture
def engine(monkeypatch):
    # Nothing here may reach a network: every client the constructor builds is a mock.
    for name in ("zk_client", "Consumer", "LastPublishedReader", "KafkaPublisher", "Election"):
        monkeypatch.setattr(engine_module, name, mock.MagicMock(name=name))
    # No stack has run on a fresh clone: no secret files; the ZooKeeper client is a mock.
    e = engine_module.Engine(load_settings(zk_password="unit-test"), "a")
    e._state = "running"
    e._query = mock.MagicMock(name="query")
    e._spark = mock.MagicMock(name="spark")
    return e


def test_close_stops_the_query_and_every_client(engine):
    query = engine._query
    engine.close()
    query.stop.assert_called_once()
    engine.election.stop.assert_called_once()
    engine.zk.stop.assert_called_once()
    engine.zk.close.assert_called_once()
    engine._hwm_consumer.close.assert_called_once()
    engine._spark.stop.assert_called_once()
    assert engine._state == "stopped"


def test_close_goes_on_when_the_jvm_already_stopped_the_spark_context(engine, caplog):
    engine._query.stop.side_effect = RuntimeError(
        "An error occurred while calling o114.stop.\n"
        ": java.lang.IllegalStateException: Cannot call methods on a stopped SparkContext."
    )
    engine.close()  # must not raise
    engine.election.stop.assert_called_once()
    engine.zk.stop.assert_called_once()
    engine.zk.close.assert_called_once()
    engine._hwm_consumer.close.assert_called_once()
    assert engine._state == "stopped"
    assert engine._query is None
    assert "did not stop cleanly (An error occurred while calling o114.stop.)" in caplog.text
