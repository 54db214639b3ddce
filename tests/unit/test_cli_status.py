"""`twinstream status` shows what an operator must see at a glance: roles, and any
quarantined offsets, backpressure pause and gap repair (admin API answers faked)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from twinstream import cli
from twinstream.config import load_settings

PIPELINES: dict[str, dict[str, Any]] = {
    "a": {
        "state": "running",
        "lag": 0,
        "buffer_fill": 10,
        "buffer_size": 10000,
        "last_msg_id_processed": 99,
        "last_msg_id_published": 99,
        "in_sync": False,
        "uncovered_ranges": [],
        "quarantined": [{"msg_id": 42, "reason": "quarantined: X: y"}],
        "paused": None,
        "repairs": [{"first": 10, "last": 14, "seconds": 2.5}],
    },
    "b": {
        "state": "running",
        "lag": 3,
        "buffer_fill": 100000,
        "buffer_size": 10000,
        "last_msg_id_processed": 101,
        "last_msg_id_published": None,
        "in_sync": True,
        "uncovered_ranges": [],
        "quarantined": [{"msg_id": 42, "reason": "quarantined: X: y"}],
        "paused": "100000 buffered rows above the active's last published msg_id 1",
        "repairs": [],
    },
}


def test_status_shows_quarantine_pause_and_repairs(monkeypatch: pytest.MonkeyPatch, capsys):
    settings = load_settings(admin_token="t")

    def get(url: str, **_: Any) -> httpx.Response:
        engine = "a" if f":{settings.engine_admin_port('a')}/" in url else "b"
        if url.endswith("/server"):
            role = "active" if engine == "a" else "standby"
            body: dict[str, Any] = {"role": role, "zk_state": "CONNECTED"}
        else:
            body = PIPELINES[engine]
        return httpx.Response(200, json=body, request=httpx.Request("GET", url))

    monkeypatch.setattr(httpx, "get", get)
    assert cli.cmd_status(settings, None) == 0  # type: ignore[arg-type]
    lines = capsys.readouterr().out.splitlines()
    a_line = next(line for line in lines if line.startswith("a "))
    b_line = next(line for line in lines if line.startswith("b "))
    assert "QUARANTINED 1 (twinstream quarantine list)" in a_line
    assert "REPAIRED 10..14 in 2.5 s" in a_line
    assert "PAUSED" in b_line
