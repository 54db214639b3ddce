"""Takeovers by a standby that is not where a warm pair's standby is: behind the active,
far ahead of what it published, or queued in the election behind an engine far behind.
Each runs a pipeline of its own with engine processes it starts and stops by pid.

`make chaos` only (`chaos_only`: TWINSTREAM_CHAOS_FULL=1): each names the tests of
`make test` that meet its guarantee.
"""

from __future__ import annotations

import pytest

from devkit.harness import EngineProcess, Load, Pipeline, wait_for
from tests.integration.engines import (
    assert_exactly_once_and_as_reference,
    processed,
    published,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.chaos,
    pytest.mark.usefixtures("quiet_stack_engines"),
]


def kill_the_active_and_check_the_takeover(
    pipeline: Pipeline, load: Load, active: EngineProcess, standby: EngineProcess
) -> None:
    """kill -9 of the active under `load`: the standby takes over and publishes new input;
    the load stopped and all of it published, every msg_id once, as the reference computes
    it, and no range the standby's buffer did not cover."""
    active.kill9()
    wait_for(lambda: standby.role() == "active", 15, "the standby taking over")
    after = published(standby)
    wait_for(lambda: published(standby) > after + 2000, 60, "the new active publishing new input")
    pipeline.stop_load(load)
    pipeline.wait_published(pipeline.produced - 1)
    assert_exactly_once_and_as_reference(pipeline, pipeline.produced)
    assert standby.get("/pipeline")["uncovered_ranges"] == []


@pytest.mark.chaos_only
def test_takeover_by_a_standby_behind_the_active_is_gapless(pipeline: Pipeline):
    """The standby lags the active: it publishes nothing it has not yet recomputed. (A
    standby ahead of the active: the next test.) `make chaos` only (72 s of `make test`):
    in `make test` a standby a batch or two behind under load takes over in
    tests/integration/test_engines.py's zombie and kill -9 tests, test_pipelines, test_keyed
    and test_partitions."""
    warm = {"TWINSTREAM_WARM_UP_RECORDS": "2000"}
    a, b = pipeline.start_pair(
        {"TWINSTREAM_TRIGGER_INTERVAL_MS": "100", **warm},
        {"TWINSTREAM_TRIGGER_INTERVAL_MS": "8000", **warm},
    )
    # Until the takeover is done: the engines' different rhythms open a lag under load.
    load = pipeline.load(60_000, rate=1000)
    wait_for(lambda: published(a) >= 2000, 60, "the active publishing under load")
    wait_for(lambda: processed(b) < published(a) - 200, 60, "the standby behind the active")
    kill_the_active_and_check_the_takeover(pipeline, load, a, b)
    # Both ran the plan over the pipeline's sample before their query (the warm-up).
    assert "warmed up in" in a.log_path.read_text()
    assert "warmed up in" in b.log_path.read_text()


@pytest.mark.chaos_only
def test_a_standby_far_ahead_keeps_every_unpublished_row_pausing_at_its_bound(
    pipeline: Pipeline,
):
    """The standby batches every 0.1 s, the active every 8 s (5,000 rows at most): the
    standby runs ahead of what the active has published. With a ring of 30 it still keeps
    every row the active has not published (the loss a kill benchmark found), and at its
    bound it pauses its query rather than drop one (the loss an outbound outage and a kill
    caused). Killed while the standby is paused ahead of it, the active loses nothing.

    `make chaos` only (63 s of `make test`): in `make test` the outbound outage
    (tests/chaos/test_outage.py) pauses a standby at its bound ahead of what its active
    published and kills the active then, 0 lost and 0 repeated; the double kill below runs
    a standby 1,000 rows ahead; a ring smaller than the lead is tests/unit/core/test_gate.py's
    (test_a_standby_far_ahead_of_a_lagging_active_still_covers_the_takeover)."""
    bound = 1_000
    a, b = pipeline.start_pair(
        {"TWINSTREAM_TRIGGER_INTERVAL_MS": "8000"},
        {
            "TWINSTREAM_TRIGGER_INTERVAL_MS": "100",
            "TWINSTREAM_NUM_BUFFERED_MSGS": "30",
            "TWINSTREAM_MAX_BUFFERED_MSGS": str(bound),
        },
    )
    load = pipeline.load(60_000, rate=1000)
    wait_for(lambda: published(a) >= 2000, 60, "the active publishing under load")

    def paused_ahead() -> str | None:
        info = b.get("/pipeline")
        assert info["buffer_fill"] <= bound + pipeline.settings.max_offsets_per_trigger
        ahead = info["last_msg_id_processed"] > published(a) + 300
        return info["paused"] if ahead else None

    reason = wait_for(paused_ahead, 90, "the standby paused at its bound, 300 ahead")
    assert "waiting for the active to publish" in reason
    kill_the_active_and_check_the_takeover(pipeline, load, a, b)


@pytest.mark.chaos_only
def test_a_kill_9_makes_the_in_sync_standby_active_not_one_queued_before_it_far_behind(
    stack_env, tmp_path, request: pytest.FixtureRequest
):
    """Three engines: the active, `c` restoring far behind (a new engine rebuilt cold from
    the topic's start, in small, slow batches), and the standby in sync but queued after `c`
    (its pipeline stopped and started again). A kill -9 of the active gives the win to `c`,
    first in ZooKeeper's queue: `c` hands it on before taking an epoch, and the in-sync
    standby becomes the active. `make chaos` only (61 s of `make test`): the hand-on is
    unit-tested (tests/unit/core/test_election.py: the preference, a winner far behind handing on
    without an epoch), and tests/integration/test_agreement.py's three engines fail over
    twice in `make test`. Every msg_id once, as the reference computes it. (`a` and `b`
    below are the pair's active and standby, whichever engine ids won.)"""
    pipeline = Pipeline(stack_env, tmp_path, engine_ids=("a", "b", "c"))
    request.node.twinstream_pipeline = pipeline  # a failure shows the engines' logs
    try:
        a, b = pipeline.start_pair()
        # Whether the kill comes during the load or after it, c stays far behind: it
        # rebuilds at most 100 records a second.
        load = pipeline.load(15_000, rate=500)
        wait_for(lambda: published(a) >= 1000, 60, "the active publishing under load")
        # c: at most 200 records a batch, a batch every 2 s, from the topic's start.
        c = pipeline.start(
            "c", TWINSTREAM_MAX_OFFSETS_PER_TRIGGER="200", TWINSTREAM_TRIGGER_INTERVAL_MS="2000"
        )
        # A new engine of a pipeline that has run refuses to start without a checkpoint:
        # it is rebuilt, as an operator (or the watch DAG) restores a lost one.
        wait_for(lambda: c.try_get("/pipeline"), 120, "engine c answering")
        cold = c.post("/pipeline/restore", {"snapshot": "cold"})
        assert cold.status_code == 200, cold.text
        wait_for(lambda: c.role() == "standby", 120, "engine c restoring, in the election")
        # b queues again, now after c.
        assert b.post("/pipeline/stop").status_code == 200
        assert b.post("/pipeline/start").status_code == 200
        wait_for(lambda: bool(b.get("/pipeline")["in_sync"]), 120, "b in sync again")
        behind = c.get("/pipeline")
        assert behind["state"] == "restoring", behind
        assert not behind["in_sync"], behind
        a.kill9()
        wait_for(lambda: b.role() == "active", 30, "the in-sync standby active")
        assert c.role() == "standby"
        assert c.get("/pipeline")["takeovers"] == []
        assert "handing the win on" in c.log_path.read_text()
        pipeline.join_load(load)
        pipeline.wait_published(pipeline.produced - 1)
        assert_exactly_once_and_as_reference(pipeline, pipeline.produced)
    finally:
        pipeline.discard()
