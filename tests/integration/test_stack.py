"""The Docker-free stack, for real: ZooKeeper, three KRaft brokers, topics, Airflow.

Tests run in file order; the last one tears the stack down and checks no process is left.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import psutil
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from devkit.harness import wait_for
from twinstream.edge.feed import publish
from twinstream.edge.reader import read_committed
from twinstream.engine.client import EngineClient
from twinstream.ops import cli
from twinstream.ops.overview import Overview
from twinstream.platform import registry
from twinstream.platform.kafka import (
    admin_config,
    connection,
    describe_topic_configs,
    partition_ends,
    topic_specs,
)
from twinstream.platform.settings import Settings
from twinstream.stack import core, health
from twinstream.stack.layout import Layout
from twinstream.stack.supervisor import Supervisor

pytestmark = pytest.mark.integration


def _records_in(settings, topic):
    """Every partition's high watermark, summed: grows with any record written anywhere."""
    return sum(partition_ends(settings, topic).values())


def in_order_per_partition(settings, topic, starts, values):
    """What `publish` of `values` (unkeyed: any partition) left after `starts`: every value
    back exactly once, and each partition holding its share in the order it was sent."""
    records = list(read_committed(settings, topic, starts, max_records=len(values)))
    records.sort(key=lambda r: (r.partition, r.offset))
    assert sorted(r.raw for r in records) == sorted(values)
    sent_order = {v: i for i, v in enumerate(values)}
    for partition in {r.partition for r in records}:
        mine = [sent_order[r.raw] for r in records if r.partition == partition]
        assert mine == sorted(mine), f"partition {partition} out of order"


@pytest.mark.usefixtures("up_engines")
def test_up_reports_every_service_started(stack, settings):
    assert stack.started_supervisor
    # in, out, dlq and progress of each example
    assert [t.action for t in stack.topics] == ["created"] * 8
    assert core.status(settings, echo=lambda _line: None) == 0


@pytest.mark.usefixtures("up_engines")
def test_up_runs_every_pipeline_of_the_file_each_with_its_own_engines_and_election(
    stack, settings, capsys
):
    assert set(stack.actives) == {"hostmetrics", "payments"}
    assert stack.actives["hostmetrics"] in settings.engine_ids
    assert stack.actives["payments"] in ("c", "d")
    created = {t.topic for t in stack.topics}
    assert {f"payments.{s}" for s in ("in", "out", "dlq", "progress")} <= created
    payments = registry.settings_for(settings, "payments")
    assert sorted(core.engine_roles(payments).values()) == ["active", "standby"]
    # One record through payments: its own engines answer it, on its own topics.
    end = _records_in(settings, payments.outbound_topic)
    progress = _records_in(settings, payments.progress_topic)
    sample = registry.load(payments).sample
    assert sample is not None
    publish(payments, sample(3, 7, 0), key_field=registry.load(payments).partition_by)
    wait_for(
        lambda: _records_in(settings, payments.progress_topic) > progress,
        120,
        "payments' active publishing its first transaction",
    )
    assert _records_in(settings, payments.outbound_topic) >= end
    # `twinstream status` shows every pipeline's engines, one active each, and no problem
    # once each standby holds what its active published. A standby that has not yet taken
    # in payments' first transaction is a problem status names (exit 1), so it is asked
    # again until then, each problem it named kept for the failure's message.
    named: list[list[str]] = []

    def healthy() -> Overview | None:
        capsys.readouterr()
        code = cli.main(["status", "--json"])
        seen = Overview.model_validate_json(capsys.readouterr().out)
        named.append([f"{p.name}: {problem}" for p in seen.pipelines for problem in p.problems])
        return seen if code == 0 else None

    try:
        seen = wait_for(healthy, 60, "twinstream status exiting 0", every_s=1.0)
    except AssertionError as e:
        raise AssertionError(f"{e}; the problems it named last: {named[-1]}") from None
    assert sorted((e.pipeline, e.role) for p in seen.pipelines for e in p.engines) == [
        ("hostmetrics", "active"),
        ("hostmetrics", "standby"),
        ("payments", "active"),
        ("payments", "standby"),
    ]


@pytest.mark.usefixtures("up_engines")
def test_up_runs_the_publisher_adapters_a_pipelines_entry_asks_for(stack, settings, capsys):
    """Issue 37: payments' entry asks for two publisher adapters following a folder
    (tests/conftest.py writes it): `up` runs both under supervisord, one elected active;
    `twinstream status` shows them; a line appended to the folder's file reaches payments'
    inbound topic through the active and payments' engines publish it; each adapter serves
    its /metrics on the port `up` gave it."""
    from tests.conftest import PAYMENTS_SOURCES

    payments = registry.settings_for(settings, "payments")

    def adapters() -> dict[str, str]:
        capsys.readouterr()
        cli.main(["status", "--json"])
        seen = Overview.model_validate_json(capsys.readouterr().out)
        (view,) = [p for p in seen.pipelines if p.name == "payments"]
        return {a.adapter_id: a.role for a in view.adapters}

    roles = wait_for(
        lambda: (r := adapters()) and sorted(r.values()) == ["active", "standby"] and r,
        60,
        "payments' two publisher adapters, one active",
    )
    assert set(roles) == {"payments-1", "payments-2"}
    inbound = _records_in(settings, payments.inbound_topic)
    progress = _records_in(settings, payments.progress_topic)
    sample = registry.load(payments).sample
    assert sample is not None
    lines = list(sample(3, 11, 0))
    source = settings.state_dir / PAYMENTS_SOURCES / "payments-1.jsonl"
    source.write_bytes(b"".join(line + b"\n" for line in lines))
    # Three records and their transaction's marker, at least (keyed: any partitions).
    wait_for(
        lambda: _records_in(settings, payments.inbound_topic) >= inbound + 4,
        60,
        "the active adapter publishing the appended lines",
    )
    wait_for(
        lambda: _records_in(settings, payments.progress_topic) > progress,
        120,
        "payments' engines publishing what the adapter wrote",
    )
    # `up` gave publisher-payments-1 and -2 the first two ports of
    # TWINSTREAM_PUBLISHER_METRICS_PORTS (tests/conftest.py).
    token = {"Authorization": f"Bearer {settings.secret('admin_token')}"}
    for adapter, port in (("payments-1", 28811), ("payments-2", 28812)):
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", headers=token, timeout=10).text
        labels = f'adapter="{adapter}",pipeline="payments"'
        active = 1.0 if roles[adapter] == "active" else 0.0
        assert f"twinstream_publisher_active{{{labels}}} {active}" in text, text
        if active:
            assert f"twinstream_publisher_published_total{{{labels}}} 3.0" in text, text
    assert httpx.get("http://127.0.0.1:28811/metrics", timeout=10).status_code == 401


NO_STANDBY = "no standby could take over"


def _payments_status(capsys) -> tuple[int, Any]:
    """`twinstream status --json`'s exit code and its view of payments."""
    capsys.readouterr()
    code = cli.main(["status", "--json"])
    seen = Overview.model_validate_json(capsys.readouterr().out)
    (view,) = [p for p in seen.pipelines if p.name == "payments"]
    return code, view


def _unprotected_gauge(payments, engine_id: str) -> float | None:
    """The engine's twinstream_unprotected, from its /metrics."""
    token = payments.secret("admin_token")
    with EngineClient.from_settings(payments, engine_id, token, 5.0) as client:
        for line in client.metrics().splitlines():
            if line.startswith("twinstream_unprotected{"):
                return float(line.rsplit(" ", 1)[1])
    return None


@pytest.mark.usefixtures("up_engines")
def test_an_active_with_no_standby_that_could_take_over_is_a_problem_until_one_could(
    stack, settings, capsys
):
    """Issue 49: status was green while the only standby restarted. Payments' standby is
    stopped: within seconds `twinstream status` exits 1 naming it, with how long it has
    lasted, and the active's /metrics says it is unprotected; `twinstream restart` brings
    the standby back, and once it could take over again status is green and the gauge 0."""
    payments = registry.settings_for(settings, "payments")

    def pair() -> dict[str, str] | None:
        roles = core.engine_roles(payments)
        return roles if sorted(roles.values()) == ["active", "standby"] else None

    roles = wait_for(pair, 120, "payments' engines, one active")
    active = next(e for e, role in roles.items() if role == "active")
    standby = next(e for e, role in roles.items() if role == "standby")

    def problem() -> str | None:
        code, view = _payments_status(capsys)
        found = [p for p in view.problems if NO_STANDBY in p]
        assert (code == 1) if found else True, (code, found)
        return found[0] if found else None

    wait_for(lambda: problem() is None, 120, f"payments' standby {standby} in sync")
    Supervisor(Layout.of(settings)).stop(f"engine-{standby}")
    said = wait_for(problem, 15, "status naming payments' stopped standby")
    assert said.startswith(f"no standby could take over from engine {active}")
    assert f"engine {standby} does not answer" in said
    assert "twinstream restart ENGINE" in said
    wait_for(lambda: _unprotected_gauge(payments, active) == 1.0, 15, "twinstream_unprotected 1")
    lasted = wait_for(
        lambda: (p := problem()) is not None and " s (since " in p and p,
        15,
        "status saying how long the active has had no standby",
    )
    assert f"from engine {active} for " in lasted
    assert cli.main(["restart", standby]) == 0
    wait_for(lambda: _payments_status(capsys)[1].problems == [], 240, f"{standby} back, no problem")
    # The active judges from the standings the engines write each second: a second behind.
    wait_for(lambda: _unprotected_gauge(payments, active) == 0.0, 15, "twinstream_unprotected 0")


@pytest.mark.usefixtures("up_engines")
def test_an_optional_member_may_be_absent_or_null_and_is_still_type_checked(stack, settings):
    """Issue 33: a member present on some records only could not be declared (absent it was
    missing_field, null it was wrong_type). payments declares `merchant` optional (a
    transfer has none): on the stack's own payments engines, a payment without one and one
    with null are processed (each passes the spend limit, so each has an alert), and one
    with a number for it is a dead letter naming the member."""
    import base64

    payments = registry.settings_for(settings, "payments")
    contract = registry.load(payments)
    assert "merchant" in contract.optional
    run = uuid.uuid4().hex[:8]
    base: dict[str, object] = {"amount": 6000.0, "currency": "EUR", "ts": "2026-01-01T10:00:00Z"}
    sent: dict[str, dict[str, object]] = {
        "absent": {},
        "null": {"merchant": None},
        "number": {"merchant": 17},
        "present": {"merchant": "m-1"},
    }
    records = {
        kind: {"payment_id": f"{run}-{kind}", "card": f"card-{run}-{kind}", **base, **extra}
        for kind, extra in sent.items()
    }
    starts = {t: partition_ends(settings, t) for t in (payments.outbound_topic, payments.dlq_topic)}
    publish(payments, [json.dumps(r).encode() for r in records.values()], key_field="card")

    def seen() -> tuple[set[str], dict[str, str]] | None:
        alerts = {
            json.loads(r.value)["payment_id"]
            for r in read_committed(
                settings,
                payments.outbound_topic,
                starts[payments.outbound_topic],
                1.0,
                partition=None,
            )
        }
        dead = {}
        for r in read_committed(
            settings, payments.dlq_topic, starts[payments.dlq_topic], 1.0, partition=None
        ):
            letter = json.loads(r.value)
            raw = json.loads(base64.b64decode(letter["raw"]))
            dead[raw["payment_id"]] = letter["reason"]
        mine = {p for p in alerts | set(dead) if p.startswith(run)}
        return (alerts, dead) if len(mine) == len(records) else None

    alerts, dead = wait_for(seen, 120, "payments answering each of 4 records")
    assert {f"{run}-{k}" for k in ("absent", "null", "present")} <= alerts
    assert dead[f"{run}-number"].startswith("wrong_type: merchant is"), dead
    assert not {p for p in dead if p.startswith(run)} - {f"{run}-number"}, dead


def test_kazoo_connects_and_zookeeper_ticks_every_500ms(stack, settings):
    from twinstream.core.election import zk_client

    client = zk_client(settings.zookeeper(), timeout=0.2)
    client.start(timeout=10)
    try:
        path = client.create("/twinstream-test/node", b"x", ephemeral=True, makepath=True)
        assert client.get(path)[0] == b"x"
    finally:
        client.stop()
        client.close()
    conf = health.four_letter_word(settings.bind_host, settings.zk_port, b"conf").decode()
    values = dict(line.split("=", 1) for line in conf.splitlines() if "=" in line)
    assert values["tickTime"] == "500"
    # The floor of session timeouts: a dead engine's session expires within about a second.
    assert values["minSessionTimeout"] == "1000"


def test_topic_configs_are_exactly_as_configured(stack, settings):
    admin = AdminClient(admin_config(settings))
    metadata = admin.list_topics(timeout=10).topics
    expected_retention = {
        settings.inbound_topic: "259200000",
        settings.outbound_topic: "172800000",
        settings.dlq_topic: "432000000",
        settings.progress_topic: "172800000",
    }
    for spec in topic_specs(settings):
        partitions = metadata[spec.name].partitions
        assert len(partitions) == settings.partitions == 3
        assert len(partitions[0].replicas) == 3
        configs = describe_topic_configs(admin, spec.name)
        assert configs["min.insync.replicas"] == "2"
        assert configs["unclean.leader.election.enable"] == "false"
        assert configs["retention.ms"] == expected_retention[spec.name]


def test_ten_thousand_records_with_acks_all_all_come_back(stack, settings):
    topic = settings.inbound_topic
    starts = partition_ends(settings, topic)
    values = [json.dumps({"seq": i, "run": str(uuid.uuid4())}).encode() for i in range(10_000)]
    publish(settings, values)
    in_order_per_partition(settings, topic, starts, values)


def test_airflow_answers_and_loads_the_dags_without_import_errors(stack, settings):
    version = httpx.get(f"{settings.airflow_url}/api/v2/version", timeout=10)
    assert version.status_code == 200
    assert version.json()["version"].startswith("3.3.")

    headers = airflow_headers(settings)

    def dags_loaded():
        r = httpx.get(f"{settings.airflow_url}/api/v2/dags", headers=headers, timeout=10)
        r.raise_for_status()
        return {d["dag_id"] for d in r.json()["dags"]} >= {"platform_health"}

    wait_for(dags_loaded, 120, "the dag-processor to load dags/")
    errors = httpx.get(f"{settings.airflow_url}/api/v2/importErrors", headers=headers, timeout=10)
    errors.raise_for_status()
    assert errors.json()["total_entries"] == 0, errors.json()


def airflow_headers(settings) -> dict[str, str]:
    """The REST API's bearer header, for the admin user `up` made."""
    passwords = json.loads(Layout.of(settings).airflow_password_file.read_text())
    token = httpx.post(
        f"{settings.airflow_url}/auth/token",
        json={"username": "admin", "password": passwords["admin"]},
        timeout=10,
    ).json()["access_token"]
    return {"Authorization": f"Bearer {token}"}


# Per DAG with a form: a hostile value of each Param, and what the refusal must name.
HOSTILE_PARAMS: dict[str, list[tuple[dict[str, Any], str]]] = {
    "audit_output_topic": [
        ({"cursor": "../../../etc/passwd"}, "cursor"),
        ({"cursor": "/tmp/x"}, "cursor"),
        ({"cursor": "mine\n"}, "cursor"),  # "$" of Python's re matches before a final \n
        ({"outbound_topic": "out\n"}, "outbound_topic"),
        ({"outbound_topic": "out; rm -rf /"}, "outbound_topic"),
        ({"dlq_topic": "x" * 300}, "dlq_topic"),
        ({"up_to": "0:5\n"}, "up_to"),
        ({"up_to": "../x"}, "up_to"),
        ({"progress_topic": ["a"]}, "progress_topic"),
        ({"pipeline": "../hostmetrics"}, "pipeline"),
    ],
    "check_kafka_retention": [({"apply_fix": "yes; drop"}, "apply_fix")],
    "failover_drill": [
        ({"pipeline": "nope"}, "pipeline"),
        ({"takeover_timeout_s": -1}, "takeover_timeout_s"),
        ({"rejoin_minutes": 10**12}, "rejoin_minutes"),
        ({"takeover_timeout_s": "60; sleep 999"}, "takeover_timeout_s"),
    ],
    "restore_and_resync": [
        ({"engine": "a/../../b"}, "engine"),
        ({"snapshot": "../../../../etc"}, "snapshot"),
        ({"snapshot": "latest\nx"}, "snapshot"),
        ({"snapshot": "latest\n"}, "snapshot"),
        ({"wait_minutes": 0}, "wait_minutes"),
        ({"force": "true"}, "force"),
        ({"compare_last": 10**9}, "compare_last"),
    ],
}


def test_hostile_params_are_refused_by_airflows_rest_trigger_with_the_reason(stack, settings):
    """The REST API validates a trigger's conf against the DAG's Params: every hostile value
    is refused (400) naming the Param, and no run is created."""
    headers = airflow_headers(settings)
    api = f"{settings.airflow_url}/api/v2/dags"

    def loaded():
        r = httpx.get(api, headers=headers, params={"limit": 100}, timeout=10)
        r.raise_for_status()
        return {d["dag_id"] for d in r.json()["dags"]} >= set(HOSTILE_PARAMS)

    wait_for(loaded, 120, "the dag-processor to load dags/")
    for dag_id, cases in HOSTILE_PARAMS.items():
        for conf, param in cases:
            r = httpx.post(
                f"{api}/{dag_id}/dagRuns",
                headers=headers,
                json={"logical_date": None, "conf": conf},
                timeout=30,
            )
            assert r.status_code == 400, (dag_id, conf, r.status_code, r.text)
            assert param in r.json()["detail"], (dag_id, conf, r.text)
        runs = httpx.get(f"{api}/{dag_id}/dagRuns", headers=headers, timeout=10).json()
        assert runs["total_entries"] == 0, (dag_id, runs)


def test_after_up_one_engine_is_active_and_the_other_standby(stack_engines, settings):
    roles = core.engine_roles(settings)
    assert sorted(roles.values()) == ["active", "standby"], roles
    supervisor = Supervisor(Layout.of(settings))
    for engine_id in settings.engine_ids:
        assert supervisor.process(f"engine-{engine_id}").state == "RUNNING"


def test_the_engines_admin_api_rejects_a_missing_or_wrong_token(
    stack_engines, settings, monkeypatch, capsys
):
    token = (Layout.of(settings).root / "admin-token").read_text().strip()
    assert oct((Layout.of(settings).root / "admin-token").stat().st_mode & 0o777) == "0o600"
    for engine_id in settings.engine_ids:
        url = settings.engine_admin_url(engine_id)
        assert httpx.get(f"{url}/healthz", timeout=5).json() == {"ok": True}
        for method, path in [
            ("GET", "/server"),
            ("GET", "/pipeline"),
            ("GET", "/metrics"),
            ("POST", "/pipeline/stop"),
            ("POST", "/pipeline/start"),
        ]:
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                response = httpx.request(method, f"{url}{path}", headers=headers, timeout=5)
                assert response.status_code == 401, (engine_id, method, path, headers)
                assert "bearer token" in response.json()["reason"]
        good = httpx.get(f"{url}/server", headers={"Authorization": f"Bearer {token}"}, timeout=5)
        assert good.json()["engine_id"] == engine_id
        assert "/pipeline/stop" in httpx.get(f"{url}/openapi.json", timeout=5).json()["paths"]
    # `twinstream status` with a wrong token: one line naming the problem, exit 2.
    capsys.readouterr()
    monkeypatch.setenv("TWINSTREAM_ADMIN_TOKEN", "wrong")
    assert cli.main(["status"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert "every engine refuses the admin token (HTTP 401" in err


def test_zookeeper_refuses_clients_without_twinstreams_credentials(stack_engines, settings):
    """Enforced SASL: a session without credentials (or with wrong ones) can neither read,
    create nor delete any Twinstream node, whatever the node's ACL."""
    from kazoo.exceptions import AuthFailedError, KazooException, SessionClosedRequireSaslError

    from twinstream.core.election import zk_client

    path = settings.election_path
    owner = zk_client(settings.zookeeper())
    owner.start(timeout=10)
    try:
        contenders = owner.get_children(path)
        assert len(contenders) == 2
        node = f"{path}/{contenders[0]}"
        attempts: list[tuple[str, Callable[[KazooClient], object]]] = [
            ("read", lambda c: c.get_children(path)),
            ("read", lambda c: c.get(node)),
            ("create", lambda c: c.create("/twinstream/intruder", b"x")),
            ("create", lambda c: c.create("/intruder", b"x")),
            ("delete", lambda c: c.delete(node)),
            ("write", lambda c: c.set(settings.epoch_path, b"0")),
        ]
        for what, attempt in attempts:
            stranger = KazooClient(hosts=settings.zk_hosts)
            stranger.start(timeout=10)
            try:
                with pytest.raises(SessionClosedRequireSaslError):
                    attempt(stranger)
            finally:
                stranger.stop()
                stranger.close()
            assert owner.exists(node) is not None, what
        assert owner.exists("/twinstream/intruder") is None
        wrong = settings.model_copy(update={"zk_password": "not-the-password"})
        liar = zk_client(wrong.zookeeper(), connection_retry={"max_tries": 0})
        try:
            # kazoo may report the session CONNECTED before the SASL handshake fails; the
            # server then closes it, and no request goes through.
            with contextlib.suppress(
                AuthFailedError, SessionClosedRequireSaslError, KazooTimeoutError
            ):
                liar.start(timeout=10)
            with pytest.raises(KazooException):
                liar.create("/twinstream/liar", b"x")
            with pytest.raises(KazooException):
                liar.get_children(path)
        finally:
            liar.stop()
            liar.close()
    finally:
        owner.stop()
        owner.close()


def test_a_pipeline_node_someone_else_made_is_refused_with_the_fix(stack, settings):
    """A node in Twinstream's place with an ACL Twinstream did not give it (as someone who
    got there first would leave it): the election refuses to start on it, naming the fix."""
    from kazoo.security import make_digest_acl

    from twinstream.core.election import Election, ForeignNodeError, root_acl, zk_client

    squatted = settings.model_copy(update={"pipeline": "squatted"})
    owner = zk_client(settings.zookeeper())
    owner.start(timeout=10)
    home = "/twinstream/squatted"
    try:
        owner.create(home, acl=[make_digest_acl("mallory", "pw", all=True)])
        election = Election(
            owner,
            squatted.election_path,
            squatted.epoch_path,
            "x",
            on_elected=lambda _epoch: None,
            on_step_down=lambda _reason: None,
            on_connection=lambda _ok: None,
            root_acl=root_acl(settings.zookeeper()),
        )
        with pytest.raises(ForeignNodeError, match=f"not readable by us.*deleteall {home}"):
            election.start()
        assert election._thread is None, "the election started on a foreign node"
    finally:
        with contextlib.suppress(Exception):
            owner.delete(home)  # ours cannot (mallory's ACL); the stack's state is dropped
        owner.stop()
        owner.close()


def _deliver(config: dict[str, Any], topic: str) -> KafkaError | None:
    """Produce one record with `config`; the delivery's error (None: written)."""
    errors: list[KafkaError | None] = []
    producer = Producer({**config, "message.timeout.ms": 8000, "log_level": 0})
    try:
        producer.produce(topic, b"x", on_delivery=lambda err, _msg: errors.append(err))
        producer.flush(20)
    finally:
        producer.flush(0)
    assert len(errors) == 1, errors
    return errors[0]


def test_kafka_refuses_clients_without_the_right_credentials(stack, settings):
    """SASL/SCRAM over TLS and ACLs: without credentials, with a wrong password, or as the
    publisher, nobody writes .out or takes the transactional id; the reader cannot read .in;
    each refused by Kafka. The publisher writes .in (the control that the login works)."""
    as_role = {
        role: settings.model_copy(update={"kafka_role": role}) for role in ("publisher", "reader")
    }
    publisher = connection(as_role["publisher"]).librdkafka()
    out = settings.outbound_topic
    assert _deliver(publisher, settings.inbound_topic) is None

    anonymous = connection(settings.model_copy(update={"kafka_security": False})).librdkafka()
    err = _deliver(anonymous, out)
    assert err is not None
    wrong = {**publisher, "sasl.password": "0" * 48}
    err = _deliver(wrong, out)
    assert err is not None
    err = _deliver(publisher, out)
    assert err is not None
    assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err

    fencer = Producer({**publisher, "transactional.id": settings.transactional_id})
    with pytest.raises(KafkaException) as refused:
        fencer.init_transactions(20)
    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED

    reader = Consumer(
        {
            **connection(as_role["reader"]).librdkafka(),
            "group.id": f"twinstream-test-{uuid.uuid4()}",
        }
    )
    try:
        # The reader may not even see .in: the broker answers its metadata request with
        # the refusal (a read never learns a partition of it to fetch from).
        seen = reader.list_topics(settings.inbound_topic, timeout=20).topics
        error = seen[settings.inbound_topic].error
        assert error is not None
        assert error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, error
        # ...while its own topics are open to it.
        assert seen_ok(reader, settings.outbound_topic)
    finally:
        reader.close()


def seen_ok(consumer: Consumer, topic: str) -> bool:
    return consumer.list_topics(topic, timeout=20).topics[topic].error is None


def test_a_second_up_changes_nothing(stack, stack_engines, settings):
    pids_before = {p.name: p.pid for p in Supervisor(Layout.of(settings)).processes()}
    report = core.up(settings, echo=lambda _line: None)
    assert not report.changed, report
    assert {p.name: p.pid for p in Supervisor(Layout.of(settings)).processes()} == pids_before


@pytest.mark.stack_teardown
def test_down_leaves_no_process_of_the_stack(stack, settings):
    """`down` stops every process `up` started, by pid, and `status` then says the stack
    is down (exit 3). That `up` after a `down` works: tests/chaos/test_stack_cycle.py."""
    assert_down_leaves_no_process(settings)


def assert_down_leaves_no_process(settings: Settings) -> None:
    pids = core.stack_pids(settings)
    assert len(pids) >= 6, pids  # supervisord, zookeeper, 3 brokers, airflow (+ children)
    stopped = core.down(settings, echo=lambda _line: None)
    assert set(pids) <= set(stopped)
    alive = [
        pid
        for pid in pids
        if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    ]
    assert alive == [], f"still running after down: {alive}"
    assert core.status(settings, echo=lambda _line: None) == 3


@pytest.fixture(scope="module")
def hostmetrics_outputs(stack, stack_engines, settings) -> dict[int, int]:
    """30 sample records through the stack's hostmetrics engines (their hosts key them to
    all three partitions), all published; where each outbound partition was before them."""
    contract = registry.load(settings)
    assert contract.sample is not None
    out = settings.outbound_topic
    starts = partition_ends(settings, out)
    publish(settings, contract.sample(30, 33, 0), key_field=contract.partition_by)

    def published() -> bool:
        # High watermarks count transaction markers too: count the committed records.
        return len(list(read_committed(settings, out, starts, 1.0, partition=None))) >= 30

    wait_for(published, 180, "the engines publishing an output for each of 30 records")
    return starts


def test_subscribe_writes_every_partition_in_the_declared_columns_and_nothing_else(
    hostmetrics_outputs, settings, tmp_path, capfd
):
    """Issue 33: subscribe read partition 0 only, took its header from the first row (a row
    of another shape lost columns), and librdkafka wrote its connection errors to stderr."""
    import csv

    from twinstream.core.rows import record_text

    starts = hostmetrics_outputs
    out = settings.outbound_topic
    path = tmp_path / "out.csv"
    capfd.readouterr()
    args = ["subscribe", "--pipeline", settings.pipeline, "--output", str(path)]
    from_offsets = ",".join(f"{p}:{o}" for p, o in sorted(starts.items()))
    assert cli.main([*args, "--from-offset", from_offsets]) == 0
    # Nothing but the command's own count: no librdkafka line (fd 2 captured, not sys.stderr).
    assert capfd.readouterr().err.strip() == f"30 records from {out}"
    with path.open(newline="") as handle:
        header, *rows = list(csv.reader(handle))
    assert header == cli.OutputShape.of(registry.load(settings)).header
    assert header[:3] == ["partition", "msg_id", "host"]
    assert len(rows) == 30
    assert {row[0] for row in rows} == {"0", "1", "2"}
    for row in rows:
        cells = dict(zip(header, row, strict=True))
        # The msg_id the transform saw (in the value) is the one the CSV names, as logs do.
        assert cells["msg_id"] == record_text(int(cells["value.msg_id"]))
        assert all(cells[f] != "" for f in ("host", "ts", "window_count")), cells


def test_kafka_config_makes_a_reader_whose_printed_group_prefix_is_the_rule(
    hostmetrics_outputs, settings, capsys
):
    """Issue 33: no client settings for users' own readers; a group id of the user's own
    was refused with GROUP_AUTHORIZATION_FAILED, the prefix rule written nowhere."""
    import re

    capsys.readouterr()
    assert cli.main(["kafka-config", "--pipeline", settings.pipeline, "--role", "reader"]) == 0
    printed = capsys.readouterr().out
    config = dict(
        line.split("=", 1) for line in printed.splitlines() if line and not line.startswith("#")
    )
    found = re.search(r"group\.id must start with (\S+)", printed)
    assert found is not None, printed
    prefix = found.group(1)
    assert config["security.protocol"] == "SASL_SSL"

    refusals = {
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError._AUTHENTICATION,
    }

    def first_answer(group_id: str) -> tuple[bytes | None, KafkaError | None]:
        """The first record a subscribed consumer of .out gets, or its first error."""
        errors: list[KafkaError] = []
        consumer = Consumer({**config, "group.id": group_id, "error_cb": errors.append})
        consumer.subscribe([settings.outbound_topic])
        try:

            def answer() -> tuple[bytes | None, KafkaError | None] | None:
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    return msg.value(), None
                error = msg.error() if msg is not None else None
                # A refusal, not a connection librdkafka retries by itself.
                refused = [e for e in [error, *errors] if e is not None and e.code() in refusals]
                return (None, refused[0]) if refused else None

            found: tuple[bytes | None, KafkaError | None] = wait_for(
                answer, 60, f"a record or a refusal for group {group_id}"
            )
            return found
        finally:
            consumer.close()

    value, error = first_answer(f"{prefix}kafka-config-test-{uuid.uuid4()}")
    assert error is None
    assert value is not None
    value, error = first_answer(f"mine-{uuid.uuid4()}")
    assert error is not None
    assert error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, error


def test_subscribe_with_a_wrong_password_ends_at_once_with_one_line_naming_the_fix(
    stack, settings, tmp_path, capfd, monkeypatch
):
    """Issue 33: a refused login must not read as an empty topic (librdkafka retries it
    forever), nor print librdkafka's lines: one line of the command's own, within seconds."""
    import time

    passwords = json.loads(settings.kafka_credentials_path.read_text())
    passwords[f"{settings.pipeline}-reader"] = "0" * 48
    wrong = tmp_path / "credentials.json"
    wrong.write_text(json.dumps(passwords))
    monkeypatch.setenv("TWINSTREAM_KAFKA_CREDENTIALS_FILE", str(wrong))
    path = tmp_path / "out.csv"
    capfd.readouterr()
    started = time.monotonic()
    assert cli.main(["subscribe", "--pipeline", settings.pipeline, "--output", str(path)]) == 2
    assert time.monotonic() - started < 10  # not the whole metadata budget (15 s)
    captured = capfd.readouterr()
    assert captured.out == ""
    (line,) = captured.err.strip().splitlines()
    assert line.startswith(f"twinstream subscribe: Kafka refuses the login of {settings.pipeline}")
    assert str(wrong) in line
    assert not path.exists()


# --- helper D: remove-pipeline (twinstream.stack.remove) on the real stack -------------------


@pytest.mark.after_broker_restarts
def test_remove_pipeline_deletes_a_throwaway_pipelines_topics_users_znode_and_table(
    stack, settings, tmp_path
):
    """A pipeline that never ran (no engine: cheap) gets what `up` gives one, its topics,
    users and ACLs, plus a znode and folders; remove_pipeline takes it all off the real
    Kafka and ZooKeeper and its table out of the file, and restarts nothing."""
    import tomllib

    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    from twinstream.core.election import zk_client
    from twinstream.platform.kafka_auth import Credentials
    from twinstream.stack.remove import remove_pipeline
    from twinstream.stack.tls import kafka_superuser_config

    path = tmp_path / "pipelines.toml"
    original = settings.pipelines_file.read_text()
    path.write_text(
        original + '\n[throwaway]\nmodule = "nowhere.pipeline"\nengines = ["t9"]\n'
        "admin_ports = [28799]\n"
    )
    mine = settings.model_copy(update={"pipelines_file": path})
    throwaway = registry.settings_for(mine, "throwaway")
    core.provision_kafka(mine, {"throwaway": throwaway}, echo=lambda _line: None)
    zk = zk_client(settings.zookeeper())
    zk.start(timeout=15)
    try:
        zk.ensure_path("/twinstream/throwaway/epoch")
    finally:
        zk.stop()
        zk.close()
    folders = [throwaway.engine_dir("t9") / "checkpoint", throwaway.audit_dir]
    for folder in folders:
        folder.mkdir(parents=True)
        (folder / "f").write_text("x")
    supervisor = Supervisor(Layout.of(settings))
    pids = {p.name: p.pid for p in supervisor.processes()}
    connections = Layout.of(settings).airflow_connections.read_text()

    lines: list[str] = []
    code = remove_pipeline(mine, "throwaway", confirm=lambda _q: True, echo=lines.append)
    assert code == 0, "\n".join(lines)

    admin = AdminClient(kafka_superuser_config(settings))
    topics = {throwaway.inbound_topic, throwaway.outbound_topic, throwaway.dlq_topic}
    wait_for(
        lambda: not topics & set(admin.list_topics(timeout=10).topics),
        30,
        "the throwaway pipeline's topics gone from Kafka's metadata",
    )
    for user in ("throwaway-engine", "throwaway-publisher", "throwaway-reader"):
        # None: any name, any host (the library's types say str only).
        fields: list[Any] = [ResourceType.ANY, None, ResourcePatternType.ANY, f"User:{user}"]
        fields += [None, AclOperation.ANY, AclPermissionType.ANY]
        acls = AclBindingFilter(*fields)
        # A broker applies the controller's ACL deletion from the metadata log, moments
        # later on a loaded machine: polled, as the topics' deletion is.
        wait_for(
            lambda a=acls: admin.describe_acls(a, request_timeout=30).result(timeout=30) == [],  # type: ignore[misc]
            30,
            f"{user}'s ACLs gone",
        )

        # Its SCRAM credentials likewise: a broker that has not applied the deletion yet
        # still describes them (seen once in a full run on a loaded machine).
        def scram_gone(u: str = user) -> bool:
            described: Any = admin.describe_user_scram_credentials([u])
            try:
                described[u].result(timeout=30)
            except KafkaException:
                return True
            return False

        wait_for(scram_gone, 30, f"{user}'s SCRAM credentials gone")
    passwords = Credentials.load(settings.kafka_credentials_path).passwords
    assert not [u for u in passwords if u.startswith("throwaway-")]
    zk = zk_client(settings.zookeeper())
    zk.start(timeout=15)
    try:
        assert zk.exists("/twinstream/throwaway") is None
        assert zk.exists(settings.election_path) is not None  # the stack's own stays
    finally:
        zk.stop()
        zk.close()
    assert not any(folder.exists() for folder in folders)
    assert tomllib.loads(path.read_text()) == tomllib.loads(original)
    # Nothing of the stack restarted, and Airflow's connections were already without it.
    assert {p.name: p.pid for p in supervisor.processes()} == pids
    assert Layout.of(settings).airflow_connections.read_text() == connections
