"""The engines' drivers on a Spark standalone cluster (a master and one worker from pyspark's
own distribution, as `TWINSTREAM_SPARK_STANDALONE=true make up` runs them), brought by the
test (the stack's renderers), so the shared stack stays whole; Kafka is the stack's.

`make chaos` only (`chaos_only`: TWINSTREAM_CHAOS_FULL=1): a cluster's start and two
applications on its one worker take make test about 3 minutes on two cores (178 s in a
fresh clone's run at pace 2.1). In make test, a kill -9 of the active driver in local mode
hands over exactly once in tests/integration/test_engines.py, and the standalone cluster's
master and worker, run from pyspark's own distribution, in tests/unit/stack/test_render.py.
"""

from __future__ import annotations

import httpx
import pytest

from devkit.harness import Pipeline, wait_for
from devkit.spark_cluster import StandaloneCluster
from tests.integration.engines import assert_exactly_once_and_as_reference, published

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("quiet_stack_engines")]


@pytest.mark.chaos_only
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
