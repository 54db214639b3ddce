"""The failover drill's logic with fake engines, a fake outbound tail and a fake clock."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from tests.unit.fakes import FakeClock, disagreement, pipeline_info, server_info
from twinstream.engine.api import (
    AgreementInfo,
    BufferedRow,
    EngineApi,
    PipelineInfo,
    RestoreReport,
    ServerInfo,
    TimelineInfo,
)
from twinstream.engine.client import EngineError
from twinstream.engine.snapshot import Manifest
from twinstream.ops import drill
from twinstream.ops.drill import Takeover
from twinstream.ops.operate import OperateError
from twinstream.ops.overview import EngineView
from twinstream.platform.settings import load_settings


def view(engine_id: str, role="standby", in_sync=True, **kw: Any) -> EngineView:
    fields: dict[str, Any] = {"zk_state": "CONNECTED", "state": "running", "lag": 0, **kw}
    return EngineView(
        pipeline="hostmetrics", engine_id=engine_id, role=role, in_sync=in_sync, **fields
    )


class Engine:
    """An engine whose role flips to active at `active_at` on the shared clock."""

    def __init__(self, engine_id: str, clock: FakeClock, role: str, active_at: float | None = None):
        self.engine_id = engine_id
        # The epoch this engine holds when active: the old active 7, a successor 8.
        self.epoch = 7 if role == "active" else 8
        self.clock = clock
        self._role = role
        self.active_at = active_at
        self.calls: list[str] = []
        self.published: list[int | None] = [41]
        self.unreachable_until = 0.0

    def server(self) -> ServerInfo:
        if self.clock.now < self.unreachable_until:
            raise EngineError(self.engine_id, "GET /server", None, "refused")
        role = self._role
        if self.active_at is not None and self.clock.now >= self.active_at:
            role = "active"
        return server_info(engine_id=self.engine_id, role=role, epoch=self.epoch)

    def pipeline(self) -> PipelineInfo:
        value = self.published.pop(0) if len(self.published) > 1 else self.published[0]
        return pipeline_info(last_msg_id_published=value)

    def timeline(self) -> TimelineInfo:
        raise NotImplementedError

    def stop(self) -> PipelineInfo:
        self.calls.append("stop")
        self._role = "none"
        return pipeline_info(state="stopped")

    def start(self) -> PipelineInfo:
        self.calls.append("start")
        return pipeline_info()

    def persist(self) -> Manifest:
        raise NotImplementedError

    def restore(self, snapshot: str) -> RestoreReport:
        raise NotImplementedError

    def buffer(self, last: int) -> list[BufferedRow]:
        raise NotImplementedError

    def override(self) -> PipelineInfo:
        raise NotImplementedError  # the drill never overrides

    def metrics(self) -> str:
        raise NotImplementedError


# What the drill takes an engine as: mypy checks the fake against the one protocol.
_AN_ENGINE: type[EngineApi] = Engine


class Tail:
    """The outbound topic: the new epoch's first record becomes visible at `first_at`."""

    def __init__(self, clock: FakeClock, first_at: float | None) -> None:
        self.clock = clock
        self.first_at = first_at

    def poll(self, timeout_s: float) -> int | None:
        self.clock.now += timeout_s
        if self.first_at is not None and self.clock.now >= self.first_at:
            return 8
        return 7


def test_the_plan_needs_one_active_agreed_by_zookeeper_and_an_in_sync_standby():
    views = [view("a", role="active"), view("b")]
    assert drill.plan(views, "a") == {"active": "a", "standbys": ["b"]}
    with pytest.raises(OperateError, match="ZooKeeper names b the leader"):
        drill.plan(views, "b")
    with pytest.raises(OperateError, match=r"no in-sync standby.*restore_and_resync"):
        drill.plan([view("a", role="active"), view("b", in_sync=False)], "a")
    with pytest.raises(OperateError, match="exactly one running active"):
        drill.plan([view("a"), view("b")], None)
    # A standby whose rows disagree takes no part in the election: it cannot take over.
    disagrees = AgreementInfo.model_validate(disagreement())
    with pytest.raises(OperateError, match=r"no in-sync standby that may take over.*DISAGREES"):
        drill.plan([view("a", role="active"), view("b", agreement=disagrees)], "a")
    with pytest.raises(OperateError, match="exactly one running active"):
        drill.plan([view("a", role="active", zk_state="SUSPENDED"), view("b")], "a")


def test_the_takeover_is_timed_from_the_stop_to_the_role_and_to_the_first_output():
    clock = FakeClock(100.0)
    a = Engine("a", clock, "active")
    b = Engine("b", clock, "standby", active_at=101.2)
    # b's admin API is busy for a moment: the drill keeps looking instead of failing.
    b.unreachable_until = 100.5
    result = drill.stop_and_measure(a, {"b": b}, Tail(clock, first_at=101.9), clock=clock)
    assert a.calls == ["stop"]
    assert (result.stopped, result.old_epoch, result.last_published_before) == ("a", 7, 41)
    assert (result.new_active, result.new_epoch) == ("b", 8)
    assert result.role_s == pytest.approx(1.2, abs=0.11)
    assert result.first_output_s == pytest.approx(1.9, abs=0.11)
    assert f"b active in {result.role_s:.3f} s (epoch 8)" in result.describe()


def test_an_unreachable_standby_is_reported_once_per_outage_not_every_poll(caplog):
    clock = FakeClock(100.0)
    a = Engine("a", clock, "active")
    b = Engine("b", clock, "standby", active_at=103.0)
    b.unreachable_until = 102.0  # 20 polls of its admin API refused
    down = Engine("c", clock, "standby")
    down.unreachable_until = 1e9  # stopped for the whole measurement
    caplog.set_level(logging.INFO, logger=drill.log.name)
    result = drill.stop_and_measure(a, {"b": b, "c": down}, Tail(clock, 103.5), clock=clock)
    assert result.new_active == "b"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert any("engine b" in w and "refused" in w for w in warnings)
    assert any("engine c" in w for w in warnings)
    assert "drill: engine b answers again" in caplog.text


def test_no_output_without_input_is_reported_not_failed():
    clock = FakeClock(100.0)
    a, b = Engine("a", clock, "active"), Engine("b", clock, "standby", active_at=101.0)
    result = drill.stop_and_measure(a, {"b": b}, Tail(clock, None), timeout_s=10, clock=clock)
    assert result.first_output_s is None
    assert "first output of the new epoch not seen" in result.describe()
    assert clock.now == pytest.approx(110, abs=0.2)  # waited the whole timeout, no longer


def test_no_takeover_restarts_the_stopped_engine_and_fails():
    clock = FakeClock(100.0)
    a, b = Engine("a", clock, "active"), Engine("b", clock, "standby")
    with pytest.raises(OperateError, match=r"no standby of \['b'\] became active.*started again"):
        drill.stop_and_measure(a, {"b": b}, Tail(clock, None), timeout_s=5, clock=clock)
    assert a.calls == ["stop", "start"]


def test_a_retried_stop_refuses_instead_of_stopping_the_new_active():
    clock = FakeClock(100.0)
    a = Engine("a", clock, "none")
    with pytest.raises(OperateError, match=r"no longer the active.*trigger a new drill"):
        drill.stop_and_measure(a, {}, Tail(clock, None), clock=clock)
    assert a.calls == []


def span(first, last, outputs):
    return {"first": first, "last": last, "outputs": outputs, "dead_letters": 0}


def test_the_window_audit_names_gaps_and_duplicates():
    takeover = {"last_published_before": 1500}
    first, end = drill.window_bounds(takeover, 1600)
    assert (first, end) == (501, 1601)
    progress = [
        (
            "progress",
            last,
            json.dumps({"first": i, "last": last, "outputs": 100, "dead_letters": 0}),
        )
        for i in range(0, 1700, 100)
        for last in [i + 99]
    ]
    clean = [*progress, *(("out", i, "{}") for i in range(0, 1700))]
    assert drill.audit_window(clean, first, end)["records"] == 1100
    # The transaction of 1500..1599 lost, one of 1502..1599 in its place: 1500 and 1501
    # are missing (1550's repeat is inside a range whose count is off).
    broken = [p for p in progress if p[1] != 1599]
    broken.append(("progress", 1599, json.dumps(span(1502, 1599, 98))))
    broken += [("out", i, "{}") for i in range(0, 1700) if i not in (1500, 1501)]
    broken.append(("out", 1550, "{}"))
    with pytest.raises(OperateError, match=r"missing 1500..1501; duplicated none; .* 1502..1599"):
        drill.audit_window(broken, first, end)


def test_the_window_cannot_be_audited_before_new_output():
    with pytest.raises(OperateError, match="published nothing after msg_id 1500"):
        drill.window_bounds({"last_published_before": 1500}, 1500)
    with pytest.raises(OperateError, match="nothing had been published"):
        drill.window_bounds({"last_published_before": None}, 10)


def test_the_handover_audit_waits_for_new_output_with_progress(monkeypatch, caplog, tmp_path):
    clock = FakeClock(100.0)
    b = Engine("b", clock, "active")
    b.published = [1500, 1500, 1502]
    monkeypatch.setattr(
        "twinstream.ops.operate.committed_since",
        lambda _settings, first, partition=0: (
            [("out", type("R", (), {"msg_id": i, "value": "{}"})()) for i in range(first, 1503)]
            + [
                (
                    "progress",
                    type("R", (), {"msg_id": 1502, "value": json.dumps(span(0, 1502, 1503))})(),
                )
            ]
        ),
    )
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.now += seconds

    caplog.set_level("INFO")
    report = drill.audit_handover(
        load_settings(state_dir=tmp_path),
        b,
        {"last_published_before": 1500},
        clock=clock,
        sleep=sleep,
    )
    assert report["ok"]
    assert report["end_msg_id"] == 1503
    assert len(slept) == 2
    assert "waiting for b to publish past msg_id 1500" in caplog.text


def test_the_figures_line_has_everything_operators_compare():
    takeover = Takeover("a", 7, 41, "b", 8, 1.234, 1.9)
    line = drill.figures(
        drill.as_dict(takeover),
        {"first_msg_id": 0, "end_msg_id": 100, "records": 100},
        "engine a: in sync, role standby",
    )
    assert "stopped a (epoch 7" in line
    assert "b active in 1.234 s (epoch 8)" in line
    assert "first output of the new epoch 1.900 s" in line
    assert "msg_id 0..99: 100 records, 0 missing, 0 duplicated" in line
    assert line.endswith("engine a: in sync, role standby")


def test_the_handover_is_audited_in_every_partition_that_got_input(monkeypatch, tmp_path):
    """Three partitions: each gets its own window from its own last published msg_id;
    one without input after the handover is named, not audited."""
    clock = FakeClock(100.0)
    before = {0: 1500, 1: 700, 2: 40}
    now = {0: 1502, 1: 705, 2: 40}

    class ThreePartitions(Engine):
        def pipeline(self) -> PipelineInfo:
            return pipeline_info(last_msg_id_published=None, published=now)

    asked: list[tuple[int, int]] = []

    def committed_since(_settings, first, partition=0):
        asked.append((partition, first))
        end = now[partition] + 1
        record = type("R", (), {"value": "{}"})
        outputs = [("out", type("R", (record,), {"msg_id": i})()) for i in range(first, end)]
        value = json.dumps(span(first, end - 1, end - first))
        progress = type("R", (), {"msg_id": end - 1, "value": value})()
        return [*outputs, ("progress", progress)]

    monkeypatch.setattr("twinstream.ops.operate.committed_since", committed_since)
    takeover = drill.as_dict(Takeover("a", 7, None, "b", 8, 1.0, 1.5, published_before=before))
    takeover = json.loads(json.dumps(takeover))  # as the audit task gets it: an XCom
    report = drill.audit_handover(
        load_settings(state_dir=tmp_path),
        ThreePartitions("b", clock, "active"),
        takeover,
        timeout_s=10,
        clock=clock,
        sleep=lambda s: setattr(clock, "now", clock.now + s),
    )
    assert asked == [(0, 1500 - drill.AUDIT_BEFORE + 1), (1, 0)]  # 1: from its first msg_id
    assert sorted(report["partitions"]) == ["0", "1"]
    assert report["not_audited"] == [2]
    line = drill.figures(takeover, report, "rejoined")
    assert "last published msg_id 0:1500, 1:700, 2:40" in line
    assert f"audit of msg_id {1500 - drill.AUDIT_BEFORE + 1}..1502, 1:" in line
    assert "(partitions [2] had no input after it)" in line
