"""Helpers shared by the tests that run engine processes on their own pipelines."""

from __future__ import annotations

from typing import Any

from twinstream.testing.harness import Pipeline, audit, ranges


def load_dag(dag_id: str) -> Any:
    """The DAG as Airflow parses it from its file in dags/, for dag.test()."""
    from airflow.dag_processing.dagbag import DagBag

    from twinstream.config import REPO_ROOT

    bag = DagBag(dag_folder=str(REPO_ROOT / "dags" / f"{dag_id}.py"))
    assert bag.import_errors == {}
    return bag.dags[dag_id]


def task_states(run: Any) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in run.get_task_instances()}


def published(engine) -> int:
    value = engine.get("/pipeline")["last_msg_id_published"]
    return -1 if value is None else int(value)


def processed(engine) -> int:
    value = engine.get("/pipeline")["last_msg_id_processed"]
    return -1 if value is None else int(value)


def assert_exactly_once_and_as_reference(pipeline: Pipeline, total: int):
    outputs = pipeline.outputs()
    result = audit(outputs, pipeline.produced)
    assert ranges(result.missing) == []
    assert ranges(result.duplicated) == []
    expected = pipeline.reference()
    assert len(expected) == total
    for record in outputs:
        assert record.msg_id is not None, f"{record.topic}@{record.offset} has no msg_id header"
        want = expected[record.msg_id]
        topic = (
            pipeline.settings.outbound_topic if want.kind == "out" else pipeline.settings.dlq_topic
        )
        assert (record.topic, record.key, record.value) == (topic, want.key, want.value)
    return outputs
