"""The retention rule on a table of cases, each boundary included."""

from __future__ import annotations

import dataclasses

import pytest

from twinstream.ops.retention import FAIL, OK, WARN, Facts, TopicFacts, evaluate, retention_fixes

HOUR = 3_600_000
GOOD = {
    "retention.ms": str(7 * 24 * HOUR),
    "min.insync.replicas": "2",
    "unclean.leader.election.enable": "false",
    "segment.ms": str(24 * HOUR),
}


def facts(configs: dict[str, str] | None = None, **changes) -> Facts:
    """Good facts, with the inbound topic's `configs` and any field replaced."""
    base = Facts(
        inbound=TopicFacts("hm.in", {**GOOD, **(configs or {})}, 1, 3),
        outbound=TopicFacts("hm.out", dict(GOOD), 1, 3),
        window_retention_ms=HOUR,
        persist_interval_ms=15 * 60_000,
        restore_margin_ms=HOUR,
        audit_interval_ms=10 * 60_000,
        inbound_bytes_per_s=1000.0,
        single_broker_dev=False,
        bootstrap_servers="k:9092",
        inbound_log_start=100,
        newest_snapshot="s1",
        newest_snapshot_next_offset=150,
    )
    return dataclasses.replace(base, **changes)


def status(report, name: str):
    (check,) = [c for c in report.checks if c.name == name]
    return check.status


REQUIRED = HOUR + 15 * 60_000 + HOUR  # window + persist interval + margin


@pytest.mark.parametrize(
    ("retention_ms", "expected"),
    [
        (REQUIRED - 1, FAIL),
        (REQUIRED, FAIL),  # strictly greater
        (REQUIRED + 1, OK),
        (-1, OK),  # unlimited
    ],
)
def test_inbound_retention_must_exceed_window_plus_persist_plus_margin(retention_ms, expected):
    report = evaluate(facts({"retention.ms": str(retention_ms), "segment.ms": str(HOUR)}))
    assert status(report, "inbound retention.ms") == expected


def test_a_failed_check_names_setting_values_and_the_fix_command():
    report = evaluate(facts({"retention.ms": str(HOUR), "segment.ms": str(HOUR)}))
    (check,) = [c for c in report.failed if c.name == "inbound retention.ms"]
    line = check.line()
    assert "retention.ms=3600000 ms (1.00 h)" in line
    assert f"> {REQUIRED} ms" in line
    assert (
        "kafka-configs.sh --bootstrap-server k:9092 --entity-type topics --entity-name hm.in "
        f"--alter --add-config retention.ms={REQUIRED + 1}"
    ) in line


@pytest.mark.parametrize(
    ("retention_bytes", "segment_bytes", "rate", "expected"),
    [
        (-1, 1 << 30, 1000.0, OK),
        # 1000 B/s for REQUIRED (8,100 s) needs 8,100,000 bytes beyond one segment of 1 MB.
        (8_100_000 + 1_000_000 + 1, 1_000_000, 1000.0, OK),
        (8_100_000 + 1_000_000, 1_000_000, 1000.0, FAIL),
        (20_000_000, 1_000_000, 3000.0, FAIL),
        (5_000_000, 8_000_000, 1.0, FAIL),  # one segment is larger than the limit
        (10_000_000, 1_000_000, None, WARN),  # idle: unknowable
    ],
)
def test_retention_bytes_less_one_segment_must_cover_the_time_at_the_measured_rate(
    retention_bytes, segment_bytes, rate, expected
):
    report = evaluate(
        facts(
            {"retention.bytes": str(retention_bytes), "segment.bytes": str(segment_bytes)},
            inbound_bytes_per_s=rate,
        )
    )
    assert status(report, "inbound retention.bytes") == expected


@pytest.mark.parametrize(
    ("segment_ms", "expected"), [(7 * 24 * HOUR, OK), (7 * 24 * HOUR + 1, FAIL)]
)
def test_segments_may_not_outlive_the_retention(segment_ms, expected):
    report = evaluate(facts({"segment.ms": str(segment_ms)}))
    assert status(report, "inbound segment.ms") == expected


def test_topic_shape_partitions_replication_unclean_election():
    many = dataclasses.replace(facts().inbound, partitions=3)
    assert status(evaluate(facts(inbound=many)), "inbound partitions") == FAIL
    thin = dataclasses.replace(facts().inbound, replication_factor=2)
    assert status(evaluate(facts(inbound=thin)), "hm.in replication") == FAIL
    isr = evaluate(facts({"min.insync.replicas": "1"}))
    assert status(isr, "hm.in replication") == FAIL
    dev = evaluate(facts({"min.insync.replicas": "1"}, single_broker_dev=True))
    assert status(dev, "hm.in replication") == WARN
    assert dev.failed == []
    unclean = evaluate(facts({"unclean.leader.election.enable": "true"}))
    assert status(unclean, "hm.in unclean.leader.election.enable") == FAIL


@pytest.mark.parametrize(
    ("out_ms", "expected"), [(20 * 60_000 - 1, FAIL), (20 * 60_000, OK), (-1, OK)]
)
def test_outbound_retention_must_cover_two_audits(out_ms, expected):
    outbound = TopicFacts("hm.out", {**GOOD, "retention.ms": str(out_ms), "segment.ms": "1"}, 1, 3)
    assert status(evaluate(facts(outbound=outbound)), "outbound retention.ms") == expected


@pytest.mark.parametrize(
    ("next_offset", "log_start", "expected"),
    [(100, 100, OK), (99, 100, FAIL), (None, 0, WARN)],
)
def test_the_newest_snapshot_must_still_be_restorable(next_offset, log_start, expected):
    report = evaluate(
        facts(
            newest_snapshot=None if next_offset is None else "s1",
            newest_snapshot_next_offset=next_offset,
            inbound_log_start=log_start,
        )
    )
    assert status(report, "newest snapshot restorable") == expected


def test_everything_good_passes_and_fixes_cover_only_retention():
    assert evaluate(facts()).failed == []
    bad = facts({"retention.ms": str(HOUR), "segment.ms": str(HOUR), "retention.bytes": "10"})
    bad = dataclasses.replace(
        bad,
        outbound=TopicFacts("hm.out", {**GOOD, "retention.ms": "60000", "segment.ms": "1"}, 1, 3),
    )
    fixes = retention_fixes(bad, evaluate(bad))
    assert fixes == {
        "hm.in": {"retention.ms": str(REQUIRED + 1), "retention.bytes": "-1"},
        "hm.out": {"retention.ms": str(20 * 60_000)},
    }


def test_the_topics_must_have_the_configured_partitions():
    three = dataclasses.replace(
        facts(),
        inbound=TopicFacts("hm.in", dict(GOOD), 3, 3),
        outbound=TopicFacts("hm.out", dict(GOOD), 3, 3),
    )
    assert status(evaluate(dataclasses.replace(three, partitions=3)), "inbound partitions") == OK
    # The settings say one partition, the topics have three: every output would go astray.
    assert status(evaluate(three), "inbound partitions") == FAIL
    # The outbound topic with fewer partitions than the inbound one.
    lopsided = dataclasses.replace(three, partitions=3, outbound=TopicFacts("hm.out", GOOD, 1, 3))
    assert status(evaluate(lopsided), "inbound partitions") == FAIL


def test_with_partitions_the_snapshot_must_be_restorable_in_each_of_them():
    three = facts(
        newest_snapshot_next_offsets={0: 500, 1: 90, 2: 700},
        inbound_log_starts={0: 100, 1: 100, 2: 100},
        partitions=3,
    )
    (check,) = [c for c in evaluate(three).checks if c.name == "newest snapshot restorable"]
    assert check.status == FAIL
    assert "(partition 1)" in check.message
    assert check.current == "0:500, 1:90, 2:700"
    fine = dataclasses.replace(three, newest_snapshot_next_offsets={0: 500, 1: 100, 2: 700})
    assert status(evaluate(fine), "newest snapshot restorable") == OK
