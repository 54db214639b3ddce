"""Persist from a standby and restore-and-resync, on real ZooKeeper, Kafka and Spark, with
the Airflow DAGs run by `dag.test()`.

Each test runs a pipeline of its own with engine processes it starts and stops by pid.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from devkit.harness import EngineProcess, Pipeline, wait_for
from tests.integration.engines import (
    assert_exactly_once_and_as_reference,
    in_sync,
    persist,
)
from twinstream.engine import snapshot
from twinstream.engine.client import EngineError

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("quiet_stack_engines")]


# Events per measured load: a persist lasts a few seconds, so three of them fit in 15 s
# (loads of 20,000 cost make test ~10 s more).
LOAD = 15_000


class Stalls(threading.Thread):
    """Samples the pipeline's output position (the highest last published msg_id of its
    engines, whichever is active) every 250 ms until it reaches `last`; the longest time
    it stood still meanwhile is the longest pause of the output."""

    def __init__(self, pipeline: Pipeline, last: int) -> None:
        super().__init__(daemon=True)
        self.pipeline = pipeline
        self.last = last
        self.done = threading.Event()
        self.longest = 0.0
        self.start()

    def position(self) -> int:
        published = [
            (e.try_get("/pipeline") or {}).get("last_msg_id_published")
            for e in self.pipeline.engines.values()
            if e.proc.poll() is None
        ]
        return max((p for p in published if p is not None), default=-1)

    def run(self) -> None:
        last = -2
        since = time.monotonic()
        while not self.done.wait(0.25):
            value = self.position()
            now = time.monotonic()
            if value != last:
                last, since = value, now
            self.longest = max(self.longest, now - since)
            if value >= self.last:
                return

    def result(self) -> float:
        self.join(timeout=300)
        self.done.set()
        return self.longest


def _standby(pipeline: Pipeline) -> EngineProcess:
    """The in-sync standby, whichever engine that is now (a ZooKeeper session that expires
    on two busy cores may have swapped the roles). By its own role: an active whose session
    is SUSPENDED for a moment is no `pipeline.active()`, yet still the active."""

    def standby(engine: EngineProcess) -> bool:
        try:
            return engine.client.server().role == "standby"
        except EngineError:
            return False

    def find() -> EngineProcess | None:
        return next(
            (
                e
                for e in pipeline.engines.values()
                if e.proc.poll() is None and standby(e) and in_sync(e)
            ),
            None,
        )

    found: EngineProcess = wait_for(find, 120, "an in-sync standby")
    return found


def test_persisting_the_standby_never_pauses_the_output_and_survives_a_takeover(
    pipeline: Pipeline,
):
    pipeline.start_pair()

    def longest_pause_of_the_output(during: Callable[[Stalls], None]) -> float:
        """While LOAD events arrive at 1,000/s, until the last one is published."""
        load = pipeline.load(LOAD, rate=1000)
        stalls = Stalls(pipeline, pipeline.produced - 1)
        during(stalls)
        pipeline.join_load(load, timeout_s=180)
        pipeline.wait_published(pipeline.produced - 1)
        return stalls.result()

    manifests: list[dict[str, Any]] = []

    def persist_three_times(stalls: Stalls) -> None:
        """A persist after every LOAD / 4 events published, from whichever engine is
        then the in-sync standby."""
        first = stalls.last - LOAD
        for n in range(1, 4):
            target = first + LOAD // 4 * n

            def reached(t: int = target) -> bool:
                return stalls.position() >= t

            wait_for(reached, 120, f"msg_id {target} published")
            manifests.append(persist(_standby(pipeline)))

    rhythm = longest_pause_of_the_output(lambda _stalls: None)
    longest = longest_pause_of_the_output(persist_three_times)
    print(f"the output's longest pause: {rhythm:.2f} s without persists, {longest:.2f} s with")
    # Batches on two shared cores take a few seconds each and vary: same rhythm means no
    # pause longer than half as much again as without persists, or one batch more.
    assert longest <= max(1.5 * rhythm, rhythm + 3.0), (longest, rhythm)
    offsets = [m["next_offset"] for m in manifests]
    assert offsets == sorted(offsets), offsets
    valid = [i for i in snapshot.list_snapshots(pipeline.settings.snapshot_dir) if i.valid]
    assert sorted(i.snapshot_id for i in valid) == sorted(m["snapshot_id"] for m in manifests)
    active = wait_for(pipeline.active, 30, "an active engine")
    refused = active.post("/pipeline/persist")
    assert refused.status_code == 409
    assert "active" in refused.json()["reason"]

    # The active dies while the standby is persisting: the takeover waits for nothing and
    # the persist completes.
    load = pipeline.load(6_000, rate=1000)
    standby = _standby(pipeline)
    active = wait_for(pipeline.active, 30, "an active engine")
    result: dict[str, Any] = {}
    persisting = threading.Thread(target=lambda: result.update(r=standby.post("/pipeline/persist")))
    persisting.start()
    wait_for(
        lambda: (standby.try_get("/pipeline") or {}).get("state") == "persisting",
        30,
        "the persist under way",
        every_s=0.02,
    )
    active.kill9()
    persisting.join(timeout=120)
    assert result["r"].status_code == 200, result["r"].text
    wait_for(lambda: standby.role() == "active", 30, "the standby taking over")
    pipeline.join_load(load)
    pipeline.wait_published(pipeline.produced - 1)
    assert_exactly_once_and_as_reference(pipeline, pipeline.produced)
    latest = snapshot.choose(pipeline.settings.snapshot_dir, pipeline.settings.pipeline, "latest")
    assert latest.snapshot_id == result["r"].json()["snapshot_id"]
