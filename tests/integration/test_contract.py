"""The pipeline contract in a local Spark (no stack): the framework's validation in the
JVM gives every hostile record its reason, and hostmetrics on the contract publishes the
same bytes as the first version of the example did for the same input."""

from __future__ import annotations

import dataclasses
import gzip
import json

import pytest

from twinstream import registry
from twinstream.config import REPO_ROOT, Settings, load_settings
from twinstream.contract import Pipeline
from twinstream.pipeline import warm_up
from twinstream.testing import hostile, reference

GOLDEN = REPO_ROOT / "tests" / "data" / "hostmetrics-golden.jsonl.gz"


@pytest.fixture(scope="module")
def settings() -> Settings:
    return load_settings(pipeline="hostmetrics")


@pytest.fixture(scope="module")
def hostmetrics(settings: Settings) -> Pipeline:
    return registry.load(settings)


def test_hostmetrics_on_the_contract_publishes_the_first_versions_bytes(hostmetrics, settings):
    """3,020 records (synthetic ones with every kind of broken record, and edge cases:
    integers for doubles, exponents, -0.0, unicode and NUL in hosts, out-of-order times, a
    window that expires) as the first version's reference computed them (commit 31b17ce):
    the same outputs byte for byte, the same records dead-lettered."""
    with gzip.open(GOLDEN, "rt", encoding="utf-8") as golden:
        lines = [json.loads(line) for line in golden]
    records = [(i, line["raw"].encode("utf-8")) for i, line in enumerate(lines)]
    rows = reference.run(hostmetrics, records, settings, batches=4)
    assert [r.msg_id for r in rows] == list(range(len(lines)))
    for row, line in zip(rows, lines, strict=True):
        assert row.kind == line["kind"], (row.msg_id, row.value, line["raw"][:200])
        if row.kind == "out":
            assert (row.key, row.value) == (line["key"], line["value"]), row.msg_id


def test_every_hostile_record_gets_its_reason_in_the_jvm(hostmetrics, settings):
    corpus = hostile.cases(settings.max_record_bytes)
    rows = reference.run(hostmetrics, list(enumerate(c.raw for c in corpus)), settings)
    assert len(rows) == len(corpus)
    for row, case in zip(rows, corpus, strict=True):
        if case.expect == "out":
            assert row.kind == "out", (case.name, row.value)
        else:
            reason = json.loads(row.value)["reason"]
            assert row.kind == "dlq", case.name
            assert reason.startswith(f"{case.expect}: "), (case.name, reason)


def test_the_warm_up_runs_the_whole_plan_over_the_pipelines_own_sample(
    hostmetrics, settings, tmp_path
):
    """What an engine runs when its session starts (TWINSTREAM_WARM_UP_RECORDS): every
    sample record through validation and the stateful transform to the driver's rows, in
    a folder of its own; a pipeline without a sample is not warmed."""
    spark = reference.session(settings, hostmetrics)
    # hostmetrics gives one output per valid record, and its sample has no broken ones.
    assert warm_up(spark, settings, hostmetrics, tmp_path / "warm", 300) == 300
    assert {p.name for p in (tmp_path / "warm").iterdir()} == {"source", "checkpoint"}
    unsampled = dataclasses.replace(hostmetrics, sample=None)
    assert warm_up(spark, settings, unsampled, tmp_path / "none", 300) == 0
    assert not (tmp_path / "none").exists()
