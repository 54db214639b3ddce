"""The operating DAGs' logic with fake engines: picking a standby, refusing a restore,
choosing a snapshot, watching for sync, comparing outputs, triggering once per incident;
how an engine is seen and described; the settings a restore run works on."""

from __future__ import annotations

import json
from datetime import datetime
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tests.unit.engine.test_snapshot import Clock, fake_checkpoint, write
from tests.unit.fakes import disagreement, pipeline_info, server_info
from twinstream.engine.api import (
    AgreementInfo,
    BufferedRow,
    EngineApi,
    PipelineInfo,
    RestoreReport,
    ServerInfo,
    TimelineInfo,
)
from twinstream.engine.client import EngineClient, EngineError
from twinstream.engine.snapshot import Manifest
from twinstream.ops import operate
from twinstream.ops.operate import OperateError
from twinstream.ops.overview import FAIL, EngineView
from twinstream.platform.settings import SettingsError, load_settings

PIPELINE = "hostmetrics"


def view(engine_id: str, role="standby", state="running", in_sync=True, **kw) -> EngineView:
    return EngineView(
        pipeline=PIPELINE,
        engine_id=engine_id,
        role=role,
        zk_state="CONNECTED",
        state=state,
        in_sync=in_sync,
        lag=0,
        **kw,
    )


def disagreeing(engine_id: str = "b", overridden: bool = False, **kw: Any) -> EngineView:
    """A running, in-sync standby whose rows of msg_id 1000 differ from the published ones."""
    agreement = AgreementInfo.model_validate(disagreement(overridden=overridden))
    return view(engine_id, agreement=agreement, **kw)


DOWN = EngineView(
    pipeline=PIPELINE, engine_id="b", problem="engine b: GET /server: unreachable: refused"
)


class FakeEngine:
    """An EngineApi: its pipeline's state in `info`, the requests that change it in `calls`;
    `refusal` makes GET /server fail as the client does (an EngineError)."""

    def __init__(
        self,
        engine_id: str = "b",
        state: str = "running",
        role: str = "standby",
        in_sync: bool = False,
    ) -> None:
        self.engine_id = engine_id
        self.info: dict[str, Any] = {
            "state": state,
            "reason": "",
            "lag": 500,
            "in_sync": in_sync,
            "events_per_s": 900.0,
        }
        self.role = role
        self.calls: list[str] = []
        self.buffered: list[BufferedRow] = []
        self.refusal: EngineError | None = None

    def server(self) -> ServerInfo:
        if self.refusal is not None:
            raise self.refusal
        return server_info(engine_id=self.engine_id, role=self.role)

    def pipeline(self) -> PipelineInfo:
        return pipeline_info(**self.info)

    def timeline(self) -> TimelineInfo:
        raise NotImplementedError  # no operation of the DAGs reads it

    def stop(self) -> PipelineInfo:
        self.calls.append("stop")
        self.info["state"] = "stopped"
        return self.pipeline()

    def start(self) -> PipelineInfo:
        self.calls.append("start")
        self.info["state"] = "running"
        return self.pipeline()

    def persist(self) -> Manifest:
        self.calls.append("persist")
        return Manifest.model_construct(snapshot_id="s", next_offset=1, size_bytes=2)

    def restore(self, snapshot: str) -> RestoreReport:
        self.calls.append(f"restore {snapshot}")
        self.info["state"] = "restoring"
        return RestoreReport(
            snapshot=snapshot, next_offset=10, log_start_offset=0, pipeline=self.pipeline()
        )

    def buffer(self, last: int) -> list[BufferedRow]:
        return self.buffered[-last:]

    def override(self) -> PipelineInfo:
        self.calls.append("override")
        return self.pipeline()

    def metrics(self) -> str:
        raise NotImplementedError  # no operation of the DAGs reads it


# What the DAGs take an engine as: mypy checks the fake against the one protocol.
_AN_ENGINE: type[EngineApi] = FakeEngine


@pytest.fixture
def settings(tmp_path):
    return load_settings(
        pipeline="hostmetrics", state_dir=tmp_path, snapshot_root=tmp_path / "snaps"
    )


# -- persist ------------------------------------------------------------------------------


def test_the_standby_is_picked_only_when_zookeeper_and_the_engine_agree():
    views = [view("a", role="active"), view("b")]
    assert operate.pick_standby(views, leader="a") == "b"
    # ZooKeeper says b leads (a takeover just happened): b is not a standby, whatever it said.
    with pytest.raises(OperateError, match=r"no in-sync standby.*ZooKeeper leader: b"):
        operate.pick_standby(views, leader="b")


@pytest.mark.parametrize(
    "b",
    [view("b", in_sync=False), view("b", state="stopped"), view("b", role="active"), DOWN],
    ids=["behind", "stopped", "active", "down"],
)
def test_no_in_sync_standby_fails_with_what_each_engine_is(b):
    with pytest.raises(OperateError) as refused:
        operate.pick_standby([view("a", role="active"), b], leader="a")
    assert "engine a: active" in str(refused.value)
    assert "engine b:" in str(refused.value)
    assert "restore_and_resync" in str(refused.value)


def test_a_disagreeing_standby_is_never_persisted_and_an_agreeing_one_comes_first():
    agrees = AgreementInfo(state="agrees", checked={0: 900}, ranges_agreed=3)
    # Three engines: b disagrees, c agrees.
    views = [view("a", role="active"), disagreeing("b"), view("c", agreement=agrees)]
    assert operate.pick_standby(views, leader="a") == "c"
    # Overridden, it may lead, but its state is still the suspect one.
    views = [view("a", role="active"), disagreeing("b", overridden=True)]
    with pytest.raises(
        OperateError,
        match=r"does not disagree.*engine b: .*disagrees at msg_id 1000.*\(overridden\)",
    ):
        operate.pick_standby(views, leader="a")
    # Of two fit standbys, the one whose snapshot would be proven.
    views = [view("a", role="active"), view("b"), view("c", agreement=agrees)]
    assert operate.pick_standby(views, leader="a") == "c"
    assert operate.pick_standby(views[:2], leader="a") == "b"


def test_a_persisted_snapshot_is_verified_on_shared_storage(settings, tmp_path):
    manifest = write(settings.snapshot_dir, fake_checkpoint(tmp_path / "e"), Clock())
    # As the verify task gets it: through an XCom, JSON (partition keys become strings).
    reply = json.loads(manifest.model_dump_json())
    assert operate.verify_persisted(settings, reply) == manifest.snapshot_id
    with pytest.raises(OperateError, match="differs from the reply"):
        operate.verify_persisted(settings, {**reply, "next_offset": 1})
    (settings.snapshot_dir / manifest.snapshot_id / "buffer.jsonl").write_text("x")
    with pytest.raises(OperateError, match=r"does not verify.*buffer.jsonl"):
        operate.verify_persisted(settings, reply)


# -- restore ------------------------------------------------------------------------------


def test_assess_refuses_the_active_a_healthy_standby_and_an_unreachable_engine():
    with pytest.raises(OperateError, match="is the active"):
        operate.assess(view("b", role="active"), force=True)
    with pytest.raises(OperateError, match=r"healthy and in sync.*force"):
        operate.assess(view("b"), force=False)
    assert "engine b" in operate.assess(view("b"), force=True)
    with pytest.raises(OperateError, match=r"unreachable.*start its process"):
        operate.assess(DOWN, force=True)
    stopped = view("b", role="none", state="stopped", in_sync=False, reason="no checkpoint")
    assert "no checkpoint" in operate.assess(stopped, force=False)


def test_a_disagreeing_standby_is_restored_without_force_and_stopped_for_it():
    assert "DISAGREES" in operate.assess(disagreeing("b"), force=False)
    # Overridden: an operator chose to keep it; restoring it takes force, as for any other.
    with pytest.raises(OperateError, match="healthy and in sync"):
        operate.assess(disagreeing("b", overridden=True), force=False)
    with pytest.raises(OperateError, match="is the active"):
        operate.assess(disagreeing("b", role="active"), force=False)
    engine = FakeEngine(state="running", in_sync=True)
    engine.info["agreement"] = disagreement()
    operate.start_restore(engine, PIPELINE, "s1", force=False)
    assert engine.calls == ["stop", "restore s1"]


def proven(settings, manifest: Manifest) -> None:
    """Marks a written snapshot as taken by an agreeing engine, as the engine writes it."""
    path = settings.snapshot_dir / manifest.snapshot_id / "manifest.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "agreement": "agrees", "agreed_through": {"0": 60}}))


def test_choose_proven_takes_the_newest_snapshot_of_an_agreeing_engine(settings, tmp_path, caplog):
    clock = Clock()
    cp = fake_checkpoint(tmp_path / "e")
    old = write(settings.snapshot_dir, cp, clock)
    write(settings.snapshot_dir, cp, clock)  # newer, unchecked: not proven
    # None proven yet: a cold rebuild, and the log says why.
    with caplog.at_level("WARNING"):
        assert operate.choose_snapshot(settings, "proven", {0: 0}) == "cold"
    assert "no proven snapshot of pipeline hostmetrics" in caplog.text
    assert "cold rebuild instead" in caplog.text
    proven(settings, old)
    assert operate.choose_snapshot(settings, "proven", {0: 0}) == old.snapshot_id
    assert operate.choose_snapshot(settings, "latest", {0: 0}) != old.snapshot_id
    # Kafka deleted what the proven one replays: cold too, saying so.
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert operate.choose_snapshot(settings, "proven", {0: 67}) == "cold"
    assert f"the newest proven snapshot {old.snapshot_id} continues at inbound offset 66" in (
        caplog.text
    )


def test_choose_snapshot_checks_checksums_and_kafkas_log_start(settings, tmp_path):
    clock = Clock()
    cp = fake_checkpoint(tmp_path / "e")
    old = write(settings.snapshot_dir, cp, clock)
    new = write(settings.snapshot_dir, cp, clock)
    assert operate.choose_snapshot(settings, "latest", {0: 0}) == new.snapshot_id
    assert operate.choose_snapshot(settings, old.snapshot_id, {0: 66}) == old.snapshot_id
    with pytest.raises(OperateError, match=r"continues at inbound offset 66 where it starts at 67"):
        operate.choose_snapshot(settings, "latest", {0: 67})
    assert operate.choose_snapshot(settings, "cold", {0: 10**9}) == "cold"
    (settings.snapshot_dir / new.snapshot_id / "buffer.jsonl").write_text("")
    with pytest.raises(OperateError, match="damaged or truncated"):
        operate.choose_snapshot(settings, new.snapshot_id, {0: 0})
    assert operate.choose_snapshot(settings, "latest", {0: 0}) == old.snapshot_id


def test_choose_snapshot_checks_kafkas_log_start_in_every_partition(settings, tmp_path):
    manifest = write(settings.snapshot_dir, fake_checkpoint(tmp_path / "e"), Clock())
    positions = {0: 66, 1: 40, 2: 12}
    path = settings.snapshot_dir / manifest.snapshot_id / "manifest.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "next_offsets": {str(p): o for p, o in positions.items()}}))
    starts = {0: 0, 1: 40, 2: 0}
    assert operate.choose_snapshot(settings, "latest", starts) == manifest.snapshot_id
    with pytest.raises(OperateError, match=r"offset 2:12 where it starts at 13"):
        operate.choose_snapshot(settings, "latest", {**starts, 2: 13})


def test_a_restore_stops_a_running_engine_only_when_forced():
    engine = FakeEngine(state="running")
    with pytest.raises(OperateError, match="force"):
        operate.start_restore(engine, PIPELINE, "latest", force=False)
    assert engine.calls == []
    report = operate.start_restore(engine, PIPELINE, "s1", force=True)
    assert engine.calls == ["stop", "restore s1"]
    assert report["snapshot"] == "s1"
    assert report["started_at"] > 0


def test_sync_check_reports_progress_then_done_then_times_out():
    engine = FakeEngine(state="restoring")
    check = operate.sync_check(engine, started_at=100.0, wait_s=60, now=110.0)
    assert not check.done
    assert check.message == (
        "engine b: restoring, lag 500, 900.0 events/s, agreement unchecked (0 ranges agreed), "
        "10 s since the restore"
    )
    engine.info["events_per_s"] = None
    check = operate.sync_check(engine, 100.0, wait_s=60, now=110.0, since="its start")
    assert check.message == (
        "engine b: restoring, lag 500, - events/s, agreement unchecked (0 ranges agreed), "
        "10 s since its start"
    )
    with pytest.raises(OperateError, match="not in sync after the 60 s allowed"):
        operate.sync_check(engine, started_at=100.0, wait_s=60, now=161.0)
    engine.info.update(state="running", in_sync=True, lag=3)
    assert operate.sync_check(engine, started_at=100.0, wait_s=60, now=170.0).done
    engine.info.update(state="failed", reason="streaming query stopped: boom")
    with pytest.raises(OperateError, match="pipeline is failed: streaming query stopped"):
        operate.sync_check(engine, started_at=100.0, wait_s=60, now=120.0)


def test_sync_check_fails_when_the_restored_engine_disagrees_again():
    found = datetime.fromisoformat(str(disagreement()["difference"]["found_at"])).timestamp()
    engine = FakeEngine(state="running", in_sync=True)
    engine.info["agreement"] = {"state": "agrees", "checked": {0: 70}, "ranges_agreed": 4}
    check = operate.sync_check(engine, started_at=found - 5, wait_s=60, now=found + 1)
    assert check.done
    assert "agreement agrees (4 ranges agreed)" in check.message
    engine.info["agreement"] = disagreement()
    # Found after the restore began: a new difference, the restore did not cure it.
    with pytest.raises(OperateError) as again:
        operate.sync_check(engine, started_at=found - 5, wait_s=60, now=found + 1)
    assert "agreement disagrees" in str(again.value)
    assert "disagrees with the published output again at msg_id 1000 (the active's" in str(
        again.value
    )
    assert "snapshot 'cold'" in str(again.value)
    # Found before it: the engine still shows the one being cured; no verdict yet.
    assert operate.sync_check(engine, started_at=found + 5, wait_s=60, now=found + 6).done


def _row(msg_id: int, value: str = "v", kind: str = "out") -> BufferedRow:
    return BufferedRow(msg_id=msg_id, kind=kind, key="h", value=f"{value}{msg_id}")


def test_buffered_outputs_are_compared_with_the_published_ones():
    published = {i: [("out", "h", f"v{i}")] for i in range(10, 20)}
    same = operate.compare_buffer([_row(i) for i in range(5, 25)], published)
    # 5..9 were published before what was read; 20..24 not yet: only 10..19 count... and
    # 5..9 are reported as missing, since they are at or below the last published msg_id.
    assert same.compared == 15
    assert len(same.mismatches) == 5
    assert same.mismatches[0] == "msg_id 5: buffered, but not in the outbound topics"

    exact = operate.compare_buffer([_row(i) for i in range(10, 25)], published)
    assert (exact.compared, exact.mismatches) == (10, [])
    assert (exact.first_msg_id, exact.last_msg_id) == (10, 19)

    differs = operate.compare_buffer([_row(i) for i in range(10, 15)] + [_row(15, "x")], published)
    assert differs.mismatches == [
        "msg_id 15: buffered [('out', 'h', 'x15')], published [('out', 'h', 'v15')]"
    ]
    wrong_topic = operate.compare_buffer([_row(12, kind="dlq")], published)
    assert len(wrong_topic.mismatches) == 1


def test_fan_outs_and_inputs_without_output_compare_whole():
    published = {3: [("out", "k", "a"), ("out", "k", "b")], 5: [("out", "k", "c")]}
    buffered = [
        BufferedRow(msg_id=3, kind="out", key="k", value="a"),
        BufferedRow(msg_id=3, kind="out", key="k", value="b"),
        BufferedRow(msg_id=4, kind="none", key=None, value=""),
        BufferedRow(msg_id=5, kind="out", key="k", value="c"),
    ]
    result = operate.compare_buffer(buffered, published)
    assert (result.compared, result.mismatches) == (3, [])
    half = operate.compare_buffer(buffered[:1] + buffered[2:], published)
    assert half.mismatches == [
        "msg_id 3: buffered [('out', 'k', 'a')], published [('out', 'k', 'a'), ('out', 'k', 'b')]"
    ]


def test_published_records_are_grouped_by_msg_id_without_the_progress_records(
    settings, monkeypatch
):
    def record(msg_id, value):
        return type("R", (), {"msg_id": msg_id, "key": "k", "value": value})()

    monkeypatch.setattr(
        operate,
        "committed_since",
        lambda _s, _first, _t, kinds, partition=0: [
            (kind, r)
            for kind, r in [
                ("out", record(3, "a")),
                ("out", record(3, "b")),
                ("progress", record(3, "{}")),
                ("dlq", record(4, "d")),
            ]
            if kind in kinds
        ],
    )
    assert operate.published_since(settings, 3) == {
        3: [("out", "k", "a"), ("out", "k", "b")],
        4: [("dlq", "k", "d")],
    }


def test_check_buffer_fails_on_a_mismatch_and_on_nothing_to_compare(settings, monkeypatch):
    engine = FakeEngine()
    with pytest.raises(OperateError, match="buffer is empty"):
        operate.check_buffer(engine, settings, 10)
    engine.buffered = [_row(i) for i in range(10, 20)]
    monkeypatch.setattr(
        operate,
        "published_since",
        lambda _s, first, partition=0: {i: [("out", "h", f"v{i}")] for i in range(first, 18)},
    )
    result = operate.check_buffer(engine, settings, 10)
    assert (result.compared, result.last_msg_id) == (8, 17)
    monkeypatch.setattr(
        operate, "published_since", lambda _s, first, partition=0: {5: [("out", "h", "v5")]}
    )
    with pytest.raises(OperateError, match="none of its 10 buffered outputs"):
        operate.check_buffer(engine, settings, 10)
    monkeypatch.setattr(
        operate,
        "published_since",
        lambda _s, first, partition=0: {i: [("out", "h", "x")] for i in range(10, 20)},
    )
    with pytest.raises(OperateError, match="10 of 10 buffered outputs differ"):
        operate.check_buffer(engine, settings, 10)


def test_check_buffer_compares_each_partition_with_its_own_published_records(settings, monkeypatch):
    engine = FakeEngine()
    engine.buffered = [
        BufferedRow(msg_id=i, kind="out", key="h", value=f"p{p}v{i}", partition=p)
        for p in (0, 2)
        for i in range(10 * (p + 1), 10 * (p + 1) + 5)
    ]
    asked = []

    def published(_s, first, partition=0):
        asked.append((partition, first))
        return {i: [("out", "h", f"p{partition}v{i}")] for i in range(first, first + 5)}

    monkeypatch.setattr(operate, "published_since", published)
    result = operate.check_buffer(engine, settings, 10)
    assert asked == [(0, 10), (2, 30)]
    assert (result.compared, result.ranges) == (10, ["10..14", "2:30..2:34"])

    def wrong(_s, first, partition=0):
        return {i: [("out", "h", f"p0v{i}")] for i in range(first, first + 5)}

    monkeypatch.setattr(operate, "published_since", wrong)
    with pytest.raises(OperateError, match=r"5 of 10 buffered outputs differ.*\n.*msg_id 2:30"):
        operate.check_buffer(engine, settings, 10)


# -- seeing an engine ---------------------------------------------------------------------


def test_an_engine_is_seen_as_the_overview_sees_it_and_described_in_one_line():
    engine = FakeEngine(state="running", role="standby")
    seen = operate.observe(engine, PIPELINE)
    assert (seen.pipeline, seen.engine_id, seen.problem) == (PIPELINE, "b", None)
    assert (seen.role, seen.zk_state, seen.state, seen.in_sync, seen.lag) == (
        "standby",
        "CONNECTED",
        "running",
        False,
        500,
    )
    assert seen.healthy
    assert seen.describe() == "engine b: standby, pipeline running, not in sync (lag 500)"
    engine.info.update(state="stopped", reason="no checkpoint", in_sync=False)
    engine.role = "none"
    stopped = operate.observe(engine, PIPELINE)
    assert not stopped.healthy
    assert stopped.describe() == (
        "engine b: none, pipeline stopped, no checkpoint, not in sync (lag 500)"
    )
    engine.info.update(state="running", reason="", in_sync=True, lag=0)
    engine.role = "active"
    assert operate.observe(engine, PIPELINE).describe() == (
        "engine b: active, pipeline running, in sync"
    )
    engine.role = "standby"
    engine.info["agreement"] = disagreement()
    disagrees = operate.observe(engine, PIPELINE)
    assert (disagrees.healthy, disagrees.agreement.state) == (False, "disagrees")
    assert disagrees.describe() == (
        "engine b: standby, pipeline running, in sync, DISAGREES with the published output at "
        "msg_id 1000 (the active's transaction of msg_id 950..1040, epoch 3): restore it "
        "(restore_and_resync, snapshot proven) or override (POST /pipeline/override)"
    )


def test_an_engine_that_does_not_answer_is_described_with_the_whole_error():
    engine = FakeEngine()
    engine.refusal = EngineError("b", "GET /server", None, "http://x:1: refused")
    seen = operate.observe(engine, PIPELINE)
    assert seen.problem == "engine b: GET /server: unreachable: http://x:1: refused"
    assert (seen.healthy, seen.unauthorized, seen.health, seen.role) == (False, False, FAIL, None)
    assert seen.describe() == (
        "engine b: unreachable (engine b: GET /server: unreachable: http://x:1: refused)"
    )
    engine.refusal = EngineError("b", "GET /server", 401, "wrong bearer token")
    refused = operate.observe(engine, PIPELINE)
    assert refused.unauthorized
    assert refused.describe() == (
        "engine b: unreachable (engine b: GET /server: HTTP 401: wrong bearer token)"
    )


def test_a_restore_run_works_on_the_pipeline_of_its_engine():
    # The test stack (tests/stack-pipelines.toml): hostmetrics runs a and b, payments c, d.
    payments = operate.engine_settings({"engine": "d", "force": False})
    assert (payments.pipeline, payments.engine_ids) == ("payments", ["c", "d"])
    assert payments.inbound_topic == "payments.in"
    assert operate.engine_settings({"engine": "a"}).pipeline == "hostmetrics"
    with pytest.raises(SettingsError, match=r"no pipeline of this stack runs engine 'z'"):
        operate.engine_settings({"engine": "z"})


# -- watch --------------------------------------------------------------------------------


def test_an_engine_down_past_the_grace_period_is_restored_once_per_incident():
    memory: dict[str, Any] = {}
    healthy_a = view("a", role="active")
    stopped_b = view("b", role="none", state="stopped", in_sync=False)

    todo, memory = operate.engines_to_restore(
        [healthy_a, stopped_b], memory, now=1000.0, grace_s=120
    )
    assert todo == []
    assert memory["b"]["since"] == 1000.0
    todo, memory = operate.engines_to_restore(
        [healthy_a, stopped_b], memory, now=1119.0, grace_s=120
    )
    assert todo == []
    todo, memory = operate.engines_to_restore([healthy_a, DOWN], memory, now=1120.0, grace_s=120)
    assert todo == ["b"]
    for minute in range(1, 10):
        todo, memory = operate.engines_to_restore(
            [healthy_a, DOWN], memory, 1120.0 + 60 * minute, 120
        )
        assert todo == []
    # Restoring counts as healthy: the incident closes, and a later failure is a new one.
    todo, memory = operate.engines_to_restore(
        [healthy_a, view("b", state="restoring")], memory, 2000.0, 120
    )
    assert (todo, memory) == ([], {})
    todo, memory = operate.engines_to_restore(
        [healthy_a, stopped_b], memory, now=3000.0, grace_s=120
    )
    todo, memory = operate.engines_to_restore(
        [healthy_a, stopped_b], memory, now=3120.0, grace_s=120
    )
    assert todo == ["b"]
    json.dumps(memory)  # what the DAG stores in its Variable


def test_a_disagreeing_standby_is_restored_at_once_and_once_per_incident(caplog):
    healthy_a = view("a", role="active")
    with caplog.at_level("WARNING"):
        todo, memory = operate.engines_to_restore(
            [healthy_a, disagreeing("b")], {}, now=1000.0, grace_s=120
        )
    assert todo == ["b"]
    assert "engine b of pipeline hostmetrics: triggering restore_and_resync (snapshot proven)" in (
        caplog.text
    )
    assert "msg_id 1000" in caplog.text
    for minute in range(1, 5):
        todo, memory = operate.engines_to_restore(
            [healthy_a, disagreeing("b")], memory, 1000.0 + 60 * minute, 120
        )
        assert todo == []
    # Restored (agreement starts over): the incident closes.
    todo, memory = operate.engines_to_restore(
        [healthy_a, view("b", state="restoring")], memory, 1400.0, 120
    )
    assert (todo, memory) == ([], {})
    # Overridden by an operator: left alone.
    todo, memory = operate.engines_to_restore(
        [healthy_a, disagreeing("b", overridden=True)], {}, 2000.0, 120
    )
    assert (todo, memory) == ([], {})


def test_a_restore_that_does_not_heal_is_not_made_again_past_the_cap_and_says_why(caplog):
    """The loop a user met: a standby restored, disagreeing again, restored again, five
    times in 11 minutes. Whatever the cause, two restores an hour, then the reason."""
    healthy_a = view("a", role="active")
    restored: dict[str, list[float]] = {}
    cap = operate.RestoreCap(restores=2, window_s=3600)
    memory: dict[str, Any] = {}
    made = []
    for minute in range(12):
        now = 1000.0 + 60 * minute
        # Each restore "heals" it for a look (restoring), then it disagrees again.
        b = view("b", state="restoring") if minute % 3 == 1 else disagreeing("b")
        with caplog.at_level("ERROR"):
            todo, memory = operate.engines_to_restore(
                [healthy_a, b], memory, now, 120, restored, cap
            )
        made += todo
    assert made == ["b", "b"]
    assert "not restoring it again: restored 2 times in the last 60 min (at most 2)" in (
        caplog.text
    )
    assert "trigger restore_and_resync by hand" in caplog.text
    json.dumps(restored)  # what the DAG stores in its Variable
    # An hour after the first, one restore is allowed again.
    todo, memory = operate.engines_to_restore(
        [healthy_a, disagreeing("b")], {}, 1000.0 + 3600 + 1, 120, restored, cap
    )
    assert todo == ["b"]


def test_an_engine_down_past_its_cap_is_not_restored_again_either(caplog):
    restored = {"b": [900.0, 950.0]}
    with caplog.at_level("ERROR"):
        todo, _ = operate.engines_to_restore(
            [view("a", role="active"), DOWN], {"b": {"since": 800.0}}, 1000.0, 120, restored
        )
    assert todo == []
    assert "engine b: unreachable" in caplog.text
    assert "not restoring it again" in caplog.text


def test_a_disagreeing_standby_on_other_code_than_the_active_is_not_restored(caplog):
    """A restore brings back state, not code: restoring one whose code differs would only
    replay the input into the same disagreement."""
    active = view("a", role="active", pipeline_version="1+aaaaaaaaaaaa")
    newer = disagreeing("b", pipeline_version="2+bbbbbbbbbbbb")
    with caplog.at_level("WARNING"):
        todo, _ = operate.engines_to_restore([active, newer], {}, 1000.0, 120)
    assert todo == []
    assert "runs other code (2+bbbbbbbbbbbb, the active 1+aaaaaaaaaaaa): not restoring it" in (
        caplog.text
    )
    # The same code, disagreeing: barred and restored as before.
    same = disagreeing("b", pipeline_version="1+aaaaaaaaaaaa")
    todo, _ = operate.engines_to_restore([active, same], {}, 1000.0, 120)
    assert todo == ["b"]


def test_watch_engines_asks_for_the_proven_snapshot():
    assert operate.restore_conf("b") == {"engine": "b", "snapshot": "proven"}


def test_the_agreement_check_fails_naming_the_range_and_logs_an_unreachable_engine(caplog):
    views = [view("a", role="active"), view("b", agreement=AgreementInfo(state="agrees")), DOWN]
    with caplog.at_level("INFO"):
        summary = operate.agreement_verdict(PIPELINE, views)
    assert summary == (
        "pipeline hostmetrics: no engine disagrees with the published output (a unchecked, "
        "b agrees)"
    )
    assert "engine b of pipeline hostmetrics: agreement not known, it does not answer" in (
        caplog.text
    )
    with pytest.raises(OperateError) as failed:
        operate.agreement_verdict(PIPELINE, [view("a", role="active"), disagreeing("c"), DOWN])
    assert str(failed.value) == (
        "engine c disagrees with the published output at msg_id 1000 (the active's transaction "
        'of msg_id 950..1040, epoch 3): active rows [out key=h1 value={"avg": 0.5}], engine '
        'rows [out key=h1 value={"avg": 0.7}], found at 2026-11-28T02:00:00+00:00; restore it '
        "(restore_and_resync, snapshot proven) or override (POST /pipeline/override)"
    )


# -- the admin API client -----------------------------------------------------------------


def test_the_client_sends_the_token_and_turns_errors_into_reasons():
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/pipeline/persist":
            return httpx.Response(409, json={"reason": "this engine is the active"})
        if request.url.path == "/pipeline/restore":
            return httpx.Response(502, text="<html>bad gateway</html>")
        return httpx.Response(200, json=server_info(role="standby").model_dump())

    client = EngineClient("a", "http://x:1", "tok", transport=httpx.MockTransport(handler))
    assert client.server() == server_info(role="standby")
    assert seen[0].headers["authorization"] == "Bearer tok"
    with pytest.raises(
        EngineError, match="engine a: POST /pipeline/persist: HTTP 409: this engine"
    ):
        client.persist()
    with pytest.raises(EngineError, match="HTTP 502: <html>bad gateway"):
        client.restore("latest")
    assert json.loads(seen[-1].content) == {"snapshot": "latest"}


def test_an_unreachable_engine_is_an_error_naming_it():
    down = EngineClient("b", "http://127.0.0.1:9", "tok", timeout_s=1)
    with pytest.raises(EngineError, match="engine b: GET /server: unreachable"):
        down.server()
    seen = operate.observe(down, PIPELINE)
    assert seen.problem is not None
    assert seen.problem.startswith("engine b: GET /server: unreachable")
    assert not seen.healthy
    assert down.healthy() is False


def test_clients_come_from_the_airflow_connection_of_each_engine(settings):
    conns = {
        "twinstream_engine_a": SimpleNamespace(
            host="127.0.0.1", port=8701, schema="http", password="t"
        ),
        "twinstream_engine_b": SimpleNamespace(
            host="engine-b", port=8702, schema=None, password=""
        ),
    }
    make = operate.engine_client_factory(settings, conns.__getitem__)
    assert make("a").base_url == "http://127.0.0.1:8701"
    with pytest.raises(ValueError, match="engine b: the connection has no token"):
        make("b")
    with pytest.raises(OperateError, match="unknown engine 'c'; configured: a, b"):
        make("c")


def test_a_shadow_standby_is_neither_restored_nor_persisted_from():
    """On other code than the active (a deploy's new version): its differences are
    reported, not faults, and its state is another version's."""
    from twinstream.engine.api import ShadowInfo

    shadow = AgreementInfo(
        state="shadow",
        shadow=ShadowInfo(
            active_version="1+aaaaaaaaaaaa",
            version="2+bbbbbbbbbbbb",
            ranges_compared=40,
            ranges_differing=12,
            msg_ids_differing=35,
            ranges_read_back=3,
            rows_compared=900,
        ),
    )
    b = view("b", agreement=shadow)
    assert b.healthy
    assert not b.disagrees
    assert b.agreement_text() == (
        "shadow of 1+aaaaaaaaaaaa: 12 of 40 ranges differ (35 msg_ids in 3 read back; "
        "900 rows compared)"
    )
    todo, memory = operate.engines_to_restore([view("a", role="active"), b], {}, 1000.0, 120)
    assert (todo, memory) == ([], {})
    with pytest.raises(operate.OperateError):
        operate.pick_standby([view("a", role="active"), b], leader="a")


def test_sync_check_lets_a_query_restart_pass_only_when_the_caller_does():
    engine = FakeEngine(state="recovering")
    engine.info["reason"] = "streaming query stopped: Python worker failed to connect back."
    with pytest.raises(OperateError, match="pipeline is recovering: streaming query stopped"):
        operate.sync_check(engine, started_at=100.0, wait_s=60, now=110.0)
    check = operate.sync_check(engine, 100.0, wait_s=60, now=110.0, recovering_ok=True)
    assert check.recovering
    assert not check.done
    assert check.message.endswith(
        ": streaming query stopped: Python worker failed to connect back."
    )
    # Never past the wait, whatever the caller lets.
    with pytest.raises(OperateError, match="pipeline is recovering"):
        operate.sync_check(engine, 100.0, wait_s=60, now=161.0, recovering_ok=True)
