"""`twinstream status` shows what an operator must see at a glance: roles, and any
quarantined offsets, backpressure pause and gap repair (the admin client's answers faked)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.fakes import pipeline_info, server_info
from twinstream import cli
from twinstream.admin_api import PipelineInfo, ServerInfo
from twinstream.config import load_settings
from twinstream.core.rows import record_id, record_text
from twinstream.engine_client import EngineClient

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


PIPELINES["c"] = PIPELINES["a"] | {
    # Three partitions: no scalar position; each partition's instead.
    "quarantined": [],
    "repairs": [],
    "last_msg_id_processed": None,
    "last_msg_id_published": None,
    "processed": {0: 120, 1: 98, 2: 130},
    "published": {0: 110, 1: 98, 2: 125},
}
PIPELINES["d"] = PIPELINES["b"] | {"quarantined": [], "paused": None}


def fake_engines(monkeypatch: pytest.MonkeyPatch, actives: set[str]) -> None:
    def server(client: EngineClient) -> ServerInfo:
        role = "active" if client.engine_id in actives else "standby"
        return server_info(engine_id=client.engine_id, role=role)

    def pipeline(client: EngineClient) -> PipelineInfo:
        return pipeline_info(**PIPELINES[client.engine_id])

    monkeypatch.setattr(EngineClient, "server", server)
    monkeypatch.setattr(EngineClient, "pipeline", pipeline)


def test_status_shows_quarantine_pause_and_repairs(monkeypatch: pytest.MonkeyPatch, capsys):
    settings = load_settings(admin_token="t")
    fake_engines(monkeypatch, actives={"a", "c"})
    assert cli.cmd_status(settings, None) == 0
    lines = capsys.readouterr().out.splitlines()
    a_line = next(line for line in lines if line.startswith("hostmetrics  a "))
    b_line = next(line for line in lines if line.startswith("hostmetrics  b "))
    assert "QUARANTINED 1 (twinstream quarantine list)" in a_line
    assert "REPAIRED 10..14 in 2.5 s" in a_line
    assert "PAUSED" in b_line
    assert a_line.split()[-5:-1] == ["10/10000", "99", "99", "no"]
    c_line = next(line for line in lines if line.startswith("payments     c "))
    assert "0:120, 1:98, 2:130  0:110, 1:98, 2:125" in c_line


def test_status_covers_every_pipeline_and_names_one_without_a_single_active(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = load_settings(admin_token="t")
    fake_engines(monkeypatch, actives={"a", "c", "d"})
    assert cli.cmd_status(settings, None) == 1
    out, err = capsys.readouterr()
    rows = [line.split()[:3] for line in out.splitlines()[1:]]
    assert rows == [
        ["hostmetrics", "a", "active"],
        ["hostmetrics", "b", "standby"],
        ["payments", "c", "active"],
        ["payments", "d", "active"],
    ]
    assert "pipeline payments has 2 active engines" in err
    assert "hostmetrics" not in err
    # --pipeline: that pipeline's engines only.
    monkeypatch.setenv("TWINSTREAM_ADMIN_TOKEN", "t")
    assert cli.main(["status", "--pipeline", "hostmetrics"]) == 0
    assert [line.split()[1] for line in capsys.readouterr().out.splitlines()[1:]] == ["a", "b"]


@pytest.mark.parametrize(
    ("text", "record"), [("1234", 1234), ("0:1234", 1234), ("2:7", record_id(2, 7))]
)
def test_a_msg_id_to_release_is_read_as_logs_write_it(text, record):
    assert cli.parse_record(text) == record
    assert record_text(record) == text.removeprefix("0:")


@pytest.mark.parametrize("text", ["x", "2:", "-1:5", "1:-5", "1:2:3", str(1 << 48)])
def test_a_msg_id_that_is_none_is_refused_with_the_forms_it_takes(text):
    with pytest.raises(ValueError, match="PARTITION:OFFSET"):
        cli.parse_record(text)
