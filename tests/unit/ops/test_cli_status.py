"""`twinstream status` shows what an operator must see at a glance: roles, and any
quarantined offsets, backpressure pause and gap repair (the admin client's answers faked)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.unit import fakes
from tests.unit.fakes import pipeline_info, server_info
from twinstream.core.rows import record_id, record_text
from twinstream.engine.api import PipelineInfo, ServerInfo
from twinstream.engine.client import EngineClient, EngineError
from twinstream.ops import cli
from twinstream.ops.overview import Overview, overview
from twinstream.platform import registry
from twinstream.platform.settings import Settings, load_settings

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
    # Each partition's buffer against num_buffered_msgs (a partition's bound, not the sum's).
    "buffer_fill": 29_800,
    "buffer_fills": {0: 9_800, 1: 10_000, 2: 10_000},
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


def row(lines: list[str], engine: str) -> list[str]:
    """The cells of an engine's row of the table (rich draws │ between them)."""
    for line in lines:
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if cells and cells[0] == engine:
            return cells
    raise AssertionError(f"no row of engine {engine} in:\n" + "\n".join(lines))


def cell(lines: list[str], engine: str, column: str) -> str:
    """One cell of an engine's row, by its column's header (an empty last cell is not
    drawn as one)."""
    header = next(line for line in lines if "┃ engine" in line)
    names = [c.strip() for c in header.strip("┃ ").split("┃")]
    return row(lines, engine)[names.index(column)]


def status(settings: Settings, *args: str) -> int:
    return cli.cmd_status(settings, cli_args(*args))


def cli_args(*args: str) -> argparse.Namespace:
    return argparse.Namespace(pipeline=None, json="--json" in args, watch=None)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return load_settings(admin_token="t", state_dir=tmp_path)


def test_status_shows_quarantine_pause_and_repairs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], settings: Settings
) -> None:
    fake_engines(monkeypatch, actives={"a", "c"})
    assert status(settings) == 0
    lines = capsys.readouterr().out.splitlines()
    a, b = row(lines, "a"), row(lines, "b")
    assert "QUARANTINED 1 (twinstream quarantine list)" in a[-1]
    assert "REPAIRED 10..14 in 2.5 s" in a[-1]
    assert "PAUSED" in b[-1]
    assert a[1:8] == ["active", "0", "running", "0", "99", "99", "no"]
    assert row(lines, "c")[5:7] == ["0:120, 1:98, 2:130", "0:110, 1:98, 2:125"]
    assert row(lines, "c")[8] == "p0 9,800/10,000 · p1 10,000/10,000 · p2 10,000/10,000"
    assert a[8] == "10 total"
    assert "pipeline hostmetrics  active a" in lines[0]


def test_status_covers_every_pipeline_and_names_one_without_a_single_active(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], settings: Settings
) -> None:
    fake_engines(monkeypatch, actives={"a", "c", "d"})
    assert status(settings) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert [row(lines, e)[1] for e in "abcd"] == ["active", "standby", "active", "active"]
    assert "PROBLEM: 2 active engines (want exactly 1): c, d" in out
    assert "pipeline payments  NO SINGLE ACTIVE" in out
    # --pipeline: that pipeline's engines only.
    monkeypatch.setenv("TWINSTREAM_ADMIN_TOKEN", "t")
    monkeypatch.setenv("TWINSTREAM_STATE_DIR", str(settings.state_dir))
    assert cli.main(["status", "--pipeline", "hostmetrics"]) == 0
    out = capsys.readouterr().out
    assert "pipeline hostmetrics" in out
    assert "payments" not in out
    # A pipeline with engines of its own (payments: c, d): its settings name them, and the
    # stack's list read from them gave hostmetrics (no engines entry) the same ids (a user's
    # `status --pipeline clicks` failed: "engine 'e' belongs to both").
    assert cli.main(["status", "--pipeline", "payments"]) == 1
    out = capsys.readouterr().out
    assert "pipeline payments  NO SINGLE ACTIVE" in out
    assert "hostmetrics" not in out
    assert [row(out.splitlines(), e)[1] for e in "cd"] == ["active", "active"]


def test_status_shows_each_engines_agreement_and_a_disagreement_is_a_problem(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], settings: Settings
) -> None:
    fake_engines(monkeypatch, actives={"a", "c"})
    monkeypatch.setitem(PIPELINES, "b", PIPELINES["b"] | {"agreement": {"state": "agrees"}})
    assert status(settings) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [cell(lines, e, "agreement") for e in "ab"] == ["unchecked", "agrees"]
    monkeypatch.setitem(PIPELINES, "d", PIPELINES["d"] | {"agreement": fakes.disagreement(1)})
    assert status(settings) == 1
    out = capsys.readouterr().out
    assert cell(out.splitlines(), "d", "agreement") == "DISAGREES at msg_id 1:1000"
    problem = out[out.index("PROBLEM: engine d disagrees") :]
    assert "at msg_id 1:1000 (the active's transaction of msg_id 1:950..1040, epoch 3)" in problem
    assert "restore_and_resync, snapshot proven" in problem


def test_status_as_json_is_the_overview_model(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], settings: Settings
) -> None:
    fake_engines(monkeypatch, actives={"a", "c"})
    assert status(settings, "--json") == 0
    seen = Overview.model_validate_json(capsys.readouterr().out)
    assert [p.active for p in seen.pipelines] == ["a", "c"]


def refusing(status_code: int | None) -> Callable[[EngineClient], ServerInfo]:
    def handle(client: EngineClient) -> ServerInfo:
        if status_code is None:
            raise EngineError(client.engine_id, "GET /server", None, "connection refused")
        raise EngineError(
            client.engine_id, "GET /server", status_code, "missing or wrong bearer token"
        )

    return handle


@pytest.mark.parametrize(
    ("status_code", "words"),
    [
        (401, "every engine refuses the admin token (HTTP 401: missing or wrong bearer token)"),
        (None, "no engine answers (engine a: connection refused): start the stack"),
    ],
)
def test_a_wrong_token_or_no_engine_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    status_code: int | None,
    words: str,
) -> None:
    monkeypatch.setattr(EngineClient, "server", refusing(status_code))
    monkeypatch.setenv("TWINSTREAM_ADMIN_TOKEN", "wrong")
    monkeypatch.setenv("TWINSTREAM_STATE_DIR", str(tmp_path))
    assert cli.main(["status"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert words in err
    assert "Traceback" not in err


def test_one_engine_down_is_its_row_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], settings: Settings
) -> None:
    fake_engines(monkeypatch, actives={"a", "c"})
    up = EngineClient.server

    def server(client: EngineClient) -> ServerInfo:
        if client.engine_id == "b":
            raise EngineError("b", "GET /server", None, "http://127.0.0.1:8702: connection refused")
        return up(client)

    monkeypatch.setattr(EngineClient, "server", server)
    assert status(settings) == 1
    b = row(capsys.readouterr().out.splitlines(), "b")
    assert b[1] == "unreachable"
    assert "connection refused" in b[-1]


def test_watch_redraws_until_told_to_stop(
    monkeypatch: pytest.MonkeyPatch, settings: Settings
) -> None:
    from twinstream.ops.status_view import watch

    fake_engines(monkeypatch, actives={"a", "c"})
    looks: list[int] = []

    def look() -> Overview:
        looks.append(1)
        return overview(
            registry.stack(settings), lambda p, e: EngineClient.from_settings(p, e, "t")
        )

    assert watch(look, 2.0, sleep=lambda s: None, rounds=3) == 0
    assert len(looks) == 4  # the first drawing, then each redraw


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


def test_a_wrong_token_is_named_even_with_some_engines_down(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], settings: Settings
) -> None:
    def server(client: EngineClient) -> ServerInfo:
        down = client.engine_id in ("c", "d")
        return refusing(None if down else 401)(client)

    monkeypatch.setattr(EngineClient, "server", server)
    assert status(settings) == 2
    err = capsys.readouterr().err
    assert "every engine refuses the admin token" in err
    assert ", 2 more not answering" in err


# -- --watch's sparklines (twinstream.engine.timeline's figures) -----------------------------------

NOW = 1_000_000.0


def test_a_sparkline_scales_from_zero_to_its_highest_and_leaves_unknown_blank() -> None:
    from twinstream.ops.status_view import slots, sparkline

    assert sparkline([0.0, 3.5, 7.0, None, 1.0]) == "▁▅█ ▂"
    assert sparkline([None, None]) == "  "
    assert sparkline([0, 0]) == "▁▁"
    # Four buckets into two slots of 10 s: a p99 slot shows its worst, a rate its mean.
    times, values = [NOW, NOW + 5, NOW + 10, NOW + 15], [1.0, 3.0, None, 5.0]
    assert slots(times, values, NOW, NOW + 20, 2, worst=True) == [3.0, 5.0]
    assert slots(times, values, NOW, NOW + 20, 2, worst=False) == [2.0, 5.0]
    assert slots(times, values, NOW + 20, NOW + 40, 2, worst=True) == [None, None]


def merged_timeline() -> Any:
    from twinstream.engine.api import TimelineInfo
    from twinstream.engine.timeline import merge

    def point(t: float, **fields: Any) -> dict[str, Any]:
        base = {"p50_s": None, "p99_s": None, "published": 0, "in_per_s": None, "lag": None}
        return {"t": t, **base, **fields}

    # a published until it died; b took over 300 s ago and published since.
    a = fakes.timeline(
        NOW,
        points=[point(NOW - 600, p50_s=0.2, p99_s=0.5, published=9, in_per_s=100.0, lag=1)],
        takeovers=[],
    )
    b = fakes.timeline(
        NOW,
        points=[
            point(NOW - 600, in_per_s=100.0, lag=40),
            point(NOW - 5, p50_s=1.0, p99_s=6.0, published=9, in_per_s=200.0, lag=2),
        ],
        takeovers=[{"t": NOW - 300, "epoch": 8}],
    )
    infos = {"a": TimelineInfo.model_validate(a), "b": TimelineInfo.model_validate(b)}
    return merge("hostmetrics", infos, NOW, {"c": "unreachable"})


def test_the_sparklines_show_p99_rate_each_lag_and_the_takeovers() -> None:
    from twinstream.ops.status_view import timeline_text

    text = timeline_text(merged_timeline(), {"a": None, "b": "active"}, width=60).plain
    header, *rest = text.splitlines()
    left = header.index("◀")  # where every sparkline starts
    lines = {line[:left].strip(): line for line in rest}
    p99 = lines["p99 latency"]
    # 60 slots of 15 s over 15 minutes: 600 s ago is slot 20, 5 s ago the last.
    spark = p99[left : left + 60]
    # 0.5 s against the highest 6 s: the second of eight levels.
    assert spark[20] == "▂"
    assert spark[59] == "█"
    assert spark.replace(" ", "") == "▂█"
    assert p99.endswith("now 6.00 s, max 6.00 s")
    assert lines["input rate"].endswith("now 200/s, max 200/s")
    assert "lag a (unreachable)" in text
    assert lines["lag b (active)"].endswith("now 2, max 40")
    # The takeover 300 s ago: slot 40, under the lines, named with its epoch and engine.
    takeovers = lines["takeovers"]
    assert takeovers[left : left + 60].index("▲") == 40
    assert "epoch 8 b at 13:41:40" in takeovers
    assert "engine c: no figures (unreachable)" in text


def test_watch_draws_the_sparklines_under_each_pipelines_table(
    monkeypatch: pytest.MonkeyPatch, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    from twinstream.ops.status_view import watch

    fake_engines(monkeypatch, actives={"a", "c"})

    def look() -> Overview:
        return overview(
            registry.stack(settings), lambda p, e: EngineClient.from_settings(p, e, "t")
        )

    seen = merged_timeline()
    assert (
        watch(look, 2.0, sleep=lambda s: None, rounds=1, timelines=lambda: {"hostmetrics": seen})
        == 0
    )
    out = capsys.readouterr().out
    assert "p99 latency" in out
    assert "lag b (standby)" in out
    assert "▲" in out
    # Only the pipeline that has a timeline gets sparklines.
    assert out.count("input rate") == 1


def test_status_watch_asks_every_engine_for_its_timeline_unless_told_not_to(
    monkeypatch: pytest.MonkeyPatch, settings: Settings
) -> None:
    from twinstream.engine.api import TimelineInfo
    from twinstream.ops import status_view

    asked: list[str] = []
    # cmd_status merges on the wall clock: the engines' figures are of now.
    now = time.time()

    def timeline(client: EngineClient) -> TimelineInfo:
        asked.append(client.engine_id)
        return TimelineInfo.model_validate(fakes.timeline(now))

    monkeypatch.setattr(EngineClient, "timeline", timeline)
    given: list[Any] = []

    def watch(look: Any, every_s: float, timelines: Any = None) -> int:
        given.append(timelines)
        return 0

    monkeypatch.setattr(status_view, "watch", watch)
    args = argparse.Namespace(pipeline=None, json=False, watch=2.0, no_sparklines=False)
    assert cli.cmd_status(settings, args) == 0
    (charts,) = given
    drawn = charts()
    assert sorted(asked) == ["a", "b", "c", "d"]
    assert set(drawn) == {"hostmetrics", "payments"}
    assert drawn["hostmetrics"].p99_s == [0.9, None]
    args.no_sparklines = True
    assert cli.cmd_status(settings, args) == 0
    assert given[1] is None


def test_kazoos_retried_connection_warnings_stay_off_a_status_that_ends_well(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import logging

    fake_engines(monkeypatch, actives={"a", "c"})
    up = EngineClient.server

    def server(client: EngineClient) -> ServerInfo:
        # What kazoo's connection thread logs while status reads the publisher adapters.
        logging.getLogger("kazoo.client").warning("Connection time-out: %s", "retrying")
        if client.engine_id == "b":
            logging.getLogger("kazoo.client").error("Unhandled exception in connection loop")
        return up(client)

    monkeypatch.setattr(EngineClient, "server", server)
    # As outside pytest: no handler on the root logger, so Python's last resort prints
    # warnings and above on stderr.
    monkeypatch.setattr(logging.root, "handlers", [])
    monkeypatch.setenv("TWINSTREAM_ADMIN_TOKEN", "t")
    monkeypatch.setenv("TWINSTREAM_STATE_DIR", str(tmp_path))
    assert cli.main(["status"]) == 0
    out, err = capsys.readouterr()
    assert "pipeline hostmetrics" in out
    assert "Connection time-out" not in err
    # A real failure still says itself.
    assert err.strip() == "Unhandled exception in connection loop"
    # Only for the command's time: a later user of kazoo in this process logs as before.
    assert logging.getLogger("kazoo").level == logging.NOTSET
