"""The stack's Kafka users and each pipeline's ACLs, as twinstream.platform.kafka_auth states
them."""

from __future__ import annotations

import concurrent.futures
import stat
from concurrent.futures import Future

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AclOperation, ResourcePatternType, ResourceType

from twinstream.platform import kafka_auth
from twinstream.platform.kafka_auth import (
    ADMIN_USER,
    Credentials,
    CredentialsError,
    acl_bindings,
    provision,
    users,
)
from twinstream.platform.settings import load_settings


def test_credentials_are_made_once_owner_only_and_extended_for_a_new_pipeline(tmp_path):
    path = tmp_path / "kafka-credentials.json"
    creds, added = Credentials.ensure(path, users(["p"]))
    assert added == [ADMIN_USER, "p-engine", "p-publisher", "p-reader"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again, added = Credentials.ensure(path, users(["p", "q"]))
    assert added == ["q-engine", "q-publisher", "q-reader"]
    assert again.password("p-engine") == creds.password("p-engine")
    assert len(set(again.passwords.values())) == 7
    with pytest.raises(CredentialsError, match="make up"):
        again.password("r-engine")


def test_a_missing_or_damaged_credentials_file_names_the_fix(tmp_path):
    with pytest.raises(CredentialsError, match="run `make up`"):
        Credentials.load(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(CredentialsError, match="not JSON"):
        Credentials.load(bad)
    bad.write_text('{"u": "a\\"b"}')
    with pytest.raises(CredentialsError, match="hex password"):
        Credentials.load(bad)


def _grants(settings):
    return {
        (b.restype, b.name, b.resource_pattern_type, b.principal.removeprefix("User:"), b.operation)
        for b in acl_bindings(settings)
    }


def test_each_role_gets_exactly_what_it_needs(tmp_path):
    s = load_settings(state_dir=tmp_path, pipeline="p", zk_password="x")
    grants = _grants(s)
    topic, literal = ResourceType.TOPIC, ResourcePatternType.LITERAL

    def ops(user, kind, name):
        return {g[4] for g in grants if g[3] == user and g[0] == kind and g[1] == name}

    read = {AclOperation.READ, AclOperation.DESCRIBE}
    # Writes .in, and reads its tail: where the last active publisher adapter stopped.
    assert ops("p-publisher", topic, s.inbound_topic) == read | {AclOperation.WRITE}
    assert {g[1] for g in grants if g[3] == "p-publisher"} == {
        s.inbound_topic,
        f"{s.transactional_id}-publisher",
        "twinstream-publisher-",
    }
    assert ops("p-engine", topic, s.inbound_topic) == read
    assert ops("p-reader", topic, s.inbound_topic) == set()
    for name in (s.outbound_topic, s.dlq_topic, s.progress_topic):
        assert ops("p-engine", topic, name) == read | {AclOperation.WRITE}
        assert ops("p-reader", topic, name) == read
    txn = ResourceType.TRANSACTIONAL_ID
    assert ops("p-engine", txn, s.transactional_id) == {AclOperation.WRITE, AclOperation.DESCRIBE}
    # The publisher adapters' own: an adapter can fence adapters, never an engine.
    assert ops("p-publisher", txn, f"{s.transactional_id}-publisher") == {
        AclOperation.WRITE,
        AclOperation.DESCRIBE,
    }
    assert {(g[1], g[3]) for g in grants if g[0] == txn} == {
        (s.transactional_id, "p-engine"),
        (f"{s.transactional_id}-publisher", "p-publisher"),
    }
    assert all(g[2] == literal for g in grants if g[0] != ResourceType.GROUP)
    groups = {(g[1], g[3]) for g in grants if g[0] == ResourceType.GROUP}
    assert groups == {
        (prefix, user)
        for prefix in ("twinstream-", "spark-kafka-source-")
        for user in ("p-engine", "p-reader")
    } | {("twinstream-publisher-", "p-publisher")}


class _ControllerThatLosesOneRequest:
    """Answers every admin request but the first `lost` ones, which it never answers: a
    request forwarded to a controller that lost its leadership meanwhile."""

    def __init__(self, lost: int) -> None:
        self.lost = lost
        self.calls: list[str] = []

    def _answer(self, name: str, keys: list[object]) -> dict[object, Future[None]]:
        self.calls.append(name)
        futures: dict[object, Future[None]] = {k: Future() for k in keys}
        if self.calls.count(name) > self.lost:
            for future in futures.values():
                future.set_result(None)
        return futures

    def alter_user_scram_credentials(self, upserts: list[object]) -> dict[object, Future[None]]:
        return self._answer("passwords", list(range(len(upserts))))

    def create_acls(self, bindings: list[object], **_: object) -> dict[object, Future[None]]:
        return self._answer("acls", list(range(len(bindings))))


def test_provisioning_asks_again_when_a_request_goes_unanswered_and_names_the_fix(tmp_path):
    settings = load_settings().model_copy(update={"pipeline": "p"})
    creds, _ = Credentials.ensure(tmp_path / "c.json", users(["p"]))
    admin = _ControllerThatLosesOneRequest(lost=1)
    done = provision(admin, [settings], creds, timeout_s=0.05)  # type: ignore[arg-type]
    assert admin.calls == ["passwords", "passwords", "acls", "acls"]
    assert done[0] == "4 users' passwords set"
    with pytest.raises(TimeoutError, match=r"3 times: check that the brokers .*\(make status\)"):
        provision(_ControllerThatLosesOneRequest(lost=3), [settings], creds, timeout_s=0.05)  # type: ignore[arg-type]


def _answers(*outcomes: BaseException | None):
    """An admin request whose n-th submission's future raises outcomes[n] (None: done)."""
    submitted: list[int] = []

    def submit():
        outcome = outcomes[len(submitted)]
        submitted.append(1)
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        if outcome is None:
            future.set_result(None)
        else:
            future.set_exception(outcome)
        return {"request": future}

    return submit, submitted


def test_an_admin_request_failed_in_flight_by_a_starting_cluster_is_asked_again():
    destroyed = KafkaException(KafkaError(KafkaError._DESTROY_BROKER, "handle destroyed"))
    submit, submitted = _answers(destroyed, None)
    kafka_auth._idempotent(submit, "set passwords", timeout_s=1, sleep=lambda _s: None)
    assert len(submitted) == 2


def test_an_admin_request_refused_for_a_reason_is_not_asked_again():
    denied = KafkaException(KafkaError(KafkaError.CLUSTER_AUTHORIZATION_FAILED, "no"))
    submit, submitted = _answers(denied, None)
    with pytest.raises(KafkaException, match="no"):
        kafka_auth._idempotent(submit, "set passwords", timeout_s=1, sleep=lambda _s: None)
    assert len(submitted) == 1


def test_a_cluster_that_stays_unready_fails_the_request_after_its_attempts():
    destroyed = KafkaException(KafkaError(KafkaError._DESTROY_BROKER, "handle destroyed"))
    submit, submitted = _answers(destroyed, destroyed, destroyed)
    with pytest.raises(KafkaException):
        kafka_auth._idempotent(submit, "set passwords", 1, attempts=3, sleep=lambda _s: None)
    assert len(submitted) == 3
