"""A deploy's steps with fake engines whose processes load the code 'on disk', a fake
election and a fake deploy log: standbys first, one at a time; the first from its checkpoint
(or a replay), the later ones from a snapshot of the new version with their own checkpoint
set aside; the switch only on the operator's word; the old active last (issue 51)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.unit.fakes import FakeClock, pipeline_info, server_info
from twinstream.core.agreement import PublishedRange
from twinstream.engine.api import (
    AgreementInfo,
    BufferedRow,
    Difference,
    PipelineInfo,
    RestoreReport,
    ServerInfo,
    ShadowInfo,
    TimelineInfo,
)
from twinstream.engine.snapshot import Manifest
from twinstream.ops import deploy
from twinstream.ops.deploy import DeployError, Deployment, Target
from twinstream.ops.deploy_log import Record

OLD, NEW = "1+aaaaaaaaaaaa", "2+bbbbbbbbbbbb"
SHAPE = "count BIGINT"
RECOVERING = "streaming query stopped: Python worker failed to connect back.; restarting in 2 s"


@dataclass
class Stack:
    """The engines, their processes and the election, as one world: `disk` is the code a
    started process loads; stopping the active's pipeline makes the first running standby
    active with the next epoch."""

    disk: str = NEW
    engines: dict[str, FakeEngine] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    snapshots: dict[str, str] = field(default_factory=dict)  # id -> version
    epoch: int = 7
    # msg_ids the active publishes between two looks at it (0.2 s apart while the switch
    # waits): 40 is 200 events/s.
    rate: int = 0
    # Looks at which an engine started by the deploy restarts its own query (-1: always).
    recovering_after_start: int = 0

    def add(self, engine_id: str, role: str, version: str = OLD) -> FakeEngine:
        engine = FakeEngine(self, engine_id, role, version)
        self.engines[engine_id] = engine
        return engine

    def elect(self) -> None:
        if any(e.role == "active" for e in self.engines.values()):
            return
        for engine in self.engines.values():
            if engine.state == "running" and engine.role == "standby":
                self.epoch += 1
                engine.role, engine.epoch = "active", self.epoch
                return

    # Processes
    def stop(self, engine_id: str) -> None:
        self.calls.append(f"stop {engine_id}")
        engine = self.engines[engine_id]
        engine.up, engine.role, engine.state = False, "none", "stopped"
        self.elect()

    def start(self, engine_id: str) -> None:
        self.calls.append(f"start {engine_id}")
        engine = self.engines[engine_id]
        engine.up, engine.version = True, self.disk
        engine.starting = engine.checkpoint is not None
        engine.recovering = self.recovering_after_start
        if engine.checkpoint is None:
            engine.state = "stopped"  # no checkpoint: waits for a restore
        else:
            engine.state, engine.role = "running", "standby"
            self.elect()

    def set_aside(self, engine_id: str) -> None:
        self.calls.append(f"set aside {engine_id}")
        self.engines[engine_id].checkpoint = None


class FakeEngine:
    def __init__(self, stack: Stack, engine_id: str, role: str, version: str) -> None:
        self.stack, self.engine_id, self.role, self.version = stack, engine_id, role, version
        self.state, self.up, self.epoch = "running", True, 7 if role == "active" else 0
        self.checkpoint: dict[int, int] | None = {0: 100, 1: 90}
        self.shape = SHAPE
        self.starting = False
        self.behind = 0
        # What it has published (the active) or processed: partition 0 moves by the stack's
        # `rate` at each look at the active.
        self.position = {0: 500, 1: 480}
        # A running standby's rows trail the active's by `near` msg_ids of partition 0, and
        # by 400 at its next `trailing` looks (a query restarted by a snapshot, its first
        # batches slow); trailing -1: at every look.
        self.near = 0
        self.trailing = 0
        # Looks at which a running engine is not in sync (its lag swings about the bound
        # under load); -1: never in sync.
        self.unsynced = 0
        # Looks at which it restarts its own query (recovering); -1: at every look.
        self.recovering = 0

    def server(self) -> ServerInfo:
        return server_info(
            engine_id=self.engine_id,
            role=self.role,
            epoch=self.epoch,
            pipeline_version=self.version,
            state_shape=self.shape if self.version == OLD else self.stack_shape(),
        )

    def stack_shape(self) -> str:
        return getattr(self.stack, "new_shape", SHAPE)

    def pipeline(self) -> PipelineInfo:
        shadow = None
        if self.version == NEW and self.role == "standby":
            shadow = ShadowInfo(
                active_version=OLD,
                version=NEW,
                ranges_compared=40,
                ranges_differing=12,
                rows_compared=400,
                ranges_read_back=3,
                msg_ids_differing=35,
                examples=[
                    Difference(
                        partition=0,
                        msg_id=120,
                        first=118,
                        last=125,
                        active_rows=[BufferedRow(msg_id=120, kind="out", key="k", value="v1")],
                        engine_rows=[BufferedRow(msg_id=120, kind="out", key="k", value="v2")],
                    )
                ],
            )
        if self.starting:
            # Its API answers before its query starts: one look sees it not started.
            self.starting = False
            return pipeline_info(state="stopped", reason="not started")
        if self.recovering and self.state == "running":
            self.recovering -= self.recovering > 0
            return pipeline_info(state="recovering", reason=RECOVERING)
        if self.state == "restoring":
            # Behind for a few looks (the restore's own reply is one), then in sync, and so
            # running from the next.
            self.behind -= 1
            caught_up = self.behind < 0
            if caught_up:
                self.state = "running"
            return pipeline_info(state="restoring", in_sync=caught_up, lag=0 if caught_up else 9)
        synced = self.state == "running" and not self.unsynced
        self.unsynced -= self.unsynced > 0
        if self.role == "active":
            self.position[0] += self.stack.rate
        active = next((e for e in self.stack.engines.values() if e.role == "active"), None)
        if self.role == "standby" and active is not None:
            short = self.near
            if self.trailing:
                self.trailing -= self.trailing > 0
                short = 400
            self.position = {0: active.position[0] - short, 1: active.position[1]}
        return pipeline_info(
            state=self.state,
            in_sync=synced,
            lag=0 if synced else 1396,
            published=dict(self.position),
            processed=dict(self.position),
            agreement=AgreementInfo(state="shadow" if shadow else "unchecked", shadow=shadow),
        )

    def timeline(self) -> TimelineInfo:
        raise NotImplementedError

    def stop(self) -> PipelineInfo:
        self.stack.calls.append(f"stop pipeline {self.engine_id}")
        self.role, self.state = "none", "stopped"
        self.stack.elect()
        return pipeline_info(state="stopped")

    def start(self) -> PipelineInfo:
        raise NotImplementedError

    def persist(self) -> Manifest:
        assert self.role == "standby", "the active is never persisted"
        assert self.state == "running", "only a running standby persists (not a restoring one)"
        snapshot_id = f"snap-{self.engine_id}-{len(self.stack.snapshots)}"
        self.stack.snapshots[snapshot_id] = self.version
        self.stack.calls.append(f"persist {self.engine_id} -> {snapshot_id}")
        return Manifest(
            snapshot_id=snapshot_id,
            pipeline="hostmetrics",
            engine_id=self.engine_id,
            pipeline_version=self.version,
            next_offset=300,
            next_offsets={0: 300, 1: 280},
            batch_id=3,
            created_at="2026-11-29T00:00:00Z",
            size_bytes=1,
            buffer_rows=0,
            buffer_last_msg_id=None,
            files={},
        )

    def restore(self, snapshot: str) -> RestoreReport:
        self.stack.calls.append(f"restore {self.engine_id} {snapshot}")
        assert snapshot == "cold" or self.stack.snapshots[snapshot] == self.version
        # A replay is restoring until in sync (then running, at the next look), as the
        # engine is: neither persisted nor elected before.
        self.state = "restoring" if snapshot == "cold" else "running"
        self.behind = 3
        self.role, self.checkpoint = "standby", {0: 0}
        self.stack.elect()
        start = {0: 40, 1: 30} if snapshot == "cold" else {0: 300, 1: 280}
        return RestoreReport(
            snapshot=snapshot,
            next_offset=start[0],
            log_start_offset=0,
            pipeline=self.pipeline(),
            next_offsets=start,
        )

    def buffer(self, last: int) -> list[BufferedRow]:
        raise NotImplementedError

    def metrics(self) -> str:
        raise NotImplementedError

    def override(self) -> PipelineInfo:
        raise NotImplementedError


class MemoryLog:
    def __init__(self, records: list[Record] | None = None) -> None:
        self.records = list(records or [])

    def last(self) -> tuple[str, Record] | None:
        return (str(len(self.records) - 1), self.records[-1]) if self.records else None

    def begin(self, record: Record) -> tuple[str, Record]:
        last = self.last()
        if last is not None and last[1].version == record.version and not last[1].cutover:
            return last
        self.records.append(record)
        return str(len(self.records) - 1), record

    def update(self, node: str, record: Record) -> None:
        self.records[int(node)] = record


class Marks:
    """The progress topic after the mark: version `old` up to 0:510 and 1:490, then `new`."""

    def __init__(self, old: str = OLD, new: str = NEW) -> None:
        self.marked = False
        self.old, self.new = old, new

    def mark(self) -> None:
        self.marked = True

    def since(self) -> list[PublishedRange]:
        assert self.marked
        return [
            PublishedRange(0, 501, 510, "d", 7, "a", version=self.old),
            PublishedRange(1, 481, 490, "d", 7, "a", version=self.old),
            PublishedRange(0, 511, 530, "d", 8, "b", version=self.new),
            PublishedRange(1, 491, 500, "d", 8, "b", version=self.new),
        ]


class Tail:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack

    def poll(self, timeout_s: float) -> int | None:
        return self.stack.epoch


def deployment(stack: Stack, log: MemoryLog | None = None, **kw: Any) -> Deployment:
    @contextlib.contextmanager
    def tail() -> Iterator[Tail]:
        yield Tail(stack)

    clock = FakeClock()
    lines: list[str] = []
    options: dict[str, Any] = {
        "pipeline": "hostmetrics",
        "engines": stack.engines,
        "processes": stack,
        "deploys": log if log is not None else MemoryLog(),
        "progress": Marks(),
        "checkpoint_at": lambda e: stack.engines[e].checkpoint,
        "set_aside": stack.set_aside,
        "run_tests": lambda: None,
        "replay_problem": lambda: None,
        "tail": tail,
        "confirm": lambda question: True,
        "echo": lines.append,
        "clock": clock,
        "sleep": clock.sleep,
        **kw,
    }
    d = Deployment(**options)
    d.lines = lines  # type: ignore[attr-defined]
    return d


TARGET = Target(NEW, SHAPE)


def test_standbys_go_first_one_at_a_time_then_the_switch_then_the_old_active():
    stack = Stack()
    stack.add("a", "active")
    stack.add("b", "standby")
    stack.add("c", "standby")
    log = MemoryLog()
    record = deploy.run(deployment(stack, log), TARGET)
    assert stack.calls == [
        # b: the first engine of version 2, on its own checkpoint (the shape is unchanged).
        "stop b",
        "start b",
        # At once: the snapshot the old engines would need if b took over early.
        "persist b -> snap-b-0",
        # c: from a snapshot b (version 2) took, its own checkpoint set aside first.
        "persist b -> snap-b-1",
        "stop c",
        "set aside c",
        "start c",
        "restore c snap-b-1",
        # Every standby runs version 2: the switch; b leads.
        "stop pipeline a",
        # a: from a snapshot of c, the standby of version 2 left.
        "persist c -> snap-c-2",
        "stop a",
        "set aside a",
        "start a",
        "restore a snap-c-2",
    ]
    assert {e.engine_id: (e.role, e.version) for e in stack.engines.values()} == {
        "a": ("standby", NEW),
        "b": ("active", NEW),
        "c": ("standby", NEW),
    }
    # Where the new logic began (b's checkpoint), and the cutover from the progress topic.
    assert (record.first_engine, record.rebuilt, record.start) == (
        "b",
        "checkpoint",
        {0: 100, 1: 90},
    )
    assert record.cutover == {0: 510, 1: 490}
    assert (record.version, record.previous) == (NEW, OLD)
    assert log.records == [record]
    assert "version 1+aaaaaaaaaaaa up to msg_id 0:510, 1:490, 2+bbbbbbbbbbbb after" in record.text()


def test_with_one_standby_its_snapshot_is_taken_before_the_switch_for_the_old_active():
    stack = Stack()
    stack.add("a", "active")
    stack.add("b", "standby")
    d = deployment(stack)
    deploy.run(d, TARGET)
    assert stack.calls == [
        "stop b",
        "start b",
        "persist b -> snap-b-0",
        # The active is never persisted: b's snapshot is taken while b is a standby, once
        # it has caught up (the old active then has little to catch up on).
        "persist b -> snap-b-1",
        "stop pipeline a",
        "stop a",
        "set aside a",
        "start a",
        "restore a snap-b-1",
    ]
    lines = "\n".join(d.lines)  # type: ignore[attr-defined]
    # The shadow's summary, with an example of both versions' rows, before the switch.
    # Its API answered before its query started: awaited, not taken for a failure.
    assert "engine b: starting its query" in lines
    assert "12 of 40 ranges differ" in lines
    assert "old: v1" in lines
    assert "new: v2" in lines


def trail(stack: Stack, engine: FakeEngine, looks: int, near: int) -> bool:
    """The operator's yes, after which the active publishes 200 msg_ids a second and
    `engine` trails it by 400 for `looks` looks (-1: for ever), then by `near`."""
    stack.rate, engine.trailing, engine.near = 40, looks, near
    return True


def test_the_switch_waits_until_a_standby_keeps_within_a_second_of_the_active():
    stack = Stack()
    stack.add("a", "active")
    b = stack.add("b", "standby")
    trailing_when_stopped: list[int] = []
    original_stop = FakeEngine.stop

    def stop(engine: FakeEngine) -> Any:
        trailing_when_stopped.append(b.trailing)
        return original_stop(engine)

    d = deployment(stack)
    # In sync (its lag within seconds of its rate), but 2 s of a's output behind at its
    # first looks after the snapshot restarted its query: a switch then waits for its
    # catch-up. Then 0.6 s behind, short of what a publishes at every look (its batches end
    # after a's), yet holding what a had published a second before: its takeover's own
    # fence and read cover that batch.
    d.confirm = lambda question: trail(stack, b, 8, near=120)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(FakeEngine, "stop", stop)
        deploy.run(d, TARGET)
    assert trailing_when_stopped == [0], "a was stopped while b was 2 s behind it"
    lines = "\n".join(d.lines)  # type: ignore[attr-defined]
    assert "in sync, 400 msg_ids short of what a had published 0.0 s ago (400)" in lines
    # Compared with where a was a second before, it is 2 s behind still: no switch.
    assert re.search(r"160 msg_ids short of what a had published 1\.\d s ago", lines), lines
    assert re.search(
        r"engine b: holds every msg_id a had published 1\.\d s ago \(0:\d+, 1:480\) at 2 "
        "looks in a row: switching",
        lines,
    ), lines
    assert stack.engines["b"].role == "active"


def test_a_standby_that_never_keeps_pace_stops_the_deploy_before_the_switch():
    stack = Stack()
    stack.add("a", "active")
    b = stack.add("b", "standby")
    d = deployment(stack)
    d.confirm = lambda question: trail(stack, b, -1, near=0)
    with pytest.raises(DeployError, match=r"no standby of the new version kept within 1 s") as e:
        deploy.run(d, TARGET)
    assert "Run the deploy again" in str(e.value)
    assert "stop pipeline a" not in stack.calls
    assert (stack.engines["a"].role, stack.engines["b"].version) == ("active", NEW)


def test_an_active_lost_before_the_switch_passes_the_lead_and_the_deploy_completes_it():
    # The active is lost while b, the new version's first engine, catches up: b takes over
    # as in any failover. The deploy records that cutover (unplanned) and restarts a, back
    # on the old version, from the snapshot b took as soon as it ran the new version.
    stack = Stack()
    stack.add("a", "active")
    stack.add("b", "standby")
    d = deployment(stack)
    persist = stack.engines["b"].persist

    def lose_the_active_after_the_first_snapshot() -> Manifest:
        manifest = persist()
        a = stack.engines["a"]
        a.role, a.state = "none", "stopped"
        stack.elect()
        a.role, a.state = "standby", "running"  # a is back, a standby of the old version
        return manifest

    stack.engines["b"].persist = lose_the_active_after_the_first_snapshot  # type: ignore[method-assign]
    record = deploy.run(d, TARGET)
    assert stack.calls == [
        "stop b",
        "start b",
        "persist b -> snap-b-0",
        # No switch and no persist of the active b: a restarts from b's first snapshot.
        "stop a",
        "set aside a",
        "start a",
        "restore a snap-b-0",
    ]
    assert {e.engine_id: (e.role, e.version) for e in stack.engines.values()} == {
        "a": ("standby", NEW),
        "b": ("active", NEW),
    }
    assert record.unplanned
    assert record.cutover == {0: 510, 1: 490}
    assert "(unplanned: the active was lost)" in record.text()
    lines = "\n".join(d.lines)  # type: ignore[attr-defined]
    assert "engine b, on version 2+bbbbbbbbbbbb, leads before the switch" in lines
    # The DAG's switch task after it (or the CLI again): nothing left, not an error.
    again = deploy.run(deployment(stack, d.deploys), TARGET)  # type: ignore[arg-type]
    assert again == record


def test_a_deploy_stopped_while_its_first_engine_catches_up_continues_from_its_start():
    stack = Stack()
    stack.add("a", "active")
    b = stack.add("b", "standby")
    log = MemoryLog()
    level = b.pipeline

    def behind() -> PipelineInfo:
        # On the new version, b stays behind: the deploy's wait runs out.
        info = level()
        lagging = info.state == "running" and b.version == NEW
        return info.model_copy(update={"in_sync": False}) if lagging else info

    b.pipeline = behind  # type: ignore[method-assign]
    with pytest.raises(DeployError, match="not in sync"):
        deploy.run(deployment(stack, log, wait_s=0.0), TARGET)
    # The start and the first snapshot were recorded before the wait, not after it.
    assert log.records[0].start == {0: 100, 1: 90}
    assert log.records[0].snapshot == "snap-b-0"
    b.pipeline = level  # type: ignore[method-assign]
    stack.calls.clear()
    again = deploy.run(deployment(stack, log), TARGET)
    assert "stop b" not in stack.calls  # continued: b is not restarted for another start
    assert again.start == {0: 100, 1: 90}
    assert again.cutover == {0: 510, 1: 490}


def test_no_switch_without_the_operators_word():
    stack = Stack()
    stack.add("a", "active")
    stack.add("b", "standby")
    asked: list[str] = []

    def refuse(question: str) -> bool:
        asked.append(question)
        return False

    d = deployment(stack, confirm=refuse)
    record = deploy.run(d, TARGET)
    assert asked == [f"switch the lead of hostmetrics from a ({OLD}) to version {NEW}?"]
    assert "stop pipeline a" not in stack.calls
    assert record.cutover == {}
    assert stack.engines["a"].role == "active"
    # Run again: the recorded start stands, b is not restarted, and the switch follows.
    stack.calls.clear()
    log = d.deploys
    again = deploy.run(deployment(stack, log), TARGET)  # type: ignore[arg-type]
    assert again.start == record.start
    assert stack.calls[:2] == ["persist b -> snap-b-2", "stop pipeline a"]


def test_failing_tests_restart_nothing():
    stack = Stack()
    stack.add("a", "active")
    stack.add("b", "standby")
    d = deployment(stack, run_tests=lambda: "1 failed: test_sessions_split_after_20_minutes")
    with pytest.raises(DeployError, match="tests failed, nothing was restarted: 1 failed"):
        deploy.run(d, TARGET)
    assert stack.calls == []


def test_a_changed_state_shape_replays_the_retained_input_or_is_refused():
    stack = Stack()
    stack.add("a", "active")
    stack.add("b", "standby")
    stack.new_shape = "count BIGINT, last_ms BIGINT"  # type: ignore[attr-defined]
    target = Target(NEW, "count BIGINT, last_ms BIGINT")
    short = "Kafka's log of hostmetrics.in starts at 0:5,000, after now - 1 h (0:4,200)"
    with pytest.raises(DeployError, match=r"shape changed .* retained input, and Kafka"):
        deploy.run(deployment(stack, replay_problem=lambda: short), target)
    assert stack.calls == []

    record = deploy.run(deployment(stack), target)
    assert stack.calls[:4] == ["stop b", "set aside b", "start b", "restore b cold"]
    assert (record.rebuilt, record.start) == ("replay", {0: 40, 1: 30})


def test_a_rollback_needs_the_version_before_on_disk():
    stack = Stack(disk=OLD)
    stack.add("a", "active", NEW)
    stack.add("b", "standby", NEW)
    done = Record(version=NEW, previous=OLD, started_at="t", start={0: 1}, cutover={0: 9})
    with pytest.raises(DeployError, match="never deployed"):
        deploy.run(deployment(stack), Target(OLD, SHAPE), rollback=True)
    other = Target("3+cccccccccccc", SHAPE)
    with pytest.raises(DeployError, match=r"version before the last deploy, 1\+aaa.*check"):
        deploy.run(deployment(stack, MemoryLog([done])), other, rollback=True)
    back = deployment(stack, MemoryLog([done]), progress=Marks(NEW, OLD))
    record = deploy.run(back, Target(OLD, SHAPE), rollback=True)
    assert (record.version, record.previous, record.rolled_back) == (OLD, NEW, True)


@pytest.mark.parametrize(
    ("engines", "match"),
    [
        ([("a", "active", OLD)], "has no standby"),
        ([("a", "active", NEW), ("b", "standby", NEW)], "nothing to deploy"),
        ([("a", "standby", OLD), ("b", "standby", OLD)], "exactly one running active"),
    ],
)
def test_a_deploy_is_refused_when_it_could_stop_the_output_or_has_nothing_to_do(engines, match):
    stack = Stack()
    for engine_id, role, version in engines:
        stack.add(engine_id, role, version)
    with pytest.raises(DeployError, match=match):
        deploy.run(deployment(stack), TARGET)
    assert stack.calls == []


def test_a_standby_not_in_sync_is_not_taken_out_of_the_election():
    stack = Stack()
    stack.add("a", "active")
    stack.add("b", "standby").state = "restoring"
    with pytest.raises(DeployError, match="every standby must be running, in sync"):
        deploy.run(deployment(stack), TARGET)


def test_a_running_standby_out_of_sync_for_a_moment_is_waited_for_and_never_for_ever():
    stack = Stack()
    stack.add("a", "active")
    stack.add("b", "standby").unsynced = 3
    d = deployment(stack)
    deploy.run(d, TARGET)
    lines = "\n".join(d.lines)  # type: ignore[attr-defined]
    assert "waiting for the standbys to be in sync: every standby must be running" in lines
    assert "not in sync (lag 1396)" in lines
    assert stack.engines["b"].role == "active"

    stack = Stack()
    stack.add("a", "active")
    stack.add("b", "standby").unsynced = -1
    with pytest.raises(deploy.StandbysBehind, match="every standby must be running, in sync"):
        deploy.run(deployment(stack), TARGET)
    assert stack.calls == []


def test_a_restarted_engine_restarting_its_own_query_is_waited_for_within_a_grace():
    """Spark gives a new Python worker 10 s to connect back: on a busy machine the restarted
    engine's query fails at its start and restarts itself after 2 s (bench.deploy)."""
    stack = Stack()
    stack.add("a", "active")
    stack.add("b", "standby")
    stack.recovering_after_start = 4
    d = deployment(stack)
    deploy.run(d, TARGET)
    lines = "\n".join(d.lines)  # type: ignore[attr-defined]
    assert "recovering, lag" in lines
    assert "Python worker failed to connect back" in lines
    assert stack.engines["b"].role == "active"

    stack = Stack()
    stack.add("a", "active")
    stack.add("b", "standby")
    stack.recovering_after_start = -1
    with pytest.raises(DeployError, match=r"recovering .*connect back.*instead of running"):
        deploy.run(deployment(stack), TARGET)
    assert stack.engines["a"].role == "active"


def test_the_cutover_is_the_old_versions_last_msg_id_per_partition_and_never_interleaves():
    ranges = [
        PublishedRange(0, 1, 10, "d", version=OLD),
        PublishedRange(0, 11, 20, "d", version=NEW),
        PublishedRange(2, 5, 9, "d", version=OLD),
    ]
    # Partition 1 saw nothing after the mark: what the old active had published before.
    assert deploy.cutover(ranges, NEW, {1: 77}) == {0: 10, 1: 77, 2: 9}
    with pytest.raises(DeployError, match="interleaved"):
        deploy.cutover([*ranges, PublishedRange(0, 21, 22, "d", version=OLD)], NEW, {})


def test_a_record_survives_its_json():
    record = Record(version=NEW, previous=OLD, started_at="t", start={0: 1, 2: 5}, cutover={1: 9})
    assert Record.from_json(record.as_json()) == record


def test_the_new_versions_own_tests_run_and_a_failure_says_which(tmp_path):
    """pytest on the test_*.py beside the pipeline's module; none: refused unless told."""
    import uuid

    from twinstream.platform.settings import load_settings

    package = f"deployed_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / package
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "pipeline.py").write_text("VERSION = '2'\n")
    settings = load_settings(
        pipeline="deployed",
        pipeline_module=f"{package}.pipeline",
        pipelines_file=tmp_path / "pipelines.toml",
        state_dir=tmp_path / "state",
    )
    assert "no tests beside the pipeline's code" in str(deploy.pipeline_tests(settings, False))
    assert deploy.pipeline_tests(settings, True) is None
    test = folder / "test_pipeline.py"
    test.write_text(
        f"from {package}.pipeline import VERSION\n\ndef test_v():\n    assert VERSION == '2'\n"
    )
    assert deploy.pipeline_tests(settings, False) is None
    test.write_text(
        f"from {package}.pipeline import VERSION\n\ndef test_v():\n    assert VERSION == '3'\n"
    )
    failed = deploy.pipeline_tests(settings, False)
    assert failed is not None
    assert "pytest test_pipeline.py exited 1" in failed
    assert "1 failed" in failed


def test_the_target_is_read_from_disk_by_a_fresh_interpreter_not_an_earlier_import(tmp_path):
    """This process imported version 1; the files now say 2: the target is 2, as an engine
    started now would load it; code that does not load is refused before any restart."""
    import importlib
    import uuid

    from twinstream.ops import skeleton
    from twinstream.platform import registry
    from twinstream.platform.settings import load_settings
    from twinstream.platform.versions import digest

    name = f"deployed_{uuid.uuid4().hex[:8]}"
    skeleton.write(name, tmp_path)
    settings = load_settings(
        pipeline=name,
        pipeline_module=f"{name}.pipeline",
        pipelines_file=tmp_path / "pipelines.toml",
        state_dir=tmp_path / "state",
    )
    loaded = registry.load(settings)
    assert loaded.version == "1"
    code = tmp_path / name / "pipeline.py"
    code.write_text(code.read_text().replace('version="1"', 'version="2"'))
    target = deploy.target_on_disk(settings)
    assert target == Target(f"2+{digest(tmp_path / name)}", loaded.keyed.state)  # type: ignore[union-attr]
    assert importlib.import_module(f"{name}.pipeline").pipeline.version == "1"
    code.write_text("raise RuntimeError('half-edited')\n")
    with pytest.raises(DeployError, match=r"does not load: RuntimeError: half-edited.*nothing"):
        deploy.target_on_disk(settings)


def test_the_dags_tasks_prepare_then_switch_once_approved_and_a_refusal_fails_fast(monkeypatch):
    """deploy_pipeline's two working tasks: the first runs the tests and brings every
    standby to the new version, stopping before the switch with the summary the approval
    shows; the second resumes through the switch without running the tests again."""
    from airflow.sdk.exceptions import AirflowFailException

    import twinstream.platform.settings as settings_module

    stack = Stack()
    stack.add("a", "active")
    stack.add("b", "standby")
    log = MemoryLog()
    asked: list[dict[str, Any]] = []

    def on_stack(base, name, closing, *, client, startup_timeout_s, confirm, echo, **kw):
        asked.append({"name": name, "startup_s": startup_timeout_s, **kw})
        return deployment(stack, log, confirm=confirm, echo=echo), TARGET

    monkeypatch.setattr(deploy, "on_stack", on_stack)
    monkeypatch.setattr(settings_module, "load", lambda kind: None)
    params = {
        "pipeline": "hostmetrics",
        "rollback": False,
        "run_tests": True,
        "start_minutes": 7,
        "wait_minutes": 10,
    }
    lines: list[str] = []
    prepared = deploy.task(params, switch=False, echo=lines.append)
    assert "stop pipeline a" not in stack.calls
    assert stack.engines["b"].version == NEW
    assert stack.engines["a"].role == "active"
    assert prepared["version"] == NEW
    assert prepared["record"]["cutover"] == {}
    assert "version 2+bbbbbbbbbbbb runs on b beside the active a:" in prepared["summary"]
    assert "12 of 40 ranges differ" in prepared["summary"]
    assert asked[0] == {
        "name": "hostmetrics",
        "startup_s": 420.0,
        "no_tests": False,
        "wait_s": 600.0,
    }

    switched = deploy.task(params, switch=True, echo=lines.append)
    assert "stop pipeline a" in stack.calls
    assert asked[1]["no_tests"] is True
    assert switched["record"]["cutover"] == {0: 510, 1: 490}
    assert {e.engine_id: e.version for e in stack.engines.values()} == {"a": NEW, "b": NEW}

    alone = Stack()
    alone.add("a", "active")
    stack.engines, stack.calls = alone.engines, []
    with pytest.raises(AirflowFailException, match="has no standby"):
        deploy.task(params, switch=False, echo=lines.append)


class _StrictClient:
    """A kazoo client as strict as kazoo's own connection: close() before stop() raises."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def start(self, timeout: float) -> None:
        self.calls.append("start")

    def stop(self) -> None:
        self.calls.append("stop")

    def close(self) -> None:
        if self.calls[-1:] != ["stop"]:
            raise RuntimeError("Cannot close connection until it is stopped")
        self.calls.append("close")


def test_the_deploy_logs_session_is_stopped_then_closed_once(tmp_path, monkeypatch):
    """The deploy's ZooKeeper log opens one session and ends it as kazoo requires (a stray
    close() inside it once failed every deploy as it ended)."""
    from twinstream.core import election
    from twinstream.ops import deploy_log
    from twinstream.platform.settings import load_settings

    client = _StrictClient()
    monkeypatch.setattr(election, "zk_client", lambda _zk: client)
    monkeypatch.setenv("TWINSTREAM_ZK_PASSWORD", "unused-by-the-fake")
    settings = load_settings(pipeline="deployed", state_dir=tmp_path / "state")
    with deploy_log.zookeeper_log(settings) as log:
        assert isinstance(log, deploy_log.ZooKeeperDeployLog)
    assert client.calls == ["start", "stop", "close"]
