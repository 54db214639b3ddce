"""`make up`'s line for an engine says its lag and buffer the same way whatever the
engine has seen so far: no `lag None`, no total beside another engine's partitions."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.fakes import pipeline_info, server_info
from twinstream.engine.client import EngineClient
from twinstream.platform.settings import load_settings
from twinstream.stack import health


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        # A fresh engine: no inbound ends read, no batch.
        ({"lag": None}, "lag unknown yet, buffer empty (no batch yet)"),
        (
            {"lag": 1234, "buffer_fill": 30, "buffer_size": 10_000, "buffer_fills": {0: 10, 1: 20}},
            "lag 1,234, buffer p0 10/10,000 · p1 20/10,000",
        ),
        (
            {"lag": 0, "buffer_fill": 0, "buffer_size": 10_000, "buffer_fills": {0: 0, 1: 0}},
            "lag 0, buffer p0 0/10,000 · p1 0/10,000",
        ),
        # An engine that gives no partition's figure: its total, never against the bound.
        (
            {"lag": 5, "buffer_fill": 25_000, "buffer_size": 10_000},
            "lag 5, buffer 25,000 rows over every partition (each partition's bound 10,000)",
        ),
    ],
)
def test_an_engines_lag_and_buffer_read_the_same_for_every_engine(
    fields: dict[str, object], text: str
) -> None:
    assert health.standing_text(pipeline_info(**fields)) == text


def test_make_ups_line_for_a_fresh_engine_says_what_it_does_not_know_yet(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(EngineClient, "server", lambda c: server_info(engine_id=c.engine_id))
    monkeypatch.setattr(EngineClient, "pipeline", lambda _c: pipeline_info(lag=None))
    settings = load_settings(admin_token="t", state_dir=tmp_path)
    ok, detail, role = health.engine(settings, "a")
    assert (ok, role) == (True, "standby")
    assert detail == "standby, pipeline running, lag unknown yet, buffer empty (no batch yet)"
