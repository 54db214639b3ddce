"""Three engines of one pipeline through two kills (issue 38), on real ZooKeeper, Kafka and
Spark, its engines its own, stopped by pid.

`make chaos` only (`chaos_only`: TWINSTREAM_CHAOS_FULL=1): three JVMs' starts and two
catch-ups take 4 to 5 minutes of make test on two cores (288 s in a fresh clone's run at
pace 2.1). In make test its guarantee is met in parts: a kill -9 of the active handed over
exactly once in tests/integration/test_engines.py (and under keyed load in test_keyed.py),
both engines killed at once and the gap published once in test_engines.py, and a standby's
agreement with the active's published rows, and one that disagrees barred, in
tests/integration/test_agreement.py.
"""

from __future__ import annotations

import pytest

from devkit.harness import Pipeline, wait_for
from tests.integration.engines import assert_exactly_once_and_as_reference, published
from tests.integration.test_agreement import RATE, agreeing

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("quiet_stack_engines")]


@pytest.mark.chaos_only
def test_three_engines_two_kills_exactly_once_and_every_engine_agreeing_after(stack_env, tmp_path):
    """1 + 2: kill -9 of the active under load, then of the new active: the third engine
    publishes, every msg_id once and as the reference computes it. The two killed engines
    come back (as supervisord restarts them) from their checkpoints, catch up, and every
    engine agrees with the published output again."""
    # orders: stateless Spark SQL with a fan-out; three JVMs on two cores start and catch up
    # sooner than with keyed state (the keyed pipelines' kills: test_keyed, test_engines).
    pipeline = Pipeline(stack_env, tmp_path, engine_ids=("a", "b", "c"), module="pipelines.orders")
    try:
        engines = [pipeline.start(e) for e in ("a", "b", "c")]
        pipeline.wait_running(*engines)
        first = wait_for(pipeline.active, 90, "one engine active")
        pipeline.warm_up(*engines)
        # Longer than the scenario needs, stopped after the second kill: both kills come
        # under load on any machine (on a slow one a load of 6,000 ran out before the
        # second active had published 1,000 more).
        load = pipeline.load(RATE * 600, rate=RATE)
        killed = []
        for _ in range(2):
            active = wait_for(pipeline.active, 30, "an active")
            target = published(active) + 1_000
            wait_for(
                lambda a=active, t=target: published(a) >= t,  # type: ignore[misc]
                60,
                f"engine {active.engine_id} publishing",
            )
            active.kill9()
            killed.append(active)
        pipeline.stop_load(load)
        survivor = wait_for(pipeline.active, 30, "the third engine active")
        assert survivor not in killed
        assert killed[0] is first
        back = [pipeline.start(e.engine_id) for e in killed]
        pipeline.wait_running(*back)
        pipeline.wait_published(pipeline.produced - 1, timeout_s=180)
        pipeline.wait_caught_up(*back, timeout_s=180)
        # Ranges published while every engine runs: each standby compares them.
        pipeline.join_load(pipeline.load(1_000, rate=0))
        pipeline.wait_published(pipeline.produced - 1)
        for engine in [survivor, *back]:
            agreement = wait_for(
                lambda e=engine: agreeing(e),  # type: ignore[misc]
                60,
                f"engine {engine.engine_id} agreeing",
            )
            assert agreement["difference"] is None, agreement
        assert_exactly_once_and_as_reference(pipeline, pipeline.produced)
    finally:
        pipeline.discard()
