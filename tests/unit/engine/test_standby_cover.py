"""Issue 49: an engine judges its in-sync state and its standbys in its main loop, once a
second; a status read (GET /pipeline, /metrics) reports them and changes nothing."""

import json

from twinstream.core.election import Standing
from twinstream.engine.api import PipelineInfo
from twinstream.engine.lifecycle import State


def level(engine, lag: int = 0) -> None:
    topic = engine.settings.inbound_topic
    engine.watermarks.highs.return_value = {0: 100 + lag}
    engine._query.lastProgress = {"sources": [{"endOffset": json.dumps({topic: {"0": 100}})}]}


def test_a_restore_ends_in_the_main_loop_never_in_a_status_read(engine) -> None:
    engine.lifecycle.move(State.STOPPED, "stopped")
    engine.lifecycle.move(State.RESTORING, "replaying")
    engine._restored_from = "cold"
    level(engine)
    info = engine.pipeline()
    assert (info.state, info.in_sync) == ("restoring", False)
    engine.metrics()
    assert engine.pipeline().state == "restoring"
    engine.publish_standing()  # the main loop's second
    info = engine.pipeline()
    assert (info.state, info.in_sync) == ("running", True)


def test_in_sync_is_judged_in_seconds_of_the_engine_s_measured_rate(engine) -> None:
    engine.drain_rate.value = 5_000.0
    level(engine, lag=10_000)  # 2 s: in sync at the 3 s bound, though over 5,000 records
    engine.publish_standing()
    info = engine.pipeline()
    assert info.in_sync
    assert info.lag_s == 2.0
    assert 'twinstream_lag_seconds{engine="a",pipeline="hostmetrics"} 2.0' in engine.metrics()


def test_an_active_without_a_standby_that_could_take_over_says_so_and_since_when(engine) -> None:
    level(engine)
    engine.gate._set_role("active")  # as a takeover leaves it
    engine.election.standings.return_value = {"b": Standing(False, 40_000, True, 12.5)}
    engine.publish_standing()
    info = engine.pipeline()
    assert info.standbys is not None
    assert info.standbys.ready == []
    assert info.standbys.not_ready == {"b": "not in sync (40,000 records, 12.5 s behind)"}
    assert info.standbys.unprotected_since is not None
    text = engine.metrics()
    assert 'twinstream_unprotected{engine="a",pipeline="hostmetrics"} 1.0' in text
    assert 'twinstream_ready_standbys{engine="a",pipeline="hostmetrics"} 0.0' in text
    # b catches up: covered again.
    engine.election.standings.return_value = {"b": Standing(True, 100, True, 0.1)}
    engine.publish_standing()
    info = engine.pipeline()
    assert info.standbys is not None
    assert info.standbys.ready == ["b"]
    assert info.standbys.unprotected_since is None
    assert 'twinstream_unprotected{engine="a",pipeline="hostmetrics"} 0.0' in engine.metrics()


def test_a_standby_reports_no_cover_of_its_own(engine) -> None:
    level(engine)
    engine.gate.joined()
    engine.publish_standing()
    assert engine.pipeline().standbys is None
    engine.election.standings.assert_not_called()
    assert PipelineInfo.model_validate(engine.pipeline().model_dump()).standbys is None
