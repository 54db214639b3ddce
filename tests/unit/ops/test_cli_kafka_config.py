"""`twinstream kafka-config` (issue 33): a pipeline user's client settings, from the one
config builder (twinstream.platform.kafka) and the ACLs themselves
(twinstream.platform.kafka_auth), as librdkafka or Java properties or JSON, with the group
prefix and the topics as comments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from twinstream.ops import cli
from twinstream.platform.kafka import connection, user_client
from twinstream.platform.kafka_auth import GROUP_PREFIXES, Credentials, users
from twinstream.platform.settings import load_settings


@pytest.fixture(autouse=True)
def _one_pipeline_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's environment names the pipeline these commands work on (the
    repository's file lists two: with none chosen, they refuse)."""
    monkeypatch.setenv("TWINSTREAM_PIPELINE", "hostmetrics")


@pytest.fixture
def secured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Credentials:
    """A stack with Kafka security: its state folder here, every user's password made."""
    monkeypatch.setenv("TWINSTREAM_KAFKA_SECURITY", "true")
    monkeypatch.setenv("TWINSTREAM_STATE_DIR", str(tmp_path))
    creds, _added = Credentials.ensure(
        tmp_path / "kafka-credentials.json", users(["hostmetrics", "payments"])
    )
    return creds


def printed(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[str, dict[str, str]]:
    assert cli.main(["kafka-config", *args]) == 0
    out = capsys.readouterr().out
    settings = dict(
        line.split("=", 1) for line in out.splitlines() if line and not line.startswith("#")
    )
    return out, settings


def test_a_readers_librdkafka_settings_are_the_platforms_own_with_the_rules_as_comments(
    secured: Credentials, capsys: pytest.CaptureFixture[str]
) -> None:
    out, settings = printed(capsys, "--pipeline", "payments", "--role", "reader")
    reader = load_settings(pipeline="payments", kafka_role="reader")
    # The platform's own reader's settings, one builder: only the group is the user's.
    assert settings == {
        **connection(reader).librdkafka(),
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
    }
    assert settings["security.protocol"] == "SASL_SSL"
    assert settings["sasl.mechanism"] == "SCRAM-SHA-512"
    assert settings["sasl.username"] == "payments-reader"
    assert settings["sasl.password"] == secured.password("payments-reader")
    assert settings["ssl.ca.location"] == str(reader.kafka_ca_path)
    assert "group.id" not in settings
    assert f"group.id must start with {' or '.join(GROUP_PREFIXES)}" in out
    assert "# May read topics: payments.out, payments.dlq, payments.progress\n" in out
    assert "May write" not in out
    assert "keep this private" in out


def test_a_publishers_java_settings_say_what_it_may_write_and_how_to_key(
    secured: Credentials, capsys: pytest.CaptureFixture[str]
) -> None:
    out, settings = printed(
        capsys, "--pipeline", "payments", "--role", "publisher", "--format", "java"
    )
    publisher = load_settings(pipeline="payments", kafka_role="publisher")
    assert settings == {
        "bootstrap.servers": publisher.bootstrap_servers,
        **connection(publisher).java_security(),
        "acks": "all",
        "enable.idempotence": "true",
    }
    assert 'username="payments-publisher"' in settings["sasl.jaas.config"]
    assert "# May write topics: payments.in\n" in out
    # Its adapters read the inbound tail (where the last active stopped) in groups of
    # their own prefix.
    assert "group.id must start with twinstream-publisher-" in out
    assert "by its `card` member" in out


def test_json_holds_both_clients_and_the_grants(
    secured: Credentials, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["kafka-config", "--role", "reader", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    client = user_client(load_settings(), "reader")  # hostmetrics: TWINSTREAM_PIPELINE's
    assert data["user"] == "hostmetrics-reader"
    assert data["librdkafka"] == client.librdkafka
    assert data["java"] == client.java
    assert data["grants"]["group_prefixes"] == list(GROUP_PREFIXES)
    assert data["grants"]["topics"]["READ"] == [
        "hostmetrics.out",
        "hostmetrics.dlq",
        "hostmetrics.progress",
    ]
    assert data["key_by"] is None


def test_without_kafka_security_only_where_the_cluster_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out, settings = printed(capsys, "--pipeline", "hostmetrics", "--role", "publisher")
    assert "no Kafka security on this cluster" in out
    assert "sasl.password" not in settings
    assert settings["acks"] == "all"


def test_missing_credentials_or_a_wrong_role_end_with_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TWINSTREAM_KAFKA_SECURITY", "true")
    monkeypatch.setenv("TWINSTREAM_STATE_DIR", str(tmp_path))
    assert cli.main(["kafka-config", "--role", "reader"]) == 2
    assert "run `make up`" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["kafka-config", "--role", "engine"])
    assert "invalid choice: 'engine'" in capsys.readouterr().err
