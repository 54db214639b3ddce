"""Persist from a standby and restore-and-resync, on real ZooKeeper, Kafka and Spark, with
the Airflow DAGs run by `dag.test()`.

The module's tests share one pipeline of their own (`module_pipeline`, through `pair`):
its engines, started and stopped by pid, are warm for every test after the first. Each
test asks `pair` for both engines running, so any of them runs alone or out of order, only
slower (an engine's start).
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


@pytest.fixture
def pair(module_pipeline: Pipeline) -> Pipeline:
    """The module's pipeline with both engines running, one active and one standby: started
    the first time, and an engine an earlier test killed started again."""
    p = module_pipeline
    if not p.engines:
        p.start_pair()
        return p
    dead = [e for e, proc in p.engines.items() if proc.proc.poll() is not None]
    p.wait_running(*[p.start(e) for e in dead])
    wait_for(p.active, 60, "one engine active")
    p.wait_processed(p.produced - 1, *p.engines.values())
    return p


def longest_pause_of_the_output(pipeline: Pipeline, during: Callable[[Stalls], None]) -> float:
    """While LOAD events arrive at 1,000/s, until the last one is published."""
    load = pipeline.load(LOAD, rate=1000)
    stalls = Stalls(pipeline, pipeline.produced - 1)
    during(stalls)
    pipeline.join_load(load, timeout_s=180)
    pipeline.wait_published(pipeline.produced - 1)
    return stalls.result()


def test_persisting_the_standby_never_pauses_the_output(pair: Pipeline):
    """Three persists from whichever engine is the in-sync standby, under 1,000 events/s:
    the output keeps the rhythm it has without them, and each persist is a valid snapshot,
    later ones further on."""
    pipeline = pair
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

    before = {i.snapshot_id for i in snapshot.list_snapshots(pipeline.settings.snapshot_dir)}
    rhythm = longest_pause_of_the_output(pipeline, lambda _stalls: None)
    longest = longest_pause_of_the_output(pipeline, persist_three_times)
    print(f"the output's longest pause: {rhythm:.2f} s without persists, {longest:.2f} s with")
    # Batches on two shared cores take a few seconds each and vary: same rhythm means no
    # pause longer than half as much again as without persists, or one batch more.
    assert longest <= max(1.5 * rhythm, rhythm + 3.0), (longest, rhythm)
    offsets = [m["next_offset"] for m in manifests]
    assert offsets == sorted(offsets), offsets
    valid = [
        i.snapshot_id
        for i in snapshot.list_snapshots(pipeline.settings.snapshot_dir)
        if i.valid and i.snapshot_id not in before
    ]
    assert sorted(valid) == sorted(m["snapshot_id"] for m in manifests)


def test_the_active_refuses_to_persist_naming_why(pair: Pipeline):
    """A persist is taken from a standby only, so that the active never pauses: the active
    refuses one (409) and says it is the active."""
    active = wait_for(pair.active, 30, "an active engine")
    refused = active.post("/pipeline/persist")
    assert refused.status_code == 409
    assert "active" in refused.json()["reason"]


def test_a_takeover_during_a_persist_waits_for_nothing_and_the_persist_completes(pair: Pipeline):
    """The active is killed -9 while its standby persists under load: the standby takes
    over, the persist completes as the newest snapshot, and every inbound offset is
    published exactly once, as the reference computes it."""
    pipeline = pair
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
