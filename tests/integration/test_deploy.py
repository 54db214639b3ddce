"""Where the engines run: on a Spark standalone cluster (a master and one worker from
pyspark's own distribution, as `TWINSTREAM_SPARK_STANDALONE=true make up` runs them), and
on a ZooKeeper ensemble under a chroot. Each test brings its own cluster or ensemble (the
stack's renderers, see twinstream.testing), so the shared stack stays whole; Kafka is the
stack's. One module, so that the stack's engines are stopped once for both.
"""

from __future__ import annotations

import httpx
import pytest

from devkit.harness import Pipeline, wait_for
from devkit.spark_cluster import StandaloneCluster
from devkit.zookeeper import Ensemble
from tests.integration.engines import assert_exactly_once_and_as_reference, published
from twinstream.core.election import zk_client

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("quiet_stack_engines")]

CHROOT = "/tenant-a/twinstream-test"


def test_kill_9_of_the_active_driver_on_a_standalone_cluster_loses_and_repeats_nothing(
    pipeline: Pipeline, tmp_path
):
    with StandaloneCluster(pipeline.settings, tmp_path / "spark") as cluster:
        env = {"TWINSTREAM_SPARK_MASTER": cluster.master}
        a, b = pipeline.start_pair(env, env)
        # Both applications run their executors on the cluster's worker, one core each.
        status = httpx.get(f"http://127.0.0.1:{cluster.settings.spark_master_ui_port}/json/")
        apps = status.json()["activeapps"]
        assert len(apps) == 2, apps
        assert all(app["cores"] == 1 for app in apps), apps
        load = pipeline.load(20_000, rate=1000)
        try:
            active = pipeline.active()
            assert active is not None
            wait_for(lambda: published(active) >= 2000, 90, "the active publishing under load")
            standby = b if active is a else a
            active.kill9()
            wait_for(lambda: standby.role() == "active", 30, "the standby taking over")
            after = published(standby)
            wait_for(lambda: published(standby) > after + 1000, 90, "the new active publishing")
        finally:
            pipeline.stop_load(load)
        pipeline.wait_published(pipeline.produced - 1, timeout_s=180)
        assert_exactly_once_and_as_reference(pipeline, pipeline.produced)


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
