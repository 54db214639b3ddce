"""An engine's lifecycle with every client mocked: its shutdown must leave ZooKeeper and
close its clients even when Spark is already going down around it (SIGTERM reaches the
whole process group, JVM included); a standby tracks how far the active has published."""

from unittest import mock

import pytest

from twinstream.core.agreement import PublishedRange, digest
from twinstream.core.rows import NONE, Output
from twinstream.engine import app as engine_module
from twinstream.engine.api import Conflict
from twinstream.engine.lifecycle import State


def test_close_stops_the_query_and_every_client(engine):
    query = engine._query
    engine.close()
    query.stop.assert_called_once()
    engine.election.stop.assert_called_once()
    engine.zk.stop.assert_called_once()
    engine.zk.close.assert_called_once()
    # Both InboundWatermarks: the lag's and the arrivals' consumers.
    engine.watermarks.close.assert_called_once()
    engine.clients.arrival_marks.close.assert_called_once()
    engine._spark.stop.assert_called_once()
    assert engine.lifecycle.state == "stopped"


def test_a_closing_standby_shuts_down_below_the_engines_that_go_on(engine):
    engine.priority = mock.MagicMock(name="priority")
    engine.gate._role = "standby"
    engine.close()
    engine.priority.ending.assert_called_once_with(leads=False)


def test_close_goes_on_when_the_jvm_already_stopped_the_spark_context(engine, caplog):
    engine._query.stop.side_effect = RuntimeError(
        "An error occurred while calling o114.stop.\n"
        ": java.lang.IllegalStateException: Cannot call methods on a stopped SparkContext."
    )
    engine.close()  # must not raise
    engine.election.stop.assert_called_once()
    engine.zk.stop.assert_called_once()
    engine.zk.close.assert_called_once()
    # Both InboundWatermarks: the lag's and the arrivals' consumers.
    engine.watermarks.close.assert_called_once()
    engine.clients.arrival_marks.close.assert_called_once()
    assert engine.lifecycle.state == "stopped"
    assert engine._query is None
    assert "did not stop cleanly (An error occurred while calling o114.stop.)" in caplog.text


def test_a_standby_tells_its_gate_how_far_the_active_has_published(engine):
    """The first look reads how far the active had published (the floor); later ones follow
    the progress topic, and the gate forgets a range's rows only once compared."""
    engine.gate.joined()
    engine._active_position.partitions.return_value = [0, 1]
    engine._active_position.return_value = {0: 41, 1: 7}
    engine._follower.poll.return_value = []
    engine.track_active_position()
    engine._follower.start.assert_called_once_with([0, 1])
    assert {p: part.published_elsewhere for p, part in engine.gate._parts.items()} == {0: 41, 1: 7}
    rows = [Output(42, "out", "k", "x"), Output(43, NONE, None, "")]
    engine.gate.on_batch(1, rows)
    engine._follower.poll.return_value = [PublishedRange(0, 42, 43, digest(rows), 2, "b")]
    engine.track_active_position()
    assert engine._active_position.call_count == 1  # the tail is read once, then followed
    assert engine.gate._parts[0].published_elsewhere == 43
    info = engine.pipeline().agreement
    assert (info.state, info.checked, info.ranges_agreed) == ("agrees", {0: 43}, 1)


def test_a_range_not_processed_yet_keeps_its_rows_until_compared(engine):
    engine.gate.joined()
    engine._active_position.partitions.return_value = [0]
    engine._active_position.return_value = {0: 9}
    engine._follower.poll.return_value = [PublishedRange(0, 10, 12, "d", 2, "b")]
    engine.track_active_position()
    # The active published 10..12; this standby has not computed them: kept when they come.
    assert engine.gate._parts[0].published_elsewhere == 9
    assert engine.pipeline().agreement.state == "unchecked"


def test_a_difference_makes_the_standby_ineligible_until_overridden_or_restored(engine):
    engine.gate.joined()
    engine._active_position.partitions.return_value = [0]
    engine._active_position.return_value = {0: 41}
    engine.gate.on_batch(1, [Output(42, "out", "k", "mine")])
    published = [Output(42, "out", "k", "theirs")]
    engine._follower.poll.return_value = [PublishedRange(0, 42, 42, digest(published), 5, "b")]
    engine.clients.published_rows.return_value = published
    engine.track_active_position()
    info = engine.pipeline().agreement
    assert info.state == "disagrees"
    assert info.difference is not None
    assert (info.difference.msg_id, info.difference.epoch) == (42, 5)
    assert [r.value for r in info.difference.active_rows] == ["theirs"]
    assert [r.value for r in info.difference.engine_rows] == ["mine"]
    assert not info.eligible
    assert engine.standing().eligible is False
    assert engine.override().agreement.overridden
    assert engine.standing().eligible is True
    engine.agreement.reset("restored from s1")
    assert engine.pipeline().agreement.state == "unchecked"


def test_override_is_refused_when_the_engine_does_not_disagree(engine):
    with pytest.raises(Conflict, match="does not disagree"):
        engine.override()


def test_the_active_does_not_look_for_its_own_position(engine):
    engine.gate._role = "active"
    engine.track_active_position()
    engine._active_position.assert_not_called()
    engine._follower.start.assert_not_called()


def test_a_failed_read_is_logged_and_retried_later(engine, caplog):
    engine.gate.joined()
    engine._active_position.side_effect = RuntimeError("broker down")
    engine.track_active_position()
    assert "could not follow the active's published ranges: broker down" in caplog.text
    assert engine.gate._parts == {}


def test_a_pipeline_node_someone_else_made_stops_the_pipeline_with_the_fix(engine, monkeypatch):
    from twinstream.core.election import ForeignNodeError

    engine.lifecycle.move(State.STOPPED, "stopped")
    engine._query = None
    monkeypatch.setattr(engine, "_checkpoint_problem", lambda: None)
    monkeypatch.setattr(engine, "_new_session", lambda: pytest.fail("no query may start"))
    engine.election.claim.side_effect = ForeignNodeError("node /twinstream/p ... deleteall")
    with pytest.raises(Conflict, match="deleteall"):
        engine.start()
    info = engine.pipeline()
    assert info.state == "stopped"
    assert "deleteall" in info.reason
    engine.election.start.assert_not_called()


def test_a_session_suspended_as_the_query_starts_is_asked_again_not_a_failed_start(
    engine, monkeypatch
):
    """With the smallest session ZooKeeper grants, a heartbeat missed while JVMs start drops
    the connection for a moment: the claim and the quarantine's read that raise
    ConnectionLoss then are asked again (the engine exited on it, and supervisord restarted
    it: ~25 s of `up`)."""
    from kazoo.exceptions import ConnectionLoss

    engine.zk.connected = True
    engine.election.claim.side_effect = [ConnectionLoss(), None]
    failures = [ConnectionLoss()]

    def entries() -> dict[int, str]:
        if failures:
            raise failures.pop()
        return {7: "raised ValueError"}

    monkeypatch.setattr(engine.quarantine, "entries", entries)
    assert engine._read_quarantine() == {7: "raised ValueError"}
    assert engine.election.claim.call_count == 2


def test_a_refusal_as_the_query_starts_is_not_asked_again(engine):
    from twinstream.core.election import ForeignNodeError

    engine.zk.connected = True
    engine.election.claim.side_effect = ForeignNodeError("node /twinstream/p ... deleteall")
    with pytest.raises(ForeignNodeError):
        engine._read_quarantine()
    assert engine.election.claim.call_count == 1


def test_a_batch_gives_the_gate_a_coverage_row_for_each_offset_of_its_range_without_a_record(
    engine, monkeypatch
):
    """Transaction markers in the inbound topic (the publisher adapters write it in
    transactions): the batch's range comes from the checkpoint's offsets log."""
    import json

    from twinstream.core.rows import NONE, OUT, Output

    checkpoint = engine.settings.checkpoint_dir(engine.engine_id)
    topic = engine.settings.inbound_topic
    (checkpoint / "offsets").mkdir(parents=True)
    for batch, end in ((4, 10), (5, 14)):
        (checkpoint / "offsets" / str(batch)).write_text(
            f"v1\n{{}}\n{json.dumps({topic: {'0': end}})}"
        )
    rows = [Output(10, OUT, None, "a"), Output(11, OUT, None, "b"), Output(12, OUT, None, "c")]
    monkeypatch.setattr(engine_module, "rows_of", lambda *_args: rows)
    given: list[list[Output]] = []

    def on_batch(_batch: int, batch_rows: list[Output]) -> int:
        given.append(batch_rows)
        return 0

    monkeypatch.setattr(engine.gate, "on_batch", on_batch)
    engine.process_batch(None, 5)
    assert [(r.msg_id, r.kind) for r in given[0]] == [
        (10, OUT),
        (11, OUT),
        (12, OUT),
        (13, NONE),  # the transaction's commit marker
    ]


def test_an_engine_is_built_from_its_clients_and_starts_nothing_until_opened(tmp_path):
    """The constructor takes its clients (no module of the engine is patched here) and
    starts no thread; `open` starts the arrival sampler and prepares a takeover's publisher,
    and `close` stops it."""
    import threading
    from typing import Any

    from tests.unit.fakes import engine_clients
    from twinstream.engine.app import Engine
    from twinstream.platform.settings import load_settings

    settings = load_settings(pipeline="hostmetrics", zk_password="unit-test", state_dir=tmp_path)
    threads = set(threading.enumerate())
    clients: Any = engine_clients()  # its mocks' own methods
    engine = Engine(settings, "a", mock.MagicMock(name="pipeline"), clients)
    assert set(threading.enumerate()) == threads
    clients.publisher.assert_not_called()
    assert engine.election is clients.election.return_value
    assert engine.lifecycle.state == "stopped"
    engine.open()
    assert engine._arrival_sampler.is_alive()
    clients.publisher.assert_called_once_with(engine.published_digests)
    engine.close()
    assert not engine._arrival_sampler.is_alive()
    clients.zk.close.assert_called_once()


def test_an_engine_says_which_code_it_runs_and_when_the_files_changed_since(tmp_path):
    """GET /server and /metrics: the version the engine loaded stays its own; the digest of
    the code on disk is read at each look, and differs once the files change."""
    from typing import Any

    from prometheus_client import generate_latest

    from tests.unit.fakes import engine_clients
    from twinstream.engine.app import Engine
    from twinstream.platform.settings import load_settings
    from twinstream.platform.versions import CodeVersion

    settings = load_settings(pipeline="hostmetrics", zk_password="unit-test", state_dir=tmp_path)
    clients: Any = engine_clients()
    on_disk = ["0123456789ab"]
    clients.version = CodeVersion("2", "0123456789ab")
    clients.code_on_disk = lambda: on_disk[0]
    clients.election.return_value.zk_state = "CONNECTED"
    definition = mock.MagicMock(name="pipeline")
    definition.state_shape = "count BIGINT"
    engine = Engine(settings, "a", definition, clients)
    server = engine.server()
    assert server.state_shape == "count BIGINT"
    assert (server.pipeline_version, server.code_on_disk, server.stale) == (
        "2+0123456789ab",
        "0123456789ab",
        False,
    )
    on_disk[0] = "ffffffffffff"
    server = engine.server()
    assert (server.pipeline_version, server.stale) == ("2+0123456789ab", True)
    engine.meters.code(str(clients.version), engine.code()[1])
    text = generate_latest(engine.meters.registry).decode()
    labels = 'engine="a",pipeline="hostmetrics",version="2+0123456789ab"'
    assert f"twinstream_pipeline_version_info{{{labels}}} 1.0" in text
    assert 'twinstream_code_stale{engine="a",pipeline="hostmetrics"} 1.0' in text
    # Code that cannot be found on disk is not called a change.
    on_disk[0] = ""
    assert engine.server().stale is False


def test_an_engine_that_was_a_warm_spare_says_so_in_server_takeovers_and_metrics(tmp_path):
    """An engine given a warm spare's session (its process was that spare) says so in GET
    /server, on each takeover it remembers, and in /metrics beside its machine's spares as
    their keeper last wrote them; one started cold says that too."""
    from typing import Any

    from tests.unit.fakes import engine_clients
    from twinstream.engine.app import Engine
    from twinstream.engine.spare_keeper import write_status
    from twinstream.platform.settings import load_settings

    settings = load_settings(pipeline="hostmetrics", zk_password="unit-test", state_dir=tmp_path)
    clients: Any = engine_clients()
    clients.election.return_value.zk_state = "CONNECTED"
    definition = mock.MagicMock(name="pipeline")
    definition.state_shape = ""
    cold = Engine(settings, "a", definition, clients)
    warm = Engine(settings, "b", definition, clients, spark=mock.MagicMock(name="spark"))
    assert (cold.server().from_spare, warm.server().from_spare) == (False, True)

    warm.gate.take_over(3, fence=mock.MagicMock, last_committed=lambda: {0: -1})
    assert [t.from_spare for t in warm.pipeline().takeovers] == [True]

    write_status(
        settings.spares_dir,
        [{"status": "warm"}, {"status": "warming"}, {"status": "adopted", "engine_id": "b"}],
    )
    text = warm.metrics()  # GET /metrics
    labels = 'engine="b",pipeline="hostmetrics"'
    assert f"twinstream_engine_from_spare{{{labels}}} 1.0" in text
    for status, count in (("warm", 1), ("warming", 1), ("adopted", 1), ("offered", 0)):
        assert f'twinstream_spares{{{labels},status="{status}"}} {count}.0' in text
