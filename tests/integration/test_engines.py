"""Hot-standby engines on real ZooKeeper, Kafka and Spark: failover with no gap and no
duplicate, zombie fencing, buffer coverage, bad input, a ZooKeeper restart.

Each test runs a pipeline of its own (topics, election path, transactional id) with engine
processes it starts and stops by pid.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.integration.engines import (
    assert_exactly_once_and_as_reference,
    processed,
    published,
)
from twinstream.harness import Pipeline, audit, ranges, wait_for
from twinstream.publisher import synthetic
from twinstream.testing import hostile

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("quiet_stack_engines")]


def test_kill_9_of_the_active_under_load_loses_and_repeats_nothing(pipeline: Pipeline):
    a, b = pipeline.start_pair()
    total = 15_000
    load = pipeline.load(total, rate=1000, broken_every=97)
    wait_for(lambda: published(a) >= 4000, 60, "the active publishing under load")
    a.kill9()
    killed = time.monotonic()
    wait_for(lambda: b.role() == "active", 15, "the standby taking over")
    takeover_s = time.monotonic() - killed
    pipeline.join_load(load)
    pipeline.wait_published(pipeline.produced - 1)

    outputs = assert_exactly_once_and_as_reference(pipeline, pipeline.produced)
    by_engine = {r.engine_id for r in outputs}
    assert by_engine == {"a", "b"}, "both engines must have published: before and after the kill"
    assert takeover_s < 5, f"takeover took {takeover_s:.1f}s"


def test_a_paused_zombie_active_is_fenced_and_steps_down(pipeline: Pipeline):
    a, b = pipeline.start_pair()
    total = 12_000
    load = pipeline.load(total, rate=1000)
    wait_for(lambda: published(a) >= 3000, 60, "the active publishing under load")
    a.proc.send_signal(signal.SIGSTOP)
    try:
        # Longer than the 1 s session: the standby only wins once a's session has expired.
        wait_for(lambda: b.role() == "active", 20, "the standby taking over from the zombie")
        new_epoch = b.get("/server")["epoch"]
    finally:
        a.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: a.role() == "standby", 30, "the ex-active stepping down")
    pipeline.join_load(load)
    pipeline.wait_published(pipeline.produced - 1)

    outputs = pipeline.outputs()
    result = audit(outputs, pipeline.produced)
    assert ranges(result.missing) == []
    assert ranges(result.duplicated) == []
    for topic in (pipeline.settings.outbound_topic, pipeline.settings.dlq_topic):
        in_order = sorted((r for r in outputs if r.topic == topic), key=lambda r: r.offset)
        first_new = next(
            (i for i, r in enumerate(in_order) if r.epoch is not None and r.epoch >= new_epoch),
            len(in_order),
        )
        late = [r.msg_id for r in in_order[first_new:] if r.engine_id == "a"]
        assert late == [], f"the fenced ex-active committed msg_ids {late[:5]} into {topic}"
    assert a.get("/server")["epoch"] < new_epoch or a.role() != "active"


@pytest.mark.parametrize(
    ("case", "active_env", "standby_env"),
    [
        # The standby computes far more often than the active publishes: it is ahead.
        (
            "ahead",
            {"TWINSTREAM_TRIGGER_INTERVAL_MS": "8000"},
            {"TWINSTREAM_TRIGGER_INTERVAL_MS": "100"},
        ),
        # The standby lags the active: it publishes nothing it has not yet recomputed.
        (
            "behind",
            {"TWINSTREAM_TRIGGER_INTERVAL_MS": "100"},
            {"TWINSTREAM_TRIGGER_INTERVAL_MS": "8000"},
        ),
    ],
)
def test_takeover_by_a_standby_ahead_or_behind_is_gapless(
    pipeline: Pipeline, case, active_env, standby_env
):
    a, b = pipeline.start_pair(active_env, standby_env)
    # Long enough that the engines' different rhythms open a lead or a lag under load.
    total = 30_000
    load = pipeline.load(total, rate=1000)
    wait_for(lambda: published(a) >= 2000, 60, "the active publishing under load")
    if case == "ahead":
        wait_for(lambda: processed(b) > published(a) + 200, 60, "the standby ahead of the active")
    else:
        wait_for(lambda: processed(b) < published(a) - 200, 60, "the standby behind the active")
    a.kill9()
    wait_for(lambda: b.role() == "active", 15, "the standby taking over")
    pipeline.join_load(load)
    pipeline.wait_published(pipeline.produced - 1)
    assert_exactly_once_and_as_reference(pipeline, pipeline.produced)
    assert b.get("/pipeline")["uncovered_ranges"] == []


def kill_an_active_far_behind_its_standby(pipeline: Pipeline, standby_env: dict[str, str]):
    """Active a batches every 8 s, standby b every 0.1 s: b runs hundreds of outputs ahead;
    kill a under load, let b take over and publish everything. Returns b."""
    a, b = pipeline.start_pair(
        {"TWINSTREAM_TRIGGER_INTERVAL_MS": "8000"},
        {"TWINSTREAM_TRIGGER_INTERVAL_MS": "100", **standby_env},
    )
    load = pipeline.load(30_000, rate=1000)
    wait_for(lambda: published(a) >= 2000, 60, "the active publishing under load")
    wait_for(lambda: processed(b) > published(a) + 300, 60, "the standby far ahead of the active")
    a.kill9()
    wait_for(lambda: b.role() == "active", 15, "the standby taking over")
    pipeline.join_load(load)
    pipeline.wait_published(pipeline.produced - 1)
    return b


def test_a_standby_far_ahead_of_a_lagging_active_still_covers_the_takeover(
    pipeline: Pipeline,
):
    # The loss a kill benchmark found: the standby hundreds of outputs ahead of the active
    # with a buffer of 30. It keeps what the active has not published, so nothing is lost.
    b = kill_an_active_far_behind_its_standby(pipeline, {"TWINSTREAM_NUM_BUFFERED_MSGS": "30"})
    result = audit(pipeline.outputs(), pipeline.produced)
    assert ranges(result.duplicated) == []
    assert ranges(result.missing) == []
    assert b.get("/pipeline")["uncovered_ranges"] == []


def test_a_buffer_too_small_to_cover_reports_the_exact_missing_range(pipeline: Pipeline):
    # Capped at 30 as well: past its cap a standby drops rows the active has not published.
    b = kill_an_active_far_behind_its_standby(
        pipeline, {"TWINSTREAM_NUM_BUFFERED_MSGS": "30", "TWINSTREAM_MAX_BUFFERED_MSGS": "30"}
    )

    outputs = pipeline.outputs()
    last_old = max(r.msg_id for r in outputs if r.engine_id == "a" and r.msg_id is not None)
    first_new = min(r.msg_id for r in outputs if r.engine_id == "b" and r.msg_id is not None)
    result = audit(outputs, pipeline.produced)
    assert ranges(result.duplicated) == []
    assert ranges(result.missing) == [(last_old + 1, first_new - 1)]
    assert first_new - 1 - last_old > 30 - 1
    reported = b.get("/pipeline")["uncovered_ranges"]
    assert reported == [[last_old + 1, first_new - 1]]
    metrics = b.get_text("/metrics")
    labels = f'engine="b",pipeline="{pipeline.name}"'
    uncovered = float(first_new - 1 - last_old)
    assert f"twinstream_uncovered_msgs_total{{{labels}}} {uncovered}" in metrics
    assert "UNCOVERED msg_id" in b.log_path.read_text()


def test_a_hostile_corpus_under_load_is_dead_lettered_with_reasons_and_stops_nothing(
    pipeline: Pipeline,
):
    """Records that used to stop both engines at once (5,000 nested arrays, numbers past
    every range, two 1e308 for one host, a 900 KB record whose dead letter did not fit) and
    every other kind of the corpus, among steady good load: each record exactly once in
    .out or .dlq with its reason, no engine restarted, no query failed, no role change."""
    a, b = pipeline.start_pair()
    pids = {a.pid, b.pid}
    corpus = hostile.cases(pipeline.settings.record_limits)
    good = synthetic(5_000, max_record_bytes=pipeline.settings.max_record_bytes, seed=3)
    stream = list(hostile.interleave(good, corpus, every=75))
    first = pipeline.produced  # msg_id of the stream's first record (after the warm-up)
    pipeline.join_load(pipeline.send([raw for raw, _ in stream], rate=1000))
    pipeline.wait_published(pipeline.produced - 1)

    outputs = assert_exactly_once_and_as_reference(pipeline, pipeline.produced)
    by_msg_id = {r.msg_id: r for r in outputs}
    for offset, (_, case) in enumerate(stream, start=first):
        if case is None:
            continue
        record = by_msg_id[offset]
        if case.expect == "out":
            assert record.topic == pipeline.settings.outbound_topic, (case.name, record.value)
        else:
            assert record.topic == pipeline.settings.dlq_topic, case.name
            reason = json.loads(record.value)["reason"]
            assert reason.startswith(f"{case.expect}: "), (case.name, reason)
    big_at = first + next(i for i, (_, c) in enumerate(stream) if c and c.name == "size_900k")
    big = json.loads(by_msg_id[big_at].value)
    assert big["truncated"] is True
    assert big["raw_bytes"] == 900_000
    assert {e.pid for e in (a, b) if e.proc.poll() is None} == pids
    assert {e.get("/pipeline")["state"] for e in (a, b)} == {"running"}
    assert (a.role(), b.role()) == ("active", "standby")
