"""`up` after `down`, on the test stack: the second life of a stack.

`make chaos` only (`chaos_only`: TWINSTREAM_CHAOS_FULL=1): a second start of ZooKeeper,
three brokers, Airflow and two engines costs make test about 200 s on two cores (the test
that held both rounds took 231 s in a fresh clone's run at pace 2.1). In make test, `up` on
fresh state is every session's own start (the `stack` fixture, through `core.up` as
`make up`), and `down` leaving no process is tests/integration/test_stack.py's
`test_down_leaves_no_process_of_the_stack`, which runs before this one.
"""

from __future__ import annotations

import pytest

from tests.integration.test_stack import assert_down_leaves_no_process
from twinstream.stack import core

pytestmark = [pytest.mark.integration]


@pytest.mark.chaos_only
@pytest.mark.stack_teardown
def test_up_after_down_starts_the_stack_again_and_down_stops_it(stack, settings):
    # hostmetrics' engines only: that up starts engines and down stops them is the point,
    # not how long Spark takes to start two more (payments' ran at the start).
    # Down first, unless make test's down test ran just before (`make chaos` runs
    # tests/chaos alone, with the stack its session started).
    if core.status(settings, echo=lambda _line: None) != 3:
        assert_down_leaves_no_process(settings)
    one = settings.model_copy(update={"stack_pipelines": ["hostmetrics"]})
    report = core.up(one, echo=lambda _line: None)
    assert report.started_supervisor
    assert set(report.actives) == {"hostmetrics"}
    assert_down_leaves_no_process(settings)
