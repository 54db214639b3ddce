"""ensure_topics against a fake AdminClient: create, leave alone, repair, refuse."""

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any, ClassVar, cast

import pytest
from confluent_kafka import KafkaError, KafkaException

from twinstream.platform.kafka import (
    TopicShapeError,
    consumer_config,
    ensure_topics,
    producer_config,
    topic_specs,
    watermarks,
)
from twinstream.platform.settings import load_settings


def _done(value=None, exc=None):
    future: Future[object] = Future()
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(value)
    return future


class FakeAdmin:
    def __init__(self, topics=None, race=False, failures=(), lost_replies=0, stale_lists=0):
        # name -> (partitions, rf, configs)
        self.topics = dict(topics or {})
        self.race = race
        # Error codes the next create_topics calls fail with, one per call.
        self.failures = list(failures)
        # How many create_topics calls take effect but answer with a timeout, as a
        # controller still electing leaders for RF 3 can do.
        self.lost_replies = lost_replies
        # How many list_topics calls after a create still answer without the new topics,
        # as a broker behind the controller's metadata does.
        self.stale_lists = stale_lists
        self.stale: set[str] = set()
        self.created = []
        self.altered = []

    def list_topics(self, timeout=None):
        meta = {}
        hidden = set(self.stale) if self.stale_lists > 0 else set()
        if hidden:
            self.stale_lists -= 1
        for name, (partitions, rf, _) in self.topics.items():
            if name in hidden:
                continue
            parts = {i: SimpleNamespace(replicas=list(range(rf))) for i in range(partitions)}
            meta[name] = SimpleNamespace(partitions=parts)
        return SimpleNamespace(topics=meta)

    def create_topics(self, new_topics, **_):
        if self.failures:
            code = self.failures.pop(0)
            return {t.topic: _done(exc=KafkaException(KafkaError(code))) for t in new_topics}
        result = {}
        lost = self.lost_replies > 0
        self.lost_replies -= 1
        for t in new_topics:
            if t.topic in self.topics:
                err = KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS))
                result[t.topic] = _done(exc=err)
                continue
            self.topics[t.topic] = (t.num_partitions, t.replication_factor, dict(t.config))
            self.stale.add(t.topic)
            if lost:
                err = KafkaException(KafkaError(KafkaError.REQUEST_TIMED_OUT))
                result[t.topic] = _done(exc=err)
            elif self.race:
                err = KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS))
                result[t.topic] = _done(exc=err)
            else:
                self.created.append(t.topic)
                result[t.topic] = _done()
        return result

    def describe_configs(self, resources, **_):
        (resource,) = resources
        configs = self.topics[resource.name][2]
        entries = {k: SimpleNamespace(value=v) for k, v in configs.items()}
        return {resource: _done(entries)}

    def incremental_alter_configs(self, resources, **_):
        (resource,) = resources
        for entry in resource.incremental_configs:
            self.topics[resource.name][2][entry.name] = entry.value
            self.altered.append((resource.name, entry.name, entry.value))
        return {resource: _done()}


@pytest.fixture
def settings(tmp_path):
    return load_settings(pipeline="hostmetrics", state_dir=tmp_path, inbound_retention_ms=3_600_000)


def test_missing_topics_are_created_with_the_configured_shape(settings):
    admin = FakeAdmin()
    changes = ensure_topics(cast(Any, admin), topic_specs(settings))
    assert [c.action for c in changes] == ["created"] * 4
    partitions, rf, configs = admin.topics["hostmetrics.in"]
    assert (partitions, rf) == (1, 3)
    assert configs == {
        "min.insync.replicas": "2",
        "unclean.leader.election.enable": "false",
        "retention.ms": "3600000",
        "segment.ms": "3600000",  # never longer than the retention
    }


def test_a_second_run_changes_nothing(settings):
    admin = FakeAdmin()
    ensure_topics(cast(Any, admin), topic_specs(settings))
    changes = ensure_topics(cast(Any, admin), topic_specs(settings))
    assert [c.action for c in changes] == ["unchanged"] * 4
    assert admin.altered == []


def test_drifted_configs_are_put_back_and_reported(settings):
    admin = FakeAdmin()
    ensure_topics(cast(Any, admin), topic_specs(settings))
    admin.topics["hostmetrics.out"][2]["unclean.leader.election.enable"] = "true"
    changes = ensure_topics(cast(Any, admin), topic_specs(settings))
    assert [c.action for c in changes] == ["unchanged", "updated", "unchanged", "unchanged"]
    assert "unclean.leader.election.enable true -> false" in str(changes[1])
    assert admin.altered == [("hostmetrics.out", "unclean.leader.election.enable", "false")]


def test_topic_created_concurrently_by_someone_else_is_tolerated(settings):
    admin = FakeAdmin(race=True)
    changes = ensure_topics(cast(Any, admin), topic_specs(settings))
    assert [c.action for c in changes] == ["unchanged"] * 4


def test_a_cluster_still_settling_is_retried_until_the_topics_exist(settings):
    admin = FakeAdmin(failures=[KafkaError._DESTROY_BROKER, KafkaError._TRANSPORT])
    sleeps: list[float] = []
    changes = ensure_topics(cast(Any, admin), topic_specs(settings), sleep=sleeps.append)
    assert [c.action for c in changes] == ["created"] * 4
    assert len(sleeps) == 2


def test_a_create_that_timed_out_but_took_effect_is_still_reported_created(settings):
    # What CI once saw: the retry found all the topics present and called them unchanged.
    admin = FakeAdmin(lost_replies=1)
    sleeps: list[float] = []
    changes = ensure_topics(cast(Any, admin), topic_specs(settings), sleep=sleeps.append)
    assert [c.action for c in changes] == ["created"] * 4
    assert len(sleeps) == 1
    again = ensure_topics(cast(Any, admin), topic_specs(settings))
    assert [c.action for c in again] == ["unchanged"] * 4


def test_a_broker_whose_metadata_lags_the_create_is_asked_again(settings):
    # What a fresh stack's `up` once met: a create that timed out but took effect, then
    # listings without the topics (KeyError), and a second create that finds them present.
    admin = FakeAdmin(lost_replies=1, stale_lists=2)
    sleeps: list[float] = []
    changes = ensure_topics(cast(Any, admin), topic_specs(settings), sleep=sleeps.append)
    assert [c.action for c in changes] == ["created"] * 4
    assert len(sleeps) == 2


def test_a_transient_error_past_the_deadline_is_raised(settings):
    admin = FakeAdmin(failures=[KafkaError._DESTROY_BROKER] * 100)
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    with pytest.raises(KafkaException, match="DESTROY_BROKER"):
        ensure_topics(
            cast(Any, admin), topic_specs(settings), 5.0, sleep=sleep, clock=lambda: now[0]
        )
    assert now[0] == 5.0


def test_a_wrong_request_is_not_retried(settings):
    admin = FakeAdmin(failures=[KafkaError.INVALID_REPLICATION_FACTOR])
    sleeps: list[float] = []
    with pytest.raises(KafkaException, match="INVALID_REPLICATION_FACTOR"):
        ensure_topics(cast(Any, admin), topic_specs(settings), sleep=sleeps.append)
    assert sleeps == []


def test_wrong_partition_count_is_refused_not_silently_accepted(settings):
    admin = FakeAdmin({"hostmetrics.in": (3, 3, {})})
    with pytest.raises(TopicShapeError, match=r"3 partition\(s\) x RF 3.*wants 1 x RF 3") as info:
        ensure_topics(cast(Any, admin), topic_specs(settings))
    # The message names both fixes: a stack made with another count must know what to do.
    assert "make clean" in str(info.value)
    assert "`partitions` in the pipelines file" in str(info.value)


def test_client_configs_are_durable_and_transaction_aware(settings):
    producer = producer_config(settings)
    assert producer["acks"] == "all"
    assert producer["enable.idempotence"] is True
    assert producer["bootstrap.servers"] == settings.bootstrap_servers
    consumer = consumer_config(settings, "g")
    assert consumer["isolation.level"] == "read_committed"
    assert consumer["enable.auto.commit"] is False
    assert producer_config(settings, acks="1")["acks"] == "1"


class FlakyConsumer:
    """get_watermark_offsets fails with the given error codes first, then answers."""

    failures: ClassVar[list[int]] = []

    def __init__(self, _config):
        self.closed = False

    def get_watermark_offsets(self, _partition, timeout):
        assert timeout >= 1.0
        if FlakyConsumer.failures:
            raise KafkaException(KafkaError(FlakyConsumer.failures.pop(0)))
        return 3, 42

    def close(self):
        self.closed = True


def test_watermarks_ride_out_a_leader_change_but_not_a_real_error(settings, monkeypatch):
    monkeypatch.setattr("confluent_kafka.Consumer", FlakyConsumer)
    # What a chaos run saw right after the inbound partition's leader was killed.
    FlakyConsumer.failures = [KafkaError._DESTROY_BROKER, KafkaError.NOT_LEADER_FOR_PARTITION]
    sleeps: list[float] = []
    assert watermarks(settings, "t", sleep=sleeps.append) == (3, 42)
    assert len(sleeps) == 2
    # What make test's stack start saw: a fresh consumer whose metadata did not name
    # partition 2 yet of a topic listed with three.
    FlakyConsumer.failures = [KafkaError._UNKNOWN_PARTITION]
    assert watermarks(settings, "t", sleep=sleeps.append, partition=2) == (3, 42)
    assert len(sleeps) == 3
    FlakyConsumer.failures = [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
        watermarks(settings, "t", sleep=sleeps.append)
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    FlakyConsumer.failures = [KafkaError._DESTROY_BROKER] * 100
    with pytest.raises(KafkaException, match="DESTROY_BROKER"):
        watermarks(settings, "t", timeout_s=5.0, clock=lambda: now[0], sleep=sleep)
    assert now[0] == 5.0
