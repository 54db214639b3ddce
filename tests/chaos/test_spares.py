"""Warm spares on the real stack (issue 52): the stack's keeper (supervisord's `spares`)
keeps a spare engine process warm; an engine killed -9 under load is restarted by
supervisord, whose new process asks the spare to become the engine and stands for it
(twinstream.engine.spare). The engine then answers from the spare's process, warm.

`make chaos` only (`chaos_only`: TWINSTREAM_CHAOS_FULL=1), a scenario of minutes (205 s on
two cores at pace 2.26: the stack's pair under load, a kill, the pair whole again). In
`make test` every engine a test starts is adopted from the test process's own warm spares
(devkit/spares.py) where one is ready, and the handshake, refusals and adoption are
tests/unit/engine/test_spare.py's."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from devkit.chaos import (
    SteadyLoad,
    SupervisedEngines,
    audit_load,
    audit_summary,
    only_this_pipeline,
)
from devkit.harness import inbound_ends, wait_for
from devkit.pace import bound
from twinstream.engine.spare import warm_spares
from twinstream.platform.settings import Settings
from twinstream.stack.layout import Layout
from twinstream.stack.supervisor import Supervisor

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

# Issue 52's target: a killed engine an in-sync standby again within 30 s at 1,000 events/s.
# The test's bound is twice the target (a busy CI machine, scaled by its pace); the target
# is the benchmark's.
BACK_IN_SYNC_TARGET_S = 30.0
# events/s: what the stack's pair sustains on any machine (tests/chaos/test_chaos.py's).
RATE = 200.0
# Load before the kill: the pair's first batches under it (JIT, Python workers) are behind it.
SETTLE_S = 20.0


@pytest.fixture(scope="module")
def engines(stack_engines, settings: Settings) -> Iterator[SupervisedEngines]:
    engines = only_this_pipeline(settings)
    yield engines
    engines.close()


@pytest.mark.chaos_only
def test_a_warm_spare_becomes_an_engine_killed_9_under_load_in_sync_within_its_bound(
    engines: SupervisedEngines, settings: Settings
) -> None:
    wait_for(
        lambda: bool(warm_spares(settings.spares_dir)), bound(300), "a warm spare on the stack"
    )
    active, _standby = engines.wait_pair(timeout_s=bound(300))
    firsts = inbound_ends(settings)
    load = SteadyLoad(settings, RATE).start()
    try:
        # The pair in step under the load for a while (its first batches under load behind
        # it), so that what follows measures the spare, not a young engine's JIT.
        wait_for(lambda: load.sent >= RATE * SETTLE_S, bound(120), "the load under way")
        active, _standby = engines.wait_pair(timeout_s=bound(120))
        victim = engines.pid(active)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        # supervisord restarts the program; its new process asks the spare, which answers
        # as the engine from its own process (not a new JVM's).
        pid = wait_for(
            lambda: (p := engines.pid(active)) != victim and p,
            bound(60),
            f"engine {active} answering again",
        )
        program = Supervisor(Layout.of(settings)).process(f"engine-{active}").pid
        assert pid != program, (
            f"engine {active} runs in supervisord's program process {program}: started cold, "
            "no warm spare became it"
        )
        # The pair whole again with the victim in it (an in-sync standby, or the active if
        # the lead came back to it).
        wait_for(
            lambda: active in (engines.current_pair() or ()),
            bound(2 * BACK_IN_SYNC_TARGET_S),
            f"engine {active} in sync again",
        )
        back_s = time.monotonic() - killed
    finally:
        sent = load.stop()
    print(f"engine {active} in sync again {back_s:.1f} s after its kill -9, in a warm spare")
    audited = audit_load(engines, firsts, sent, timeout_s=bound(300))
    assert all(f.ok for f in audited.values()), audit_summary(audited)
