"""Replicas that prove they agree (issue 38): a standby compares its rows with the active's
published ones, range by range (twinstream.core.agreement). The pipeline is
pipelines/skewed.py: every 1,000th msg_id's row carries the id of the engine that computed
it, as a transform reading the wall clock or `random` would differ."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from devkit.harness import EngineProcess, Pipeline, coverage, ranges, wait_for
from devkit.pace import bound
from pipelines.skewed import EVERY
from tests.integration.engines import published
from twinstream.ops.operate import OperateError, agreement_verdict, observe

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("quiet_stack_engines")]

LOAD = 2_500
RATE = 500


def agreeing(engine: EngineProcess) -> dict[str, Any] | None:
    info: dict[str, Any] = engine.get("/pipeline")["agreement"]
    return info if info["state"] == "agrees" else None


def test_a_standby_that_computes_other_rows_says_where_and_never_leads(stack_env, tmp_path):
    """The standby reports its disagreement at the first skewed msg_id, with both rows,
    within seconds of the active publishing it; kill -9 of the active then leaves the
    pipeline without an active rather than let the disagreeing standby lead, until an
    operator overrides it: then it takes over and every offset is published once."""
    # Cold engines: skewed tells them apart by their Spark application's name, which a
    # warm spare's session keeps as its own ("twinstream-spare") whatever engine it becomes.
    pipeline = Pipeline(stack_env, tmp_path, module="pipelines.skewed", warm_spares=False)
    try:
        active, standby = pipeline.start_pair()
        first = pipeline.produced
        skewed = first + (EVERY - 1 - first % EVERY) % EVERY
        load = pipeline.load(LOAD, rate=RATE)

        wait_for(lambda: published(active) >= skewed, 60, f"msg_id {skewed} published")
        seen_published = time.monotonic()

        def disagreement():
            info = standby.get("/pipeline")["agreement"]
            return info if info["state"] == "disagrees" else None

        agreement = wait_for(disagreement, 30, "the standby reporting its disagreement", 0.2)
        reported_s = time.monotonic() - seen_published
        print(f"disagreement at msg_id {skewed} reported {reported_s:.1f} s after its publish")
        assert reported_s < bound(10), (reported_s, bound(10))
        found = agreement["difference"]
        assert found["msg_id"] == skewed, found
        assert found["first"] <= skewed <= found["last"], found
        assert [json.loads(r["value"])["engine"] for r in found["active_rows"]] == [
            active.engine_id
        ]
        assert [json.loads(r["value"])["engine"] for r in found["engine_rows"]] == [
            standby.engine_id
        ]
        # Before it, the ranges agreed (the rows equal but every 1,000th).
        assert agreement["ranges_agreed"] >= 1, agreement
        # The audit DAG's `agreement` task fails naming the msg_id and the range.
        views = [observe(e.client, pipeline.name) for e in (active, standby)]
        with pytest.raises(OperateError) as verdict:
            agreement_verdict(pipeline.name, views)
        where = f"msg_id {skewed} (the active's transaction of msg_id {found['first']}.."
        assert where in str(verdict.value), verdict.value
        assert f"engine {standby.engine_id}" in str(verdict.value), verdict.value
        metrics = standby.get_text("/metrics")
        assert f'twinstream_disagreement_msg_id{{engine="{standby.engine_id}"' in metrics
        assert "twinstream_eligible{" in metrics

        # kill -9 of the active: the disagreeing standby wins the lock and gives it up.
        active.kill9()
        wait_for(
            lambda: "not eligible to lead" in standby.log_path.read_text(),
            30,
            "the standby refusing to lead",
        )
        assert standby.role() == "standby"
        assert standby.get("/pipeline")["takeovers"] == []
        assert pipeline.active() is None

        # The operator decides the standby's rows are good enough: it leads, from the
        # active's last published msg_id on.
        overridden = standby.post("/pipeline/override")
        assert overridden.status_code == 200, overridden.text
        assert overridden.json()["agreement"]["overridden"] is True
        wait_for(lambda: standby.role() == "active", 30, "the overridden standby active")
        pipeline.join_load(load)
        pipeline.wait_published(pipeline.produced - 1)
        missing, duplicated = coverage(pipeline.progress(), pipeline.produced)
        assert ranges(missing) == []
        assert ranges(duplicated) == []
    finally:
        pipeline.discard()
