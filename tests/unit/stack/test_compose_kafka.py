"""What compose's one-shot services run (twinstream.stack.compose): the brokers' TLS files
readable by their group only, the admin password checked before anything is made, and the
same provisioning as `make up` with the given admin password kept."""

from __future__ import annotations

import json
import stat
from typing import Any

import pytest

from twinstream.platform.kafka_auth import ADMIN_USER, CredentialsError
from twinstream.platform.settings import Settings
from twinstream.stack import compose, core


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_tls_leaves_the_key_to_the_group_and_the_ca_to_everyone(tmp_path):
    tls, ca = tmp_path / "tls", tmp_path / "ca"
    (line,) = compose.make_tls(tls, ca)
    assert line.startswith("made")
    assert _mode(tls) == 0o750
    assert {p.name: _mode(p) for p in tls.iterdir()} == {
        name: 0o640
        for name in ("ca.pem", "ca-key.pem", "server.pem", "server-key.pem", "server-bundle.pem")
    }
    assert (ca / "ca.pem").read_bytes() == (tls / "ca.pem").read_bytes()
    assert _mode(ca / "ca.pem") == 0o644
    assert [p.name for p in ca.iterdir()] == ["ca.pem"]
    (again,) = compose.make_tls(tls, ca)
    assert again.startswith("kept")


@pytest.mark.parametrize("given", ["", "short", "z" * 48, "0123456789abcdef" * 9])
def test_a_bad_admin_password_is_refused_naming_how_to_make_one(given):
    with pytest.raises(CredentialsError, match="openssl rand -hex 24"):
        compose.admin_password({compose.ADMIN_PASSWORD_ENV: given} if given else {})


def test_an_unknown_command_prints_the_usage(capsys):
    assert compose.main(["nope"]) == 2
    assert "kafka-init" in capsys.readouterr().err


def test_kafka_init_provisions_as_make_up_keeping_the_given_admin_password(tmp_path, monkeypatch):
    calls: dict[str, Any] = {}
    monkeypatch.setattr(core, "AdminClient", lambda config: calls.setdefault("config", config))
    monkeypatch.setattr(
        core, "provision", lambda admin, pipelines, creds: calls.update(creds=creds) or ["ok"]
    )
    monkeypatch.setattr(core, "ensure_topics", lambda admin, specs: [])
    settings = Settings(
        state_dir=tmp_path,
        kafka_security=True,
        kafka_broker_bootstrap="kafka-1:19095",
        zk_password="x",
    )
    password = "ab" * 24
    lines: list[str] = []
    compose.kafka_init(settings, {compose.ADMIN_PASSWORD_ENV: password}, lines.append)
    assert calls["config"]["bootstrap.servers"] == "kafka-1:19095"
    assert calls["config"]["security.protocol"] == "SSL"
    assert calls["creds"].password(ADMIN_USER) == password
    saved = json.loads(settings.kafka_credentials_path.read_text())
    assert saved[ADMIN_USER] == password
    assert "hostmetrics-engine" in saved
    assert any("hostmetrics-engine" in line for line in lines)
