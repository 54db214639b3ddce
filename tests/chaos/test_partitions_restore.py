"""A lost engine restored through Airflow, over three partitions on shared storage: `make
chaos` only (`chaos_only`: TWINSTREAM_CHAOS_FULL=1), a scenario of minutes (238 s on two
cores at pace 2.26: a pair's start, a persist, two takeovers and a restore under load).

A pair of engines, its checkpoints and snapshots on storage named by URL (as on HDFS or S3),
meets both failures: kill -9 of the active under load (the standby takes over each
partition after its own last published offset), and an engine whose machine is lost,
restored through Airflow without a person (watch_engines sees it down past the grace
period and triggers restore_and_resync from the newest proven snapshot: the one the
scheduled persist took of its standby, which agreed with the active then), that agrees with
the published output again and then takes over by a second kill -9.
Every (partition, offset) is then in exactly one transaction, the rows those of a
reference run, each key in one partition and its outputs in offset order.
"""

from __future__ import annotations

import collections
import time
from typing import Any

import pytest

from devkit.harness import EngineProcess, Pipeline, wait_for
from tests.integration.engines import (
    LONG_SESSIONS,
    assert_each_partition_tiled_once,
    in_sync,
    load_dag,
    published_total,
    return_value,
    task_states,
)
from twinstream.edge.reader import Record
from twinstream.engine import snapshot
from twinstream.platform import storage

pytestmark = [
    pytest.mark.integration,
    pytest.mark.chaos,
    pytest.mark.usefixtures("quiet_stack_engines"),
]

PARTITIONS = 3
# Load through both takeovers and the restore. Every record of it is replayed by the
# restore (from the snapshot on) and by the reference run at the end: 150/s keeps both
# kills and the restore under load at half the records 300/s gave, for the same proof.
RATE = 150.0
# How long watch_engines lets an engine stay down before it restores it, in this module's
# pipelines (the stack's default is 120 s).
WATCH_GRACE_S = 5
# A restore replaying under load beside an active on two cores: sessions and batches that
# starved heartbeats cannot end (a 1 s session expired twice in one run, and the restoring
# engine, far behind, won the election), as test_pipelines sizes its engines.
SHARED = {**LONG_SESSIONS, "TWINSTREAM_TRIGGER_INTERVAL_MS": "1000"}


def take_over(pipeline: Pipeline, dead: EngineProcess, successor: EngineProcess) -> None:
    wait_for(lambda: in_sync(successor), 120, f"engine {successor.engine_id} in sync")
    dead.kill9()
    wait_for(lambda: successor.role() == "active", 30, f"{successor.engine_id} taking over")
    after = published_total(successor)
    wait_for(lambda: published_total(successor) > after + 300, 60, "new output after takeover")


def assert_exactly_once_per_partition(pipeline: Pipeline) -> list[Record]:
    wanted = assert_each_partition_tiled_once(pipeline, PARTITIONS)
    # The rows: those of a reference run, each in its record's partition.
    outputs = pipeline.outputs()
    expected = pipeline.reference_by_position()
    assert set(expected) == wanted
    got: dict[tuple[int, int], list[tuple[str, str | None, str]]] = {}
    for record in sorted(outputs, key=lambda r: (r.topic, r.partition, r.offset)):
        assert record.msg_id is not None
        got.setdefault((record.partition, record.msg_id), []).append(
            (record.topic, record.key, record.value)
        )
    s = pipeline.settings
    for position, rows in expected.items():
        want = [
            (s.outbound_topic if o.kind == "out" else s.dlq_topic, o.key, o.value) for o in rows
        ]
        assert got.get(position, []) == want, position
    return outputs


def assert_per_key_order(pipeline: Pipeline, outputs: list[Record]) -> None:
    """Each key lives in one partition, and its outputs come in the offsets' order."""
    out = [r for r in outputs if r.topic == pipeline.settings.outbound_topic]
    partitions_of: dict[str | None, set[int]] = collections.defaultdict(set)
    last: dict[str | None, int] = {}
    for record in sorted(out, key=lambda r: (r.partition, r.offset)):
        assert record.msg_id is not None
        partitions_of[record.key].add(record.partition)
        assert record.msg_id > last.get(record.key, -1), (record.key, record.msg_id)
        last[record.key] = record.msg_id
    assert len(partitions_of) > PARTITIONS
    assert {k: p for k, p in partitions_of.items() if len(p) > 1} == {}
    assert len({p for ps in partitions_of.values() for p in ps}) == PARTITIONS


@pytest.mark.chaos_only
def test_a_lost_engine_over_three_partitions_is_restored_by_airflow_and_leads_exactly_once(
    stack_env, tmp_path, dag_run_env
):
    # Checkpoints and snapshots by `file://` URLs, as on HDFS or S3 (twinstream.platform.storage):
    # Spark writes the checkpoints through Hadoop's file system for the scheme; the engines
    # copy and install them, and Airflow's tasks read the snapshots, through fsspec's.
    shared = tmp_path / "shared-storage"
    pipeline = Pipeline(
        stack_env,
        tmp_path / "three",
        partitions=PARTITIONS,
        env={
            "TWINSTREAM_CHECKPOINT_ROOT": f"file://{shared}/checkpoints",
            "TWINSTREAM_SNAPSHOT_ROOT": f"file://{shared}/snapshots",
            "TWINSTREAM_WATCH_GRACE_S": str(WATCH_GRACE_S),
        },
    )
    assert not storage.is_local(pipeline.settings.checkpoint_dir("a"))
    assert not storage.is_local(pipeline.settings.snapshot_dir)
    dag_run_env(pipeline)
    try:
        # (active, standby): either engine id.
        first, second = pipeline.start_pair(active_env=SHARED, standby_env=SHARED)
        # A load longer than the scenario (200 s of it ran out once), stopped when it is done.
        load = pipeline.load(10**6, rate=RATE, hosts=12)
        wait_for(lambda: published_total(first) >= 1_500, 120, "the active publishing")

        # The scheduled persist: a snapshot from the standby, with every partition's
        # position and buffered rows.
        wait_for(lambda: in_sync(second), 120, "the standby in sync")
        persisted = load_dag("persist_standby_state").test()
        assert persisted.state == "success", task_states(persisted)
        manifest = snapshot.choose(pipeline.settings.snapshot_dir, pipeline.name, "latest")
        assert manifest.engine_id == second.engine_id
        assert sorted(manifest.positions()) == list(range(PARTITIONS))
        buffered = snapshot.read_buffer(
            pipeline.settings.snapshot_dir / manifest.snapshot_id / snapshot.BUFFER
        )
        assert {r.partition for r in buffered} == set(range(PARTITIONS))
        assert (shared / "snapshots" / pipeline.name / manifest.snapshot_id).is_dir()

        # kill -9 of the active under load: the standby takes over every partition.
        take_over(pipeline, first, second)

        # The killed engine's machine is lost, its checkpoint with it; it comes back with
        # nothing, says so, and restore_and_resync brings it back from the three-partition
        # snapshot, in sync, its buffer checked against what was published.
        lost = first.engine_id
        # (Its own folder holds only logs here: its checkpoint is on the shared storage.)
        storage.remove_tree(pipeline.settings.engine_dir(lost))
        storage.remove_tree(pipeline.settings.checkpoint_dir(lost))
        assert not pipeline.settings.checkpoint_dir(lost).exists()
        back = pipeline.start(lost, **SHARED)

        def checked() -> dict[str, Any] | None:
            # An engine's admin API answers "stopped", "not started" before it has looked
            # at its checkpoint: wait for its verdict, not for that.
            info = back.try_get("/pipeline") or {}
            return (
                info
                if info.get("state") == "stopped" and info.get("reason") != "not started"
                else None
            )

        reason = wait_for(checked, 120, f"{lost} up, its checkpoint checked")["reason"]
        assert "no checkpoint" in reason, reason
        back.remember_tree()
        # Nobody restores it by hand: watch_engines (its schedule's runs, here one after the
        # other) sees it stopped, and once past the grace period triggers restore_and_resync
        # from the newest proven snapshot (the standby agreed when it persisted). dag.test()
        # runs one DAG's tasks, not the runs it triggers: the run watch_engines asked for is
        # executed here with the conf it gave.
        first_look = load_dag("watch_engines").test()
        # The grace period counts from its look, made before its run ends (counted from
        # before the run, a fresh clone's second look came 4.99 s after the first saw it).
        seen = time.monotonic()
        assert first_look.state == "success", task_states(first_look)
        assert return_value(first_look, "decide") == []  # within the grace period
        wait_for(lambda: time.monotonic() - seen > WATCH_GRACE_S, 30, "the grace period over")
        second_look = load_dag("watch_engines").test()
        [conf] = return_value(second_look, "decide")
        assert conf == {"engine": lost, "snapshot": "proven"}, conf
        assert manifest.proven, manifest.agreement
        restore = load_dag("restore_and_resync").test(run_conf=conf)
        assert restore.state == "success", task_states(restore)
        assert back.get("/pipeline")["restored_from"] == manifest.snapshot_id
        # An in-sync standby that agrees with the published output.
        wait_for(
            lambda: back.get("/pipeline")["agreement"]["state"] == "agrees",
            60,
            f"the restored {lost} agreeing",
        )
        # The restored engine, caught up as the new active's standby, takes over in turn.
        take_over(pipeline, second, back)

        pipeline.stop_load(load)
        pipeline.wait_caught_up(back, field="published", timeout_s=180)
        outputs = assert_exactly_once_per_partition(pipeline)
        assert_per_key_order(pipeline, outputs)
        assert back.get("/pipeline")["uncovered_ranges"] == []
    finally:
        pipeline.discard()
