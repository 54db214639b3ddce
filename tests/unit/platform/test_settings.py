from pathlib import Path

import pytest

from twinstream.platform.settings import DAY_MS, REPO_ROOT, SettingsError, load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    import os

    for key in list(os.environ):
        if key.startswith("TWINSTREAM_"):
            monkeypatch.delenv(key)


def test_defaults_match_the_documented_platform():
    s = load_settings()
    assert s.zk_port == 2181
    assert s.zk_tick_ms == 500
    assert s.kafka_ports == [9092, 9093, 9094]
    assert s.airflow_port == 8080
    # No pipeline of the product's own: an example's name is no default.
    assert (s.pipeline, s.inbound_topic, s.outbound_topic) == ("", "", "")
    named = load_settings(pipeline="orders")
    assert (named.inbound_topic, named.outbound_topic, named.dlq_topic) == (
        "orders.in",
        "orders.out",
        "orders.dlq",
    )
    assert s.replication_factor == 3
    assert s.min_insync_replicas == 2
    assert s.inbound_retention_ms == 7 * DAY_MS
    assert s.state_dir == REPO_ROOT / ".twinstream"
    assert s.bootstrap_servers == "127.0.0.1:9092,127.0.0.1:9093,127.0.0.1:9094"


def test_environment_overrides_including_comma_separated_lists(monkeypatch, tmp_path):
    monkeypatch.setenv("TWINSTREAM_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("TWINSTREAM_KAFKA_PORTS", "19092, 19093")
    monkeypatch.setenv("TWINSTREAM_KAFKA_CONTROLLER_PORTS", "19192,19193")
    monkeypatch.setenv("TWINSTREAM_REPLICATION_FACTOR", "2")
    monkeypatch.setenv("TWINSTREAM_INBOUND_RETENTION_MS", "3600000")
    s = load_settings()
    assert s.state_dir == Path(tmp_path)
    assert s.kafka_ports == [19092, 19093]
    assert s.bootstrap_servers == "127.0.0.1:19092,127.0.0.1:19093"
    assert s.inbound_retention_ms == 3_600_000


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TWINSTREAM_ZK_PORT": "70000"}, "TWINSTREAM_ZK_PORT"),
        ({"TWINSTREAM_ZK_PORT": "nine"}, "TWINSTREAM_ZK_PORT"),
        ({"TWINSTREAM_AIRFLOW_PORT": "9092"}, "ports are used twice: [9092]"),
        ({"TWINSTREAM_KAFKA_CONTROLLER_PORTS": "9192"}, "every node runs one broker"),
        ({"TWINSTREAM_REPLICATION_FACTOR": "4"}, "needs at least that many brokers"),
        ({"TWINSTREAM_MIN_INSYNC_REPLICAS": "3", "TWINSTREAM_REPLICATION_FACTOR": "2"}, "exceeds"),
        (
            {"TWINSTREAM_PIPELINE": "hostmetrics", "TWINSTREAM_OUTBOUND_TOPIC": "hostmetrics.in"},
            "must differ",
        ),
        ({"TWINSTREAM_PIPELINE": "Bad Name"}, "TWINSTREAM_PIPELINE"),
        ({"TWINSTREAM_INBOUND_RETENTION_MS": "10"}, "TWINSTREAM_INBOUND_RETENTION_MS"),
    ],
)
def test_bad_configuration_is_refused_with_the_variable_named(monkeypatch, env, message):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SettingsError, match="invalid Twinstream configuration") as err:
        load_settings()
    assert message in str(err.value)


def test_single_broker_dev_setup_is_recognised(monkeypatch):
    monkeypatch.setenv("TWINSTREAM_KAFKA_PORTS", "9092")
    monkeypatch.setenv("TWINSTREAM_KAFKA_CONTROLLER_PORTS", "9192")
    monkeypatch.setenv("TWINSTREAM_REPLICATION_FACTOR", "1")
    monkeypatch.setenv("TWINSTREAM_MIN_INSYNC_REPLICAS", "1")
    assert load_settings().single_broker_dev


def test_compose_style_service_addresses_override_the_local_ports(monkeypatch):
    monkeypatch.setenv("TWINSTREAM_KAFKA_BOOTSTRAP", "kafka-1:19092,kafka-2:19092")
    monkeypatch.setenv("TWINSTREAM_ZK_CONNECT", "zookeeper:2181")
    s = load_settings()
    assert s.bootstrap_servers == "kafka-1:19092,kafka-2:19092"
    assert s.zk_hosts == "zookeeper:2181"
    assert s.zk_servers == [("zookeeper", 2181)]
    assert s.zk_chroot == ""
    monkeypatch.setenv("TWINSTREAM_ZK_CONNECT", "zookeeper")
    with pytest.raises(SettingsError, match="TWINSTREAM_ZK_CONNECT"):
        load_settings()


def test_a_zookeeper_ensemble_and_a_chroot_are_accepted(monkeypatch):
    monkeypatch.setenv("TWINSTREAM_ZK_CONNECT", "zk1:2181,zk2:2182,zk-3.example:2183/prod/ts")
    s = load_settings()
    # kazoo's connect string as it is: kazoo spreads the session over the servers.
    assert s.zk_hosts == "zk1:2181,zk2:2182,zk-3.example:2183/prod/ts"
    assert s.zk_servers == [("zk1", 2181), ("zk2", 2182), ("zk-3.example", 2183)]
    assert s.zk_chroot == "/prod/ts"
    for bad in ("zk1:2181,", "zk1:2181,zk2", "zk1:2181//x", "zk1:2181/x/"):
        monkeypatch.setenv("TWINSTREAM_ZK_CONNECT", bad)
        with pytest.raises(SettingsError, match="TWINSTREAM_ZK_CONNECT"):
            load_settings()


def test_the_local_stack_runs_one_zookeeper_or_an_odd_ensemble(monkeypatch):
    assert load_settings().zk_hosts == "127.0.0.1:2181"
    monkeypatch.setenv("TWINSTREAM_ZK_NODES", "3")
    s = load_settings()
    assert s.zk_hosts == "127.0.0.1:2181,127.0.0.1:2182,127.0.0.1:2183"
    assert s.zk_peer_ports == [2888, 2889, 2890]
    assert {2182, 2183, 2888, 2890, 3888, 3890} <= set(s.ports)
    monkeypatch.setenv("TWINSTREAM_ZK_NODES", "2")
    with pytest.raises(SettingsError, match="odd number"):
        load_settings()


def test_admin_tls_needs_a_certificate_and_its_key_that_load(monkeypatch, tmp_path):
    from tests.unit.engine.test_api import write_tls_files

    tls = write_tls_files(tmp_path)
    plain = load_settings()
    assert (plain.admin_tls, plain.engine_admin_url("a")) == (False, "http://127.0.0.1:8701")
    monkeypatch.setenv("TWINSTREAM_ADMIN_TLS_CERTFILE", str(tls.cert))
    with pytest.raises(SettingsError, match=r"TWINSTREAM_ADMIN_TLS_KEYFILE is not: .* set both"):
        load_settings()
    monkeypatch.setenv("TWINSTREAM_ADMIN_TLS_KEYFILE", str(tls.ca_key))
    with pytest.raises(SettingsError, match=r"do not load .*: give a PEM certificate and its own"):
        load_settings()
    monkeypatch.setenv("TWINSTREAM_ADMIN_TLS_KEYFILE", str(tls.key))
    served = load_settings()
    assert served.admin_tls
    assert served.engine_admin_url("a") == "https://127.0.0.1:8701"
    monkeypatch.setenv("TWINSTREAM_ADMIN_TLS_CERTFILE", str(tmp_path / "missing.pem"))
    with pytest.raises(
        SettingsError, match=r"TWINSTREAM_ADMIN_TLS_CERTFILE: .*missing\.pem: no such file"
    ):
        load_settings()
    monkeypatch.delenv("TWINSTREAM_ADMIN_TLS_CERTFILE")
    with pytest.raises(SettingsError, match="TWINSTREAM_ADMIN_TLS_KEYFILE is set but"):
        load_settings()


def test_a_client_with_the_ca_alone_reaches_the_engines_over_https(monkeypatch, tmp_path):
    from tests.unit.engine.test_api import write_tls_files

    tls = write_tls_files(tmp_path)
    monkeypatch.setenv("TWINSTREAM_ADMIN_TLS_CAFILE", str(tls.ca))
    client = load_settings()
    assert (client.admin_tls, client.engine_admin_url("b")) == (False, "https://127.0.0.1:8702")
    monkeypatch.setenv("TWINSTREAM_ADMIN_TLS_CAFILE", str(tls.key))
    with pytest.raises(SettingsError, match=r"TWINSTREAM_ADMIN_TLS_CAFILE=.* does not load"):
        load_settings()
    monkeypatch.setenv("TWINSTREAM_ADMIN_TLS_CAFILE", str(tmp_path / "nope.pem"))
    with pytest.raises(SettingsError, match=r"TWINSTREAM_ADMIN_TLS_CAFILE: .*no such file"):
        load_settings()


def test_the_admin_api_docs_can_be_turned_off(monkeypatch):
    assert load_settings().admin_api_docs
    monkeypatch.setenv("TWINSTREAM_ADMIN_API_DOCS", "false")
    assert not load_settings().admin_api_docs
