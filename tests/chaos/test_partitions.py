"""Three inbound partitions, on real ZooKeeper, Kafka and Spark: a record is (partition,
offset), its outputs go to the same partition of `.out` / `.dlq`, and partition p of
`.progress` tiles the offsets of inbound partition p.

A pair of engines meets records its transform raises on, in two partitions: the engines
find each by halving the failed batch over every partition, quarantine it by its record id,
dead-letter it, and publish everything else exactly once.

The audit DAG proves each partition of what the quarantine run published (one run, a
module fixture, for the quarantine test and the audit test), and names the ranges of a
broken copy. A lost engine restored through Airflow over three partitions on shared
storage, a scenario of minutes: tests/chaos/test_partitions_restore.py (`make chaos`).

`make chaos` only (`chaos_only`: TWINSTREAM_CHAOS_FULL=1): the quarantine run (a pair's
start and the search's query restarts, 192-222 s of `make test` at pace 1.9-2.0) and the
audit's two Spark jobs (146-172 s). In `make test`: the search of a failed batch, with
several offenders in any partition, is tests/unit/core/test_quarantine.py's; the audit's
windows, cursor and report tests/unit/ops/test_audit.py's, and the pipelines' own audit
expectations run against what the guard publishes in tests/integration/test_contract.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from devkit.harness import EngineProcess, Pipeline, wait_for
from pipelines.hostmetrics.generate import synthetic
from tests.integration.engines import (
    LONG_SESSIONS,
    assert_each_partition_tiled_once,
    load_dag,
    task_states,
)
from twinstream.edge.reader import read_committed
from twinstream.ops import cli
from twinstream.ops.audit import Cursor
from twinstream.platform import storage
from twinstream.platform.kafka import (
    TopicSpec,
    admin_config,
    ensure_topics,
    producer_config,
)
from twinstream.platform.kafka_auth import grant_read
from twinstream.platform.settings import load_settings

pytestmark = [
    pytest.mark.integration,
    pytest.mark.chaos,
    pytest.mark.usefixtures("quiet_stack_engines"),
]

PARTITIONS = 3

# The marker record the fault-injection setting makes the transform raise on.
MARKER = "POISON-7f3a"


@dataclass(frozen=True)
class QuarantineRun:
    """A pair of engines over three partitions, run until they had published everything
    but the marker record their transform raises on."""

    pipeline: Pipeline
    engines: tuple[EngineProcess, EngineProcess]
    pids: set[int]
    poisoned: set[tuple[int, int]]  # the marker record's (partition, offset)
    checkpoints: Path  # where a `file://` URL put the engines' checkpoints


@pytest.fixture(scope="module")
def quarantine_run(
    quiet_stack_engines: None, stack_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[QuarantineRun]:
    """The quarantine scenario's run, whose output both the quarantine test and the audit
    test look at: one run for both (an engine pair's start and its search cost make test
    two minutes), either of them run alone still has it."""
    tmp_path = tmp_path_factory.mktemp("quarantine")
    # Batches of at most 250: the search halves a failed batch down to one record, and
    # after a half passes, the next batch Spark plans fails whole again; a catch-up batch of
    # thousands costs several halvings more (each a restart of the query).
    env = {
        "TWINSTREAM_FAULT_MARKER": MARKER,
        "TWINSTREAM_MAX_OFFSETS_PER_TRIGGER": "250",
        **LONG_SESSIONS,
    }
    # The checkpoints by a `file://` URL, as on HDFS or S3: Spark writes them through
    # Hadoop's file system for the scheme, the engines narrow each failed batch's offsets
    # entry through fsspec's (twinstream.platform.storage), and Spark must then run the
    # narrowed one.
    checkpoints = tmp_path / "shared" / "checkpoints"
    shared = {"TWINSTREAM_CHECKPOINT_ROOT": f"file://{checkpoints}"}
    pipeline = Pipeline(stack_env, tmp_path / "poison", partitions=PARTITIONS, env=shared)
    assert not storage.is_local(pipeline.settings.checkpoint_dir("a"))
    try:
        a, b = pipeline.start_pair(env, env)
        pids = {a.pid, b.pid}
        stream: list[bytes | None] = list(
            synthetic(3_000, max_record_bytes=pipeline.settings.max_record_bytes, seed=5)
        )
        # A record of a host whose key Kafka's partitioner (CRC32 of the key, modulo the
        # partitions) puts in partition 2: host-001 of this seed; its record id is not its
        # offset. One marker: a second search costs ~40 s of restarts and proves nothing
        # more here (several offenders, in any partition: tests/unit/core/test_quarantine.py).
        record = json.loads(stream[2_100] or b"")
        stream[2_100] = json.dumps({**record, "note": MARKER}).encode()
        pipeline.join_load(pipeline.send(stream, rate=1000))
        poisoned = {
            (r.partition, r.offset) for r in pipeline.inbound() if MARKER.encode() in (r.raw or b"")
        }
        assert {p for p, _ in poisoned} == {2}, poisoned
        wait_for(
            lambda: len((a.try_get("/pipeline") or {}).get("quarantined") or []) == 1,
            300,
            "the marker record quarantined",
        )
        # Awaited, not read once: under the search's restarts on two busy cores both
        # engines once lost their sessions at the same moment, and no engine was active.
        active = wait_for(pipeline.active, 60, "an active engine")
        pipeline.wait_caught_up(active, field="published", timeout_s=180)
        yield QuarantineRun(pipeline, (a, b), pids, poisoned, checkpoints)
    finally:
        pipeline.discard()


@pytest.fixture(scope="module")
def three_partition_output(quarantine_run: QuarantineRun) -> Pipeline:
    """What the quarantine run's engines published over three partitions, its engines
    stopped: the audit reads the topics alone, and its Spark jobs get the two cores the
    engines had. A test of the running engines (quarantine_run) must come before any test
    that asks for this, in this module's order."""
    quarantine_run.pipeline.discard()
    return quarantine_run.pipeline


@pytest.mark.chaos_only
def test_a_transform_that_raises_on_a_record_in_any_partition_quarantines_exactly_that_record(
    quarantine_run: QuarantineRun, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
):
    """A bug outside the per-record guard (the fault-injection setting makes the transform
    raise on any batch holding a marker record) used to fail the batch on both engines for
    good. The engines find the marker record themselves, over three partitions, quarantine
    it (the same decision on both, through ZooKeeper), dead-letter it, and publish
    everything else exactly once, as the transform computes it without it; both engines
    stay up."""
    pipeline, (a, b), pids, poisoned = (
        quarantine_run.pipeline,
        quarantine_run.engines,
        quarantine_run.pids,
        quarantine_run.poisoned,
    )
    request.node.twinstream_pipeline = pipeline  # a failure shows the engines' logs
    assert {e.pid for e in (a, b) if e.proc.poll() is None} == pids, (
        "the quarantine run's engines were stopped before this test (three_partition_output "
        "stops them: a test asking for it must come after this one)"
    )
    # Spark's checkpoints are where the URL says, none in the engines' own folders.
    for engine_id in ("a", "b"):
        on_shared = quarantine_run.checkpoints / pipeline.name / engine_id
        assert (on_shared / "commits").is_dir(), on_shared
        assert not (pipeline.settings.engine_dir(engine_id) / "checkpoint").exists()

    s = pipeline.settings
    expected = pipeline.reference_by_position(exclude=poisoned)
    got: dict[tuple[int, int], list[tuple[str, str | None, str]]] = {}
    for record in sorted(pipeline.outputs(), key=lambda r: (r.topic, r.partition, r.offset)):
        assert record.msg_id is not None
        position = (record.partition, record.msg_id)
        if position in poisoned:
            assert record.topic == s.dlq_topic
            reason = json.loads(record.value)["reason"]
            assert reason.startswith("quarantined: "), reason
            assert f"fault injected: a record holds '{MARKER}'" in reason
            assert position not in got  # once
            got[position] = []
            continue
        got.setdefault(position, []).append((record.topic, record.key, record.value))
    assert set(got) == set(expected) | poisoned
    for position, rows in expected.items():
        want = [
            (s.outbound_topic if o.kind == "out" else s.dlq_topic, o.key, o.value) for o in rows
        ]
        assert got.get(position, []) == want, position
    assert_each_partition_tiled_once(pipeline, PARTITIONS)

    for engine in (a, b):

        def running(e: EngineProcess = engine) -> dict[str, Any] | None:
            info = e.get("/pipeline")
            return info if info["state"] == "running" else None

        info = wait_for(running, 60, f"engine {engine.engine_id} running")
        assert {(q["partition"], q["msg_id"]) for q in info["quarantined"]} == poisoned
    labels = f'engine="{a.engine_id}",pipeline="{pipeline.name}"'
    assert f"twinstream_quarantined_offsets{{{labels}}} 1.0" in a.get_text("/metrics")

    # Released through the CLI once "the bug is fixed", named as the CLI lists it.
    for key, value in pipeline.env.items():
        monkeypatch.setenv(key, value)
    partition, offset = max(poisoned)
    released = f"{partition}:{offset}" if partition else str(offset)
    assert cli.main(["quarantine", "release", released]) == 0
    assert cli.main(["quarantine", "release", released]) == 1  # not quarantined now
    wait_for(
        lambda: (
            {(q["partition"], q["msg_id"]) for q in a.get("/pipeline")["quarantined"]}
            == poisoned - {(partition, offset)}
        ),
        30,
        "the release visible in GET /pipeline",
    )


def _last_audit(path: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((path / "last-audit.json").read_text())
    return report


def _copy_outbound(pipeline: Pipeline, target: str, drop: range, repeat: range) -> None:
    """`.out` into `target`, partition for partition, with its headers, without the msg_ids
    in `drop` and with those in `repeat` written twice (in every partition)."""
    settings = pipeline.settings
    ensure_topics(AdminClient(admin_config(settings)), [TopicSpec(target, settings.partitions, 3)])
    producer = Producer(producer_config(settings))
    try:
        for record in read_committed(settings, settings.outbound_topic, partition=None):
            assert record.msg_id is not None
            if record.msg_id in drop:
                continue
            headers: list[tuple[str, str | bytes | None]] = [
                ("msg_id", str(record.msg_id)),
                ("engine_id", record.engine_id),
                ("epoch", str(record.epoch)),
            ]
            for _ in range(2 if record.msg_id in repeat else 1):
                producer.produce(
                    target, record.raw, record.key, partition=record.partition, headers=headers
                )
            producer.poll(0)
    finally:
        assert producer.flush(30) == 0


def _windows(report: dict[str, Any]) -> dict[int, tuple[int, int]]:
    """Each partition's audited msg_ids as (first, end)."""
    return {int(p): (f["first_msg_id"], f["end_msg_id"]) for p, f in report["partitions"].items()}


@pytest.mark.chaos_only
def test_the_audit_proves_each_of_three_partitions_and_names_the_ranges_of_a_broken_copy(
    three_partition_output: Pipeline,
    dag_run_env: Callable[[Pipeline], None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On what the quarantine run's engines published over three partitions, the audit DAG
    proves each partition contiguous on its own and leaves its cursor where it ended in
    each, and a copy of `.out` with the same msg_ids dropped and repeated in every
    partition, audited up to the ends it is told, fails, naming the ranges of each. (Where
    an audit starts and ends is tests/unit/ops/test_audit.py's; the cursor's positions after a
    real audit are asserted here.)

    An audit right after publishing covers every record published (issue 33 point 8): the
    in-flight margin stays at its default, 20,000 msg_ids, far more than these partitions
    hold, and the audit ends where the committed progress records do, not margin below the
    inbound end (which left this whole load unaudited: "nothing to audit below msg_id 0")."""
    pipeline = three_partition_output
    dag_run_env(pipeline)
    # The default margin, said here so that no environment can shrink it to fit the test.
    monkeypatch.setenv("TWINSTREAM_AUDIT_INFLIGHT_MSGS", "20000")
    settings = load_settings()
    dag = load_dag("audit_output_topic")

    ends = pipeline.inbound_ends()
    assert sorted(ends) == list(range(PARTITIONS))
    # Every partition holds past the broken copy's ranges below (keyed by host).
    assert min(ends.values()) > 300, ends
    first = dag.test()
    assert first.state == "success", task_states(first)
    report = _last_audit(settings.audit_dir)
    assert report["up_to"] == "committed"
    assert _windows(report) == {p: (0, end) for p, end in ends.items()}
    for findings in report["partitions"].values():
        assert findings["missing"] == findings["duplicated"] == findings["mismatched"] == []
    assert report["records"] == pipeline.produced
    assert Path(report["data_docs"]).is_file()
    results = json.loads(Path(report["results"]).read_text())
    assert set(results) == {"twinstream_msg_ids", "twinstream_output_values"}
    after_first = Cursor.load(settings.audit_dir / "cursor.json")
    assert {p: after_first.at(p).next_msg_id for p in ends} == ends

    # A copy of .out with msg_ids 100..109 deleted and 200..201 duplicated, in every
    # partition.
    copy = f"{settings.outbound_topic}.copy"
    _copy_outbound(pipeline, copy, drop=range(100, 110), repeat=range(200, 202))
    if settings.kafka_security:
        # Only the pipeline's own outputs are its reader's: an operator auditing another
        # topic grants it (the audit reads as the reader, never as the admin).
        grant_read(AdminClient(admin_config(settings)), settings, copy)
    # Its own cursor, by id: kept in the pipeline's audit folder.
    broken = settings.audit_dir / "cursors" / "copy-audit"
    conf = {
        "outbound_topic": copy,
        "dlq_topic": settings.dlq_topic,
        "progress_topic": settings.progress_topic,
    }
    # Told where to end: each partition's inbound end (the last transaction's boundary).
    up_to = ",".join(f"{p}:{end}" for p, end in sorted(ends.items()))
    failed = dag.test(run_conf={**conf, "cursor": "copy-audit", "up_to": up_to})
    assert failed.state == "failed", task_states(failed)
    # The job ran to its verdict; the verdict failed the run at once, without a retry.
    states = task_states(failed)
    assert (states["each_pipeline.audit_output"], states["each_pipeline.verdict"]) == (
        "success",
        "failed",
    )
    tries = {ti.task_id: ti.try_number for ti in failed.get_task_instances()}
    assert tries["each_pipeline.verdict"] == 1
    report = _last_audit(broken)
    assert report["run_id"] == failed.run_id
    assert not report["ok"]
    assert report["up_to"] == up_to
    assert _windows(report) == {p: (0, end) for p, end in ends.items()}
    # Every offset is in a published transaction (the progress records are intact), but
    # the transactions holding 100..109 and 200..201 no longer have their outputs: named
    # in each partition.
    assert sorted(report["partitions"]) == [str(p) for p in range(PARTITIONS)]
    for findings in report["partitions"].values():
        assert findings["missing"] == findings["duplicated"] == []
        mismatched = findings["mismatched"]
        for lost in (100, 109, 200, 201):
            assert any(a <= lost <= b for a, b in mismatched), (lost, mismatched)
    assert not (broken / "cursor.json").exists()  # a failed audit does not move on
