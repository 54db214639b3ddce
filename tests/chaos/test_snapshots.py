"""Snapshots an engine must refuse to restore from (damaged, truncated, outrun by the
topic's retention), and the cold rebuild it is left with, on real ZooKeeper, Kafka and
Spark. Its pipeline and engine processes are its own, stopped by pid.

`make chaos` only (`chaos_only`: TWINSTREAM_CHAOS_FULL=1).
"""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from devkit.harness import Pipeline, wait_for
from tests.integration.engines import in_sync, persist, processed
from twinstream.engine import snapshot
from twinstream.platform.kafka import admin_config

pytestmark = [
    pytest.mark.integration,
    pytest.mark.chaos,
    pytest.mark.usefixtures("quiet_stack_engines"),
]


@pytest.mark.chaos_only
def test_damaged_and_expired_snapshots_are_refused_and_cold_still_works(pipeline: Pipeline):
    """`make chaos` only (~45 s of `make test`): damaged, truncated and half-written
    snapshots are refused in tests/unit/engine/test_snapshot.py, a restore the topic's retention
    outran and the cold rebuild chosen instead in tests/unit/ops/test_operate.py. No test of
    `make test` rebuilds an engine cold on the stack: this one and
    tests/chaos/test_standbys.py's preference test do."""
    _a, b = pipeline.start_pair()
    manifests = []
    for _ in range(3):
        pipeline.join_load(pipeline.load(1_000, rate=0))
        wait_for(
            lambda: processed(b) >= pipeline.produced - 1, 120, f"engine {b.engine_id} caught up"
        )
        manifests.append(persist(b))
    oldest, middle, newest = (pipeline.settings.snapshot_dir / m["snapshot_id"] for m in manifests)
    # A file of the state store: a snapshot (.zip) or, with changelog checkpointing, the
    # changelog of a batch (.changelog).
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

    assert b.post("/pipeline/restore", {"snapshot": "latest"}).status_code == 409  # running
    assert b.post("/pipeline/stop").status_code == 200
    truncated = b.post("/pipeline/restore", {"snapshot": newest.name})
    assert truncated.status_code == 422
    assert "damaged or truncated" in truncated.json()["reason"]
    assert state_file.name in truncated.json()["reason"]
    flipped = b.post("/pipeline/restore", {"snapshot": middle.name})
    assert flipped.status_code == 422
    assert "buffer.jsonl has sha256" in flipped.json()["reason"]

    # Kafka deletes what the only valid snapshot would replay: `latest` picks it and refuses.
    admin = AdminClient(admin_config(pipeline.settings))
    cut = manifests[0]["next_offset"] + 10
    (future,) = admin.delete_records(
        [TopicPartition(pipeline.settings.inbound_topic, 0, cut)]
    ).values()
    future.result()
    expired = b.post("/pipeline/restore", {"snapshot": "latest"})
    assert expired.status_code == 422
    reason = expired.json()["reason"]
    assert oldest.name in reason, reason
    assert f"starts at {cut}" in reason, reason
    assert "cold" in reason, reason
    assert b.get("/pipeline")["state"] == "stopped"

    cold = b.post("/pipeline/restore", {"snapshot": "cold"})
    assert cold.status_code == 200, cold.text
    assert cold.json()["next_offset"] == cut
    pipeline.join_load(pipeline.load(500, rate=0))
    wait_for(lambda: in_sync(b), 180, f"engine {b.engine_id} in sync after a cold rebuild")
    wait_for(lambda: processed(b) >= pipeline.produced - 1, 120, f"engine {b.engine_id} caught up")
    assert b.get("/pipeline")["restored_from"] == "cold"
    assert b.role() == "standby"
