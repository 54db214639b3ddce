"""The pipeline contract in a local Spark (no stack): the framework's validation in the
JVM gives every hostile record its reason, optional members may be absent or null,
hostmetrics on the contract publishes the same bytes as the first version of the example
did for the same input, and nothing either example's guard publishes fails its audit."""

from __future__ import annotations

import dataclasses
import gzip
import json
from typing import Any

import pytest

from devkit import hostile
from twinstream.contract import Bound, Pipeline
from twinstream.engine.pipeline import warm_up
from twinstream.platform import registry
from twinstream.platform.settings import REPO_ROOT, Settings, load_settings
from twinstream.testing import expect, reference

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


def _host(**changes: Any) -> bytes:
    return json.dumps({**hostile.GOOD, **changes}).encode()


def _payment(card: str, amount: Any, second: int) -> bytes:
    return json.dumps(
        {
            "payment_id": f"edge-{card}-{second}",
            "card": card,
            "merchant": "m-1",
            "amount": amount,
            "currency": "EUR",
            "ts": f"2026-03-01T00:00:{second:02d}Z",
        }
    ).encode()


# Records at the edges of each example's ranges, with what the guard must make of them:
# a reason code, or "" for published. Without the bounds, the negative ones were published
# and failed the audit (hostmetrics' mem_used_sum20 below 0); without the cents check, a
# spend rounded to cents fell below its payment's amount.
EDGES: dict[str, list[tuple[bytes, str]]] = {
    "hostmetrics": [
        (_host(host="edge-neg", mem_used_mb=-5), "out_of_range: mem_used_mb is below 0"),
        (_host(host="edge-neg", cpu_user=-0.5), "out_of_range: cpu_user is below 0"),
        (_host(host="edge-neg", cpu_system=-1.0), "out_of_range: cpu_system is below 0"),
        (_host(host="edge-neg", mem_used_mb=0, cpu_user=0.0), ""),
    ],
    "payments": [
        (_payment("edge-a", -3.5, 0), "out_of_range: amount is not above 0"),
        (_payment("edge-a", 0, 1), "out_of_range: amount is not above 0"),
        (_payment("edge-a", 6000.004, 2), "out_of_range: amount has more than two decimals"),
        (_payment("edge-a", 0.001, 3), "out_of_range: amount has more than two decimals"),
        (_payment("edge-a", 6000.01, 4), ""),  # alone over the limit: spend == amount
        *((_payment("edge-b", 0.01, s), "") for s in range(6)),  # velocity at a cent each
    ],
}


@pytest.mark.parametrize("name", ["hostmetrics", "payments"])
def test_nothing_the_guard_publishes_fails_the_pipelines_own_audit_expectations(name: str):
    """The hostile corpus, the edges above and the pipeline's sample (broken records
    included) through the example's guard and transform: every published row passes the
    example's own expectations (Great Expectations on pandas, as the audit reads them)."""
    settings = load_settings(pipeline=name)
    pipeline = registry.load(settings)
    assert pipeline.sample is not None
    edges = EDGES[name]
    records = [
        *pipeline.sample(300, 5, 25),
        *(c.raw for c in hostile.cases(settings.max_record_bytes)),
        *(raw for raw, _ in edges),
    ]
    rows = reference.run(pipeline, list(enumerate(records)), settings, batches=1)
    by_id: dict[int, list[Any]] = {}
    for row in rows:
        by_id.setdefault(row.msg_id, []).append(row)
    assert sorted(by_id) == list(range(len(records)))
    first_edge = len(records) - len(edges)
    for offset, (raw, reason) in enumerate(edges, start=first_edge):
        kinds = {row.kind for row in by_id[offset]}
        if reason:
            assert kinds == {"dlq"}, (raw, by_id[offset])
            assert json.loads(by_id[offset][0].value)["reason"] == reason
        else:
            assert "dlq" not in kinds, (raw, by_id[offset])
    assert sum(row.kind == "out" for row in rows) > 10
    assert expect.failed(pipeline, rows) == []


def test_an_optional_member_may_be_absent_or_null_and_is_typed_when_present():
    """`amount` only purchases carry: absent or null it reads NULL (no missing_field, no
    wrong_type); present, it is type-checked and bounded; a required member still is."""
    events = Pipeline(
        name="events",
        schema="kind STRING, amount DOUBLE, items BIGINT",
        optional=("amount", "items"),
        bounds={"amount": Bound(min=0, strict_min=True)},
        checks={"out_of_range: a purchase has no amount": "kind <> 'buy' OR amount IS NOT NULL"},
        transform=lambda df: df.select("msg_id", "kind", "amount", "items"),
        key="kind",
        value=["kind", "amount", "items"],
    )
    records = [
        (b'{"kind": "view"}', '{"kind":"view"}'),
        (b'{"kind": "view", "amount": null, "items": null}', '{"kind":"view"}'),
        (b'{"kind": "buy", "amount": 2.5, "items": 3}', '{"kind":"buy","amount":2.5,"items":3}'),
        (b'{"kind": "buy", "amount": 2}', '{"kind":"buy","amount":2.0}'),
        (b'{"kind": "buy"}', "out_of_range: a purchase has no amount"),
        (b'{"kind": "buy", "amount": "2.5"}', "wrong_type: amount is STRING, want double"),
        (b'{"kind": "buy", "amount": -1}', "out_of_range: amount is not above 0"),
        (b'{"kind": "buy", "amount": 1, "items": 2e3}', "wrong_type: items is DOUBLE, want bigint"),
        (b'{"kind": "buy", "amount": 1e400}', "out_of_range: amount is not finite"),
        (b'{"amount": 1}', "missing_field: kind"),
        (b'{"kind": null}', "wrong_type: kind is null"),
    ]
    _assert_each_published_as(events, records)


PAYMENTS_GOLDEN = REPO_ROOT / "tests" / "data" / "payments-golden.jsonl.gz"


def test_payments_keyed_publishes_the_bytes_of_its_apply_in_pandas_version():
    """3,840 records on three partitions as the payments example computed them when it kept
    its windows with applyInPandasWithState (commit 046db3e), in 4 batches: its sample with
    every kind of broken record; 600 cards; and edge cases (the limits to the cent, a window's
    edge to the millisecond, late payments, out-of-order ones, zones, times Spark reads or
    not, amounts up to 1.8e308 whose spend is Infinity, the optional merchant absent or
    null, keys to escape, a card of 2 days). The Keyed step gives the same rows: the same
    kinds, the same keys and values byte for byte, the same dead letters."""
    with gzip.open(PAYMENTS_GOLDEN, "rt", encoding="utf-8") as golden:
        lines = [json.loads(line) for line in golden]
    settings = load_settings(pipeline="payments")
    payments = registry.load(settings)
    assert payments.keyed is not None  # the golden rows come from the other implementation
    records = [(line["offset"], line["raw"].encode("utf-8")) for line in lines]
    partitions = [line["partition"] for line in lines]
    rows = reference.run(payments, records, settings, batches=4, partitions=partitions)
    want = sorted(lines, key=lambda line: (line["partition"], line["offset"]))
    assert [(r.partition, r.msg_id) for r in rows] == [
        (line["partition"], line["offset"]) for line in want
    ]
    for row, line in zip(rows, want, strict=True):
        assert (row.kind, row.key, row.value) == (line["kind"], line["key"], line["value"]), (
            row.partition,
            row.msg_id,
            line["raw"][:200],
        )
    # The golden rows exercise what they claim to: alerts of both rules, dead letters.
    assert {json.loads(r.value)["rule"] for r in rows if r.kind == "out"} == {
        "spend_limit",
        "velocity",
    }
    assert sum(r.kind == "dlq" for r in rows) > 50


def test_an_integer_out_of_its_type_is_out_of_range_never_wrapped():
    """Jackson reads a tinyint of 128 to 255 as a byte that wraps: 128 read -128, and the
    record passed as valid. Every integer type's overflow is out_of_range, its bounds kept."""
    ints = Pipeline(
        name="events",
        schema="t TINYINT, s SMALLINT, i INT, l BIGINT",
        transform=lambda df: df.select("msg_id", "t", "s", "i", "l"),
        key="t",
        value=["t", "s", "i", "l"],
    )

    def record(**members: int) -> bytes:
        return json.dumps({"t": 1, "s": 1, "i": 1, "l": 1, **members}).encode()

    highest = {"t": 127, "s": 32767, "i": 2**31 - 1, "l": 2**63 - 1}
    lowest = {"t": -128, "s": -32768, "i": -(2**31), "l": -(2**63)}
    records = [
        (record(**highest), json.dumps(highest, separators=(",", ":"))),
        (record(**lowest), json.dumps(lowest, separators=(",", ":"))),
        (record(t=128), "out_of_range: t does not fit tinyint"),
        (record(t=255), "out_of_range: t does not fit tinyint"),
        (record(t=-129), "out_of_range: t does not fit tinyint"),
        (record(s=32768), "out_of_range: s does not fit smallint"),
        (record(i=2**31), "out_of_range: i does not fit int"),
        (record(l=2**63), "out_of_range: l does not fit bigint"),
    ]
    _assert_each_published_as(ints, records)


def _assert_each_published_as(pipeline: Pipeline, records: list[tuple[bytes, str]]) -> None:
    """Each (record, want) through the reference run of `pipeline`: `want` is its output's
    value (a JSON text) or its dead letter's reason."""
    rows = reference.run(
        pipeline, list(enumerate(r for r, _ in records)), load_settings(pipeline="events"), 1
    )
    assert len(rows) == len(records)
    for row, (raw, want) in zip(rows, records, strict=True):
        if want.startswith("{"):
            assert (row.kind, row.value) == ("out", want), raw
        else:
            assert row.kind == "dlq", (raw, row.value)
            assert json.loads(row.value)["reason"] == want, raw
