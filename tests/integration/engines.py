"""Helpers shared by the tests that run engine processes on their own pipelines."""

from __future__ import annotations

import collections
import json
from collections.abc import Mapping
from typing import Any

from devkit.harness import EngineProcess, Pipeline, coverage, ranges

# For engines whose scenario is not a session's expiry: 4 s ZooKeeper sessions. With the
# test stack's 1 s, two engines' first batches on two busy cores missed their heartbeats at
# once, the lead moved, and a drill that had checked which engine leads failed after.
LONG_SESSIONS = {"TWINSTREAM_ZK_SESSION_TIMEOUT_S": "4"}


def load_dag(dag_id: str) -> Any:
    """The DAG as Airflow parses it from its file in dags/, for dag.test()."""
    from airflow.dag_processing.dagbag import DagBag

    from twinstream.platform.settings import REPO_ROOT

    bag = DagBag(dag_folder=str(REPO_ROOT / "dags" / f"{dag_id}.py"))
    assert bag.import_errors == {}
    return bag.dags[dag_id]


def return_value(run: Any, task_id: str) -> Any:
    """What a task of a dag.test() run returned (its XCom)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        xcom = session.scalars(
            XComModel.get_many(
                run_id=run.run_id, dag_ids=run.dag_id, task_ids=task_id, key="return_value"
            )
        ).first()
        assert xcom is not None, f"{task_id} returned nothing"
        return XComModel.deserialize_value(xcom)


def task_states(run: Any) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in run.get_task_instances()}


def published(engine) -> int:
    value = engine.get("/pipeline")["last_msg_id_published"]
    return -1 if value is None else int(value)


def processed(engine) -> int:
    value = engine.get("/pipeline")["last_msg_id_processed"]
    return -1 if value is None else int(value)


def in_sync(engine: EngineProcess) -> bool:
    """Running and in sync, by its own word; False while it does not answer."""
    info = engine.try_get("/pipeline") or {}
    return bool(info.get("in_sync")) and info.get("state") == "running"


def persist(engine: EngineProcess) -> dict[str, Any]:
    """POST /pipeline/persist; the snapshot's manifest."""
    response = engine.post("/pipeline/persist")
    assert response.status_code == 200, response.text
    manifest: dict[str, Any] = response.json()
    return manifest


def assert_exactly_once_and_as_reference(pipeline: Pipeline, total: int, first: int = 0):
    """Every inbound offset from `first` up to `total` is in exactly one published
    transaction (the progress records), and the rows published for each msg_id are exactly
    those of a reference run of the same pipeline, in order (none for a record without
    output). `first`: where a scenario's own records start, on a pipeline that earlier
    scenarios used (the reference still runs over everything before, which is state)."""
    outputs = pipeline.outputs()
    missing, duplicated = coverage(pipeline.progress(), total)
    assert ranges([i for i in missing if i >= first]) == []
    assert ranges([i for i in duplicated if i >= first]) == []
    expected = pipeline.reference()
    assert len(expected) == total
    published: dict[int, list[tuple[str, str | None, str]]] = {}
    for record in sorted(outputs, key=lambda r: (r.topic, r.offset)):
        assert record.msg_id is not None, f"{record.topic}@{record.offset} has no msg_id header"
        published.setdefault(record.msg_id, []).append((record.topic, record.key, record.value))
    s = pipeline.settings
    for msg_id in range(first, total):
        want = [
            (s.outbound_topic if o.kind == "out" else s.dlq_topic, o.key, o.value)
            for o in expected[msg_id]
        ]
        got = published.get(msg_id, [])
        assert got == want, (msg_id, [v[:300] for _, _, v in got], [v[:300] for _, _, v in want])
    return outputs


def assert_tiled_once(pipeline: Pipeline, ends: Mapping[int, int]) -> set[tuple[int, int]]:
    """Partition p of .progress tiles 0..ends[p] - 1 of inbound partition p, each offset in
    exactly one published transaction; returns every (partition, offset)."""
    counts: collections.Counter[tuple[int, int]] = collections.Counter()
    for record in pipeline.progress():
        span = json.loads(record.value)
        counts.update((record.partition, i) for i in range(span["first"], span["last"] + 1))
    wanted = {(p, i) for p, end in ends.items() for i in range(end)}
    assert sorted(wanted - set(counts))[:10] == []
    assert sorted(p for p, c in counts.items() if c > 1)[:10] == []
    return wanted


def published_total(engine: EngineProcess) -> int:
    """Records of every partition the engine knows published (last msg_id + 1 each)."""
    info = engine.try_get("/pipeline") or {}
    return sum(v + 1 for v in (info.get("published") or {}).values())


def assert_each_partition_tiled_once(pipeline: Pipeline, partitions: int) -> set[tuple[int, int]]:
    """Every one of `partitions` inbound partitions got records, and partition p of
    .progress tiles 0..end_p - 1 of it, each offset once; returns every (partition, offset)."""
    ends = pipeline.inbound_ends()
    assert sorted(ends) == list(range(partitions))
    assert all(end > 100 for end in ends.values()), f"a partition got almost nothing: {ends}"
    return assert_tiled_once(pipeline, ends)
