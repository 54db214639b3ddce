"""Snapshots an engine must refuse to restore from (damaged, truncated, outrun by the
topic's retention), and the cold rebuild it is left with, on real ZooKeeper, Kafka and
Spark. The module's tests share one pipeline (`snapshots`: a pair, three snapshots of its
standby, two of them damaged), its engine processes stopped by pid after the last; each
test puts the standby in the state it needs (stopped, or running again), so any of them runs
alone or out of order.

`make chaos` only (`chaos_only`: TWINSTREAM_CHAOS_FULL=1; ~45 s of `make test`): damaged,
truncated and half-written snapshots are refused in tests/unit/engine/test_snapshot.py, a
restore the topic's retention outran and the cold rebuild chosen instead in
tests/unit/ops/test_operate.py, a restore of a running engine in
tests/unit/engine/test_api.py. No test of `make test` rebuilds an engine cold on the stack:
this module and tests/chaos/test_standbys.py's preference test do.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from devkit.harness import EngineProcess, Pipeline, wait_for
from tests.integration.engines import in_sync, persist, processed
from twinstream.engine import snapshot
from twinstream.platform.kafka import admin_config

pytestmark = [
    pytest.mark.integration,
    pytest.mark.chaos,
    pytest.mark.chaos_only,
    pytest.mark.usefixtures("quiet_stack_engines"),
]


@dataclass(frozen=True)
class Snapshots:
    """A pipeline whose standby `b` took three snapshots: the newest with a state file
    truncated, the middle one with a bit of its buffer flipped, the oldest whole."""

    pipeline: Pipeline
    b: EngineProcess
    manifests: list[dict[str, Any]]
    oldest: Path
    middle: Path
    newest: Path
    state_file: Path  # the newest's truncated file

    @property
    def cut(self) -> int:
        """Where the retention outran the oldest snapshot: 10 past its next offset."""
        return int(self.manifests[0]["next_offset"]) + 10


@pytest.fixture(scope="module")
def snapshots(module_pipeline: Pipeline) -> Snapshots:
    pipeline = module_pipeline
    _a, b = pipeline.start_pair()
    manifests = []
    for _ in range(3):
        pipeline.join_load(pipeline.load(1_000, rate=0))
        wait_for(
            lambda: processed(b) >= pipeline.produced - 1,
            120,
            f"engine {b.engine_id} caught up",
        )
        manifests.append(persist(b))
    oldest, middle, newest = (pipeline.settings.snapshot_dir / m["snapshot_id"] for m in manifests)
    # A file of the state store: a snapshot (.zip) or, with changelog checkpointing,
    # the changelog of a batch (.changelog).
    state_file = next(
        p
        for p in sorted((newest / "checkpoint" / "state").rglob("*"))
        if p.suffix in (".zip", ".changelog")
    )
    state_file.write_bytes(state_file.read_bytes()[:10])  # truncated
    buffer_file = middle / snapshot.BUFFER
    data = bytearray(buffer_file.read_bytes())
    data[5] ^= 0x01  # same size, one bit off
    buffer_file.write_bytes(bytes(data))
    return Snapshots(pipeline, b, manifests, oldest, middle, newest, state_file)


def stopped(s: Snapshots) -> EngineProcess:
    """The standby with its query stopped, as a restore needs it."""
    if s.b.get("/pipeline")["state"] != "stopped":
        assert s.b.post("/pipeline/stop").status_code == 200
    return s.b


def outrun(s: Snapshots) -> int:
    """Kafka deletes the inbound records the oldest (the only whole) snapshot would replay
    from (idempotent); where the partition starts now."""
    admin = AdminClient(admin_config(s.pipeline.settings))
    (future,) = admin.delete_records(
        [TopicPartition(s.pipeline.settings.inbound_topic, 0, s.cut)]
    ).values()
    future.result()
    return s.cut


def test_a_running_engine_refuses_a_restore(snapshots: Snapshots):
    b = snapshots.b
    if b.get("/pipeline")["state"] == "stopped":
        assert b.post("/pipeline/start").status_code == 200
    assert b.post("/pipeline/restore", {"snapshot": "latest"}).status_code == 409


def test_a_truncated_or_bit_flipped_snapshot_is_refused_naming_what_is_damaged(
    snapshots: Snapshots,
):
    b = stopped(snapshots)
    truncated = b.post("/pipeline/restore", {"snapshot": snapshots.newest.name})
    assert truncated.status_code == 422
    assert "damaged or truncated" in truncated.json()["reason"]
    assert snapshots.state_file.name in truncated.json()["reason"]
    flipped = b.post("/pipeline/restore", {"snapshot": snapshots.middle.name})
    assert flipped.status_code == 422
    assert "buffer.jsonl has sha256" in flipped.json()["reason"]
    assert b.get("/pipeline")["state"] == "stopped"


def test_a_snapshot_the_retention_outran_is_refused_naming_the_cold_rebuild(
    snapshots: Snapshots,
):
    """`latest` picks the only whole snapshot, whose replay Kafka has deleted: refused,
    naming the snapshot, where the topic starts and the way out (cold)."""
    b = stopped(snapshots)
    cut = outrun(snapshots)
    expired = b.post("/pipeline/restore", {"snapshot": "latest"})
    assert expired.status_code == 422
    reason = expired.json()["reason"]
    assert snapshots.oldest.name in reason, reason
    assert f"starts at {cut}" in reason, reason
    assert "cold" in reason, reason
    assert b.get("/pipeline")["state"] == "stopped"


def test_a_cold_rebuild_starts_where_the_topic_starts_and_reaches_sync(snapshots: Snapshots):
    pipeline = snapshots.pipeline
    b = stopped(snapshots)
    cut = outrun(snapshots)
    cold = b.post("/pipeline/restore", {"snapshot": "cold"})
    assert cold.status_code == 200, cold.text
    assert cold.json()["next_offset"] == cut
    pipeline.join_load(pipeline.load(500, rate=0))
    wait_for(lambda: in_sync(b), 180, f"engine {b.engine_id} in sync after a cold rebuild")
    wait_for(lambda: processed(b) >= pipeline.produced - 1, 120, f"engine {b.engine_id} caught up")
    assert b.get("/pipeline")["restored_from"] == "cold"
    assert b.role() == "standby"
