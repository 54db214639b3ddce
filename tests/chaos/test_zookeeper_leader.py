"""The ZooKeeper ensemble's leader killed under load: the engines on a ZooKeeper ensemble
under a chroot, brought by the test (the stack's renderers, see twinstream.testing), so the
shared stack stays whole; Kafka is the stack's. On a Spark standalone cluster:
tests/chaos/test_standalone.py.

`make chaos` only (`chaos_only`: TWINSTREAM_CHAOS_FULL=1), a scenario of minutes (140 s on
two cores at pace 2.26: an ensemble's start, a pair's, a leader election under load). In
`make test`: a session SUSPENDED and LOST, and won again, is tests/unit/core/test_election.py's.
"""

from __future__ import annotations

import pytest

from devkit.harness import Pipeline, wait_for
from devkit.zookeeper import Ensemble
from tests.integration.engines import assert_exactly_once_and_as_reference, published
from twinstream.core.election import zk_client

pytestmark = [
    pytest.mark.integration,
    pytest.mark.chaos,
    pytest.mark.usefixtures("quiet_stack_engines"),
]

CHROOT = "/tenant-a/twinstream-test"


@pytest.mark.chaos_only
def test_the_zookeeper_leader_killed_under_load_one_active_no_gap_no_duplicate(
    pipeline: Pipeline, tmp_path
):
    with Ensemble(pipeline.settings, tmp_path / "zookeeper") as zk:
        # Every server and a chroot that does not exist yet: the engines create it.
        env = {"TWINSTREAM_ZK_CONNECT": f"{zk.connect}{CHROOT}"}
        a, b = pipeline.start_pair(env, env)
        load = pipeline.load(25_000, rate=1000)
        try:
            wait_for(lambda: published(a) >= 2000, 90, "the active publishing under load")
            leader = zk.leader()
            assert leader is not None
            zk.kill9(leader)
            successor = wait_for(
                lambda: (n := zk.leader()) is not None and n != leader and n,
                60,
                "the ensemble's new leader",
            )
            zk.start_server(leader)
            engines = (a, b)
            # Sessions may have expired meanwhile: whoever leads now, one engine does.
            wait_for(
                lambda: [e.role() for e in engines].count("active") == 1,
                60,
                "one active engine after the ZooKeeper leader's death",
            )
        finally:
            pipeline.stop_load(load)
        pipeline.wait_published(pipeline.produced - 1, timeout_s=180)
        roles = sorted(str(e.role()) for e in (a, b))
        assert roles == ["active", "standby"], roles
        assert_exactly_once_and_as_reference(pipeline, pipeline.produced)
        # The election lives under the chroot, which the engines created.
        client = zk_client(pipeline.settings.zookeeper(), hosts=zk.connect)
        client.start(timeout=15)
        try:
            election = f"{CHROOT}/twinstream/{pipeline.settings.pipeline}/election"
            assert len(client.get_children(election)) == 2
        finally:
            client.stop()
            client.close()
        print(f"ZooKeeper leader {leader} killed; node {successor} leads now")
        # Stopped while their ensemble still answers: after it, each engine's shutdown
        # waits for a ZooKeeper that is gone (23 s of make test).
        pipeline.discard()
