"""The operator's view (twinstream.ops.overview) from fake admin APIs: roles, what a takeover
needs against the standby's buffer, takeovers merged across engines, snapshots' age and
restorability, the latest audit, and every problem named."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.unit.fakes import disagreement, pipeline_info, server_info
from twinstream.engine import snapshot
from twinstream.engine.client import EngineClient
from twinstream.ops.overview import FAIL, WARN, covers, latest_audit, overview
from twinstream.ops.status_view import history
from twinstream.platform import registry
from twinstream.platform.settings import Settings, load_settings


def fake_engines(answers: dict[str, tuple[dict[str, Any], dict[str, Any]] | int | None]):
    """engine id -> (server fields, pipeline fields), an HTTP status it refuses with, or
    None for an engine that does not answer."""

    def make(settings: Settings, engine_id: str) -> EngineClient:
        answer = answers[engine_id]

        def handle(request: httpx.Request) -> httpx.Response:
            if answer is None:
                raise httpx.ConnectError("connection refused", request=request)
            if isinstance(answer, int):
                return httpx.Response(answer, json={"reason": "missing or wrong bearer token"})
            server, pipe = answer
            if request.url.path == "/server":
                return httpx.Response(
                    200, json=server_info(engine_id=engine_id, **server).model_dump()
                )
            return httpx.Response(200, json=pipeline_info(**pipe).model_dump())

        return EngineClient(engine_id, "http://engine", "t", transport=httpx.MockTransport(handle))

    return make


def pipelines(tmp_path: Path) -> dict[str, Settings]:
    settings = load_settings(pipeline="hostmetrics", admin_token="t", state_dir=tmp_path)
    return registry.stack(settings)


ACTIVE = ({"role": "active", "epoch": 7}, {"published": {0: 100, 1: 50}, "in_sync": True})


def standby(processed: dict[int, int], fill: int, **more: Any):
    return ({"role": "standby", "epoch": 7}, {"processed": processed, "buffer_fill": fill, **more})


def test_a_standby_covers_a_takeover_when_its_buffer_holds_what_it_is_ahead_by():
    active = pipeline_info(published={0: 100, 1: 50})
    assert covers(pipeline_info(processed={0: 110, 1: 48}, buffer_fill=10), active) == (10, True)
    assert covers(pipeline_info(processed={0: 110, 1: 55}, buffer_fill=10), active) == (15, False)
    # Behind the active: nothing to publish at a takeover, nothing to cover.
    assert covers(pipeline_info(processed={0: 90}, buffer_fill=0), active) == (0, True)


def test_the_overview_names_roles_cover_and_every_problem(tmp_path: Path):
    answers = {
        "a": ACTIVE,
        "b": standby({0: 120, 1: 50}, 5, quarantined=[{"msg_id": 3, "reason": "x"}]),
        "c": None,
        "d": 401,
    }
    seen = overview(pipelines(tmp_path), fake_engines(answers), with_history=False)
    host, pay = seen.pipelines
    assert host.active == "a"
    a, b = host.engines
    assert (a.role, b.role, b.takeover_needs, b.covers_takeover) == ("active", "standby", 20, False)
    assert b.health == FAIL
    assert b.quarantined == 1
    assert host.problems == [
        "engine b: its buffer (5) does not cover a takeover (20 rows)",
        "no standby could take over from engine a: engine b not in sync (lag unknown). Its "
        "next failure stops the output; one catching up needs nothing unless its lag stops "
        "falling (docs/falling-behind.md); a short buffer: raise TWINSTREAM_NUM_BUFFERED_MSGS",
    ]
    c, d = pay.engines
    assert c.problem is not None
    assert "connection refused" in c.problem
    assert not c.unauthorized
    assert d.unauthorized
    assert d.problem == "HTTP 401: missing or wrong bearer token"
    assert pay.problems[0] == "0 active engines (want exactly 1)"
    assert not seen.ok


def test_a_healthy_pair_has_no_problem_and_a_lagging_standby_is_a_warning(tmp_path: Path):
    answers = {
        "a": ACTIVE,
        "b": standby({0: 100, 1: 50}, 50, in_sync=True),
        "c": ACTIVE,
        "d": standby({0: 90}, 50, in_sync=True, lag=12_000, lag_s=2.4),
    }
    seen = overview(pipelines(tmp_path), fake_engines(answers), with_history=False)
    assert [p.problems for p in seen.pipelines] == [[], []]
    assert seen.pipelines[0].engines[1].health == "ok"
    assert seen.pipelines[1].engines[1].lag_text() == "12,000 (2.4 s)"
    assert seen.ok


def test_an_active_whose_only_standby_is_not_in_sync_is_a_problem_saying_for_how_long(
    tmp_path: Path,
):
    """Issue 49: status was green while the only standby restarted and caught up, and
    while it disagreed: the pipeline's next failure would have stopped its output."""
    since = "2026-11-28T10:00:00+00:00"
    cover = {"ready": [], "not_ready": {"b": "x"}, "unprotected_since": since, "unprotected_s": 42}
    active = ({"role": "active", "epoch": 7}, {**ACTIVE[1], "standbys": cover})
    answers = {
        "a": active,
        "b": standby({0: 90}, 50, in_sync=False, lag=40_000, lag_s=12.5),
        "c": ACTIVE,
        "d": None,
    }
    seen = overview(pipelines(tmp_path), fake_engines(answers), with_history=False)
    host, pay = seen.pipelines
    assert host.engines[1].health == WARN
    assert host.problems == [
        f"no standby could take over from engine a for 42 s (since {since}): engine b not in "
        "sync (lag 40,000 (12.5 s)). Its next failure stops the output; one catching up needs "
        "nothing unless its lag stops falling (docs/falling-behind.md)"
    ]
    (unprotected,) = [p for p in pay.problems if p.startswith("no standby could take over")]
    assert unprotected.startswith("no standby could take over from engine c: engine d does not")
    assert "`twinstream restart ENGINE`" in unprotected
    assert not seen.ok


def test_a_disagreeing_standby_is_a_problem_naming_the_msg_id_both_rows_and_the_fix(
    tmp_path: Path,
):
    answers = {
        "a": ACTIVE,
        "b": standby({0: 100, 1: 50}, 50, in_sync=True, agreement=disagreement()),
        "c": ACTIVE,
        "d": standby({0: 100, 1: 50}, 50, in_sync=True, agreement={"state": "agrees"}),
    }
    seen = overview(pipelines(tmp_path), fake_engines(answers), with_history=False)
    host, pay = seen.pipelines
    a, b = host.engines
    assert (a.agreement_text(), b.agreement_text()) == ("unchecked", "DISAGREES at msg_id 1000")
    assert b.agreement.difference is not None
    assert b.agreement.difference.epoch == 3
    assert (b.health, b.healthy, b.disagrees) == (FAIL, False, True)
    assert host.problems == [
        "engine b disagrees with the published output at msg_id 1000 (the active's transaction "
        'of msg_id 950..1040, epoch 3): active rows [out key=h1 value={"avg": 0.5}], engine '
        'rows [out key=h1 value={"avg": 0.7}], found at 2026-11-28T02:00:00+00:00; restore '
        "it (restore_and_resync, snapshot proven) or override (POST /pipeline/override)",
        "no standby could take over from engine a: engine b may not lead: its rows disagree "
        "with the published output. Its next failure stops the output; one that disagrees: "
        "restore it (restore_and_resync, snapshot proven) or override (POST /pipeline/override)",
    ]
    assert not seen.ok
    d = pay.engines[1]
    assert (d.agreement_text(), d.health, d.healthy, pay.problems) == ("agrees", "ok", True, [])


def test_an_overridden_disagreement_is_a_warning_not_a_problem(tmp_path: Path):
    """The operator let it lead: nothing more to act on, but the table still says so."""
    answers = {
        "a": ACTIVE,
        "b": standby({0: 100}, 50, in_sync=True, agreement=disagreement(2, 7, overridden=True)),
        "c": ACTIVE,
        "d": standby({0: 100}, 50, in_sync=True),
    }
    host = overview(pipelines(tmp_path), fake_engines(answers), with_history=False).pipelines[0]
    b = host.engines[1]
    assert host.problems == []
    assert (b.health, b.healthy, b.agreement_text()) == (
        WARN,
        True,
        "disagrees at msg_id 2:7 (overridden)",
    )
    assert "overridden by an operator" in str(b.disagreement())


def test_takeovers_are_merged_from_every_engine_newest_first(tmp_path: Path):
    def took(epoch: int) -> dict[str, Any]:
        return {"epoch": epoch, "at": "2026-11-26T10:00:00+00:00", "fence_and_read_s": 0.1}

    answers = {
        "a": (ACTIVE[0], {**ACTIVE[1], "takeovers": [took(7), took(5)]}),
        "b": standby({0: 100}, 5, takeovers=[took(6)]),
        "c": ACTIVE,
        "d": standby({0: 100}, 5),
    }
    seen = overview(pipelines(tmp_path), fake_engines(answers), with_history=False)
    assert [(t.epoch, t.engine_id) for t in seen.pipelines[0].takeovers] == [
        (7, "a"),
        (6, "b"),
        (5, "a"),
    ]


def test_the_last_takeover_says_whether_its_engine_was_a_warm_spare(tmp_path: Path):
    def took(epoch: int, from_spare: bool) -> dict[str, Any]:
        return {
            "epoch": epoch,
            "at": "2026-11-26T10:00:00+00:00",
            "fence_and_read_s": 0.1,
            "from_spare": from_spare,
        }

    for from_spare, said in ((True, "engine a (a warm spare)"), (False, "engine a (started cold)")):
        answers = {
            "a": (ACTIVE[0], {**ACTIVE[1], "takeovers": [took(7, from_spare)]}),
            "b": standby({0: 100}, 5),
            "c": ACTIVE,
            "d": standby({0: 100}, 5),
        }
        seen = overview(pipelines(tmp_path), fake_engines(answers), with_history=False)
        assert seen.pipelines[0].takeovers[0].from_spare is from_spare
        assert f"last takeover: {said} at epoch 7" in history(seen.pipelines[0]).plain


def test_snapshots_show_age_and_whether_kafka_still_holds_what_they_replay(tmp_path: Path):
    from tests.unit.engine.test_snapshot import fake_checkpoint, rows

    host = pipelines(tmp_path)["hostmetrics"]
    checkpoint = fake_checkpoint(tmp_path / "engine-b")  # continues at inbound offset 66
    snapshot.write_snapshot(
        host.snapshot_dir,
        pipeline="hostmetrics",
        engine_id="b",
        pipeline_version="1",
        checkpoint=checkpoint,
        topic="hostmetrics.in",
        buffer=rows(0, 65),
        now=lambda: datetime.now(UTC) - timedelta(minutes=5),
    )
    answers = {"a": ACTIVE, "b": standby({0: 1}, 1)}
    engines = fake_engines(answers)
    seen = overview({"hostmetrics": host}, engines, log_starts=lambda s: {0: 66})
    (snap,) = seen.pipelines[0].snapshots
    assert (snap.problem, snap.restorable, snap.engine_id) == (None, True, "b")
    assert snap.age_s is not None
    assert 299 <= snap.age_s <= 330
    seen = overview({"hostmetrics": host}, engines, log_starts=lambda s: {0: 67})
    assert seen.pipelines[0].snapshots[0].restorable is False
    # Kafka not asked: unknown, not guessed.
    assert overview({"hostmetrics": host}, engines).pipelines[0].snapshots[0].restorable is None


def test_the_latest_audit_report_and_its_data_docs_page(tmp_path: Path):
    site = tmp_path / "gx" / "uncommitted" / "data_docs" / "local_site"
    page = site / "validations" / "suite" / "run.html"
    report = tmp_path / "cursors" / "nightly" / "last-audit.json"
    report.parent.mkdir(parents=True)
    report.write_text(
        json.dumps({"run": "r1", "ok": False, "summary": "2 missing", "data_docs": str(page)})
    )
    audit = latest_audit(tmp_path)
    assert audit is not None
    assert (audit.run, audit.ok, audit.data_docs) == ("r1", False, "validations/suite/run.html")
    assert latest_audit(tmp_path / "nowhere") is None


@pytest.mark.parametrize("broken", ["{", "[]"])
def test_an_unreadable_audit_report_is_skipped(tmp_path: Path, broken: str):
    (tmp_path / "last-audit.json").write_text(broken)
    assert latest_audit(tmp_path) is None


def test_publisher_adapters_are_in_the_view_and_two_actives_or_lost_lines_are_problems():
    from rich.console import Console

    from twinstream.ops.overview import AdapterView, Overview, PipelineView
    from twinstream.ops.status_view import view as status_view

    view = PipelineView(
        name="p", active="a", problems=[], engines=[], takeovers=[], snapshots=[], audit=None
    )
    view.add_adapters(
        [
            AdapterView(
                adapter_id="x",
                role="active",
                epoch=3,
                published=1200,
                position="f@1.a:9",
                source_lag=20480,
                not_utf8=2,
            ),
            AdapterView(adapter_id="y", role="standby", last_error="Fenced: took over"),
        ]
    )
    assert view.problems == []
    out = Console(width=200, record=True)
    out.print(status_view(Overview(generated_at="now", pipelines=[view])))
    rows = [" ".join(line.replace("│", " ").split()) for line in out.export_text().splitlines()]
    assert "publisher adapters of p" in rows
    assert "x active 3 f@1.a:9 20,480 B 1,200 2 not UTF-8 -" in rows
    assert "y standby - - - 0 - Fenced: took over" in rows
    view = PipelineView(
        name="p", active="a", problems=[], engines=[], takeovers=[], snapshots=[], audit=None
    )
    view.add_adapters(
        [
            AdapterView(adapter_id="x", role="active", lost=["after f@1.a:9: gone"]),
            AdapterView(adapter_id="y", role="active"),
        ]
    )
    assert view.problems == [
        "2 publisher adapters say they are active (x, y): the one fenced last writes nothing "
        "more; check their ZooKeeper sessions",
        "publisher x: lines lost after f@1.a:9: gone",
    ]


def test_the_adapter_view_is_the_adapters_status_with_its_id_in_the_json_shape_it_had():
    """`twinstream status` and the page build an AdapterView from each status node: the
    view is the one Status shape with the adapter's id, so a field the adapter writes
    reaches both, and `twinstream status --json` keeps its keys in their order."""
    from twinstream.edge.publisher import Status
    from twinstream.ops.overview import AdapterView

    assert issubclass(AdapterView, Status)
    status = Status(role="active", epoch=2, position="stdin@0.L3:30", source_lag=7, not_utf8=1)
    view = AdapterView(adapter_id="x", **status.model_dump())
    assert (view.source_lag, view.not_utf8, view.unreadable_text()) == (7, 1, "1 not UTF-8")
    assert list(json.loads(view.model_dump_json())) == [
        "adapter_id",
        "role",
        "epoch",
        "position",
        "seq",
        "published",
        "too_long",
        "not_utf8",
        "lost",
        "last_error",
        "source_lag",
    ]


class _Zk:
    """A kazoo client as AdapterReader uses it: started (or not), connected (or not)."""

    def __init__(self, nodes: dict[str, bytes], fails: bool = False) -> None:
        self.nodes, self.fails = nodes, fails
        self.connected = False
        self.closed = False

    def start(self, timeout: float) -> None:
        if self.fails:
            raise TimeoutError("Connection time-out")
        self.connected = True

    def stop(self) -> None:
        self.connected = False

    def close(self) -> None:
        self.closed = True

    def get_children(self, path: str) -> list[str]:
        return [p.rsplit("/", 1)[1] for p in self.nodes if p.rsplit("/", 1)[0] == path]

    def get(self, path: str) -> tuple[bytes, None]:
        return self.nodes[path], None


def test_the_adapter_reader_reads_the_status_nodes_and_waits_before_trying_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """The one reader of `twinstream status` and the page: a ZooKeeper that does not
    answer is asked again only after retry_s (the page polls every second), and a lost
    connection is made again."""
    import json

    import twinstream.core.election as election
    from twinstream.ops.overview import AdapterReader

    settings = load_settings(pipeline="hostmetrics", zk_password="pw", state_dir=tmp_path)
    node = "/twinstream/hostmetrics/publishers/status/in-1"
    status = {"role": "active", "epoch": 4, "position": "f@1.a:9", "source_lag": 12}
    made: list[_Zk] = []
    answering = {"now": False}

    def zk_client(_connection: object, **_kw: object) -> _Zk:
        made.append(_Zk({node: json.dumps(status).encode()}, fails=not answering["now"]))
        return made[-1]

    monkeypatch.setattr(election, "zk_client", zk_client)
    now = {"t": 100.0}
    read = AdapterReader(retry_s=30.0, clock=lambda: now["t"])
    assert read(settings) == []
    assert read(settings) == []  # not asked again yet
    assert len(made) == 1
    assert made[0].closed
    answering["now"] = True
    now["t"] += 31
    (view,) = read(settings)
    assert (view.adapter_id, view.role, view.epoch, view.source_lag) == ("in-1", "active", 4, 12)
    assert len(made) == 2
    read(settings)
    assert len(made) == 2  # one connection for every read
    made[1].connected = False  # the connection was lost
    assert [v.adapter_id for v in read(settings)] == ["in-1"]
    assert len(made) == 3
    assert made[1].closed
    read.close()
    assert made[2].closed


def test_each_engine_shows_the_code_it_runs_and_one_whose_files_changed_is_a_warning(
    tmp_path: Path,
):
    from rich.console import Console

    from twinstream.ops.status_view import engines_table

    running = {"pipeline_version": "2+0123456789ab", "code_on_disk": "0123456789ab"}
    changed = {"pipeline_version": "2+0123456789ab", "code_on_disk": "ffffffffffff", "stale": True}
    answers = {
        "a": ({**ACTIVE[0], **running}, ACTIVE[1]),
        "b": (
            {"role": "standby", "epoch": 7, **changed},
            {"processed": {0: 100, 1: 50}, "in_sync": True},
        ),
        "c": ACTIVE,
        "d": standby({0: 100}, 0, in_sync=True),
    }
    host = overview(pipelines(tmp_path), fake_engines(answers), with_history=False).pipelines[0]
    a, b = host.engines
    assert (a.pipeline_version, a.stale, a.health) == ("2+0123456789ab", False, "ok")
    assert (b.pipeline_version, b.code_on_disk, b.stale, b.health) == (
        "2+0123456789ab",
        "ffffffffffff",
        True,
        WARN,
    )
    assert host.problems == []  # a change not deployed yet is no fault of the output
    out = Console(width=400, record=True)
    out.print(engines_table(host))
    text = out.export_text()
    assert "2+0123456789ab" in text
    assert "CODE CHANGED ON DISK (now ffffffffffff)" in text


def test_the_last_deploy_is_in_the_view_and_the_status_text(tmp_path: Path):
    from twinstream.ops.status_view import history

    answers = {"a": ACTIVE, "b": standby({0: 100, 1: 50}, 50, in_sync=True), "c": None, "d": None}
    line = "2+bbb (from 1+aaa); version 1+aaa up to msg_id 0:510, 1:490, 2+bbb after"
    seen = overview(
        pipelines(tmp_path),
        fake_engines(answers),
        with_history=False,
        deploys=lambda s: line if s.pipeline == "hostmetrics" else None,
    )
    host, pay = seen.pipelines
    assert (host.deploy, pay.deploy) == (line, None)
    assert f"last deploy: {line}" in history(host).plain
    assert "last deploy" not in history(pay).plain
