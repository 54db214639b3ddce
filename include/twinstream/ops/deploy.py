"""Deploying a new version of a running pipeline's code with no gap in its output
(`twinstream deploy`; the local stack's engines are restarted through their supervisord
programs, a test's through its harness).

Guarantee: the output pauses no longer than a takeover, and every inbound msg_id is
published exactly once: by the old version up to the cutover msg_id of its partition, by the
new version after it, one switch per partition. Every engine of the new version computes the
same rows: the first rebuilds its state from its own checkpoint when the state's shape is
unchanged, else by a replay of the retained inbound topic (refused when retention does not
reach back a window), and the point from which the new logic applies is recorded once, in
the deploy's record in ZooKeeper; every later engine of the version restores a snapshot an
engine of that version took after that point, and its own checkpoint is set aside first, so
that it never runs from a starting point of its own. The lead passes to the new version
only once every standby runs it (no standby on the old code can win the election the switch
opens), and only on the operator's word (`--yes`: at once); before that the new version
runs beside the old as a shadow whose differences are shown. The old active is then
restarted on the new version like any later engine, as a standby.

The output never waits for a deploy: should the active be lost while the new version's
first engine is its only standby, that engine takes over as in any failover, before the
switch. The deploy then records that cutover as it would its own (read from the progress
topic, marked unplanned) and restarts the engines left on the old version from the
snapshot the first engine took as soon as it ran the new version, which exists for this:
the active is never persisted.

A deploy is a sequence of steps, each awaited with a deadline and a progress line; a step
that fails stops the deploy with the reason and what to do, leaving every engine that was
not yet touched on the old version and the active leading: the output never stops because
a deploy failed.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from twinstream.core.agreement import PublishedRange
from twinstream.core.rows import positions_text
from twinstream.engine.api import EngineApi, PipelineInfo, ShadowInfo
from twinstream.engine.client import EngineClient, EngineError
from twinstream.ops.deploy_log import DeployLog, Record, zookeeper_log
from twinstream.ops.drill import EpochTail, Takeover, stop_and_measure
from twinstream.ops.operate import OperateError, observe, persist_from, sync_check
from twinstream.ops.overview import EngineView
from twinstream.platform.settings import CommonSettings, Connections, TaskSettings

log = logging.getLogger(__name__)

Echo = Callable[[str], None]

# An engine's reason before its first start (twinstream.engine.lifecycle.Lifecycle).
NOT_STARTED = "not started"

# How the first engine of a new version rebuilds its state.
CHECKPOINT = "checkpoint"
REPLAY = "replay"


@dataclass(frozen=True)
class Target:
    """The version on disk that the deploy brings every engine to: its text (a
    twinstream.platform.versions.CodeVersion's, `declared+digest`) and its keyed state's
    shape (Keyed.state's DDL; "" for a transform, whose state Spark keeps)."""

    version: str
    state_shape: str


class Processes(Protocol):
    """An engine's process, as the stack runs it: `stop` returns once it has exited;
    `start` once it answers its health probe, running the code on disk then."""

    def stop(self, engine_id: str) -> None: ...
    def start(self, engine_id: str) -> None: ...


class ProgressMarks(Protocol):
    """The progress topic: `mark()` notes where it ends now; `since()` reads the ranges
    published after the mark."""

    def mark(self) -> None: ...
    def since(self) -> list[PublishedRange]: ...


class DeployError(OperateError):
    """The deploy stopped; the message says where, why, and what to do."""


class StandbysBehind(DeployError):
    """The plan's only objection: a running standby is not in sync (yet). Under load a
    level standby's lag swings about the in-sync bound, so the deploy waits it out
    (`planned`) before it refuses."""


@dataclass
class Deployment:
    """What a deploy works with: the pipeline's engines (id -> admin API), their processes,
    the deploy log, and the stack's own operations, all injected (unit tests give fakes)."""

    pipeline: str
    engines: Mapping[str, EngineApi]
    processes: Processes
    deploys: DeployLog
    progress: ProgressMarks
    # Where an engine's checkpoint continues, per partition (None: it has none).
    checkpoint_at: Callable[[str], dict[int, int] | None]
    # Put an engine's checkpoint aside (its process is stopped): it restarts with none,
    # stays stopped, and waits for the restore that gives it its version's state.
    set_aside: Callable[[str], None]
    # The new version's own tests: None when they pass (or there are none to run and the
    # operator said so), else why not.
    run_tests: Callable[[], str | None]
    # Why a replay of the retained input cannot rebuild the state (retention does not reach
    # back a window), or None.
    replay_problem: Callable[[], str | None]
    tail: Callable[[], contextlib.AbstractContextManager[EpochTail]]
    confirm: Callable[[str], bool]
    echo: Echo = print
    wait_s: float = 600.0
    poll_s: float = 1.0
    # The switch waits up to this long for a standby of the new version level with the
    # active (`await_level`), looking every `level_poll_s`: a batch lasts a fraction of a
    # second, and the switch should follow the one that levels.
    level_wait_s: float = 120.0
    level_poll_s: float = 0.2
    # How far behind the active a standby may be and still be level: its takeover's fence
    # and read (about a second) cover a batch it is finishing, not a catch-up.
    level_s: float = 1.0
    # An engine whose query died restarts it by itself after a backoff of seconds
    # (twinstream.engine.recovery): on a busy machine a restarted engine's first Python
    # worker may miss Spark's 10 s to connect back (bench.deploy, just after `make up`). A
    # deploy waits through restarts for this long in a row before it stops.
    recovering_grace_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    now: Callable[[], datetime] = lambda: datetime.now(UTC)


def views(deployment: Deployment) -> list[EngineView]:
    return [observe(engine, deployment.pipeline) for engine in deployment.engines.values()]


@dataclass(frozen=True)
class Plan:
    """The active (it switches last) and the standbys still on another version, in the
    configured order, with those that already run the target (a deploy run again)."""

    active: str
    active_version: str
    stale: list[str]
    current: list[str]


def plan(seen: Sequence[EngineView], target: Target) -> Plan:
    """Refused unless one engine is active, every standby runs and is in sync, and some
    engine runs another version than the target."""
    described = "; ".join(v.describe() for v in seen)
    actives = [v for v in seen if v.problem is None and v.role == "active"]
    if len(actives) != 1 or actives[0].state != "running":
        raise DeployError(
            f"a deploy needs exactly one running active, which leads until the switch: "
            f"{described}. Wait until `twinstream status` shows one, then run it again"
        )
    active = actives[0]
    standbys = [v for v in seen if v is not active]
    if not standbys:
        raise DeployError(
            f"pipeline {active.pipeline} has no standby: a deploy passes the lead to a "
            "standby on the new version, and restarting the only engine would stop the "
            "output. Give it a second engine (`engines` in the pipelines file) and `make up`"
        )
    if all(v.pipeline_version == target.version for v in seen):
        raise DeployError(
            f"nothing to deploy: every engine of {active.pipeline} runs {target.version}, the "
            "code on disk"
        )
    unready = [
        v
        for v in standbys
        if v.problem is not None or v.state != "running" or not v.in_sync or v.disagrees
    ]
    if unready:
        behind = all(
            v.problem is None and v.state == "running" and not v.disagrees for v in unready
        )
        raise (StandbysBehind if behind else DeployError)(
            "every standby must be running, in sync and not disagreeing before a deploy "
            "takes one out of the election: "
            + "; ".join(v.describe() for v in unready)
            + ". Restore it (restore_and_resync) or wait, then run the deploy again"
        )
    return Plan(
        active=active.engine_id,
        active_version=active.pipeline_version or "",
        stale=[v.engine_id for v in standbys if v.pipeline_version != target.version],
        current=[v.engine_id for v in standbys if v.pipeline_version == target.version],
    )


def await_in_sync(d: Deployment, engine_id: str, since: str) -> None:
    """Poll the engine until it is in sync (a progress line each poll), DeployError when it
    fails, disagrees, restarts its query for longer than `recovering_grace_s`, or the
    deploy's wait is over."""
    started = time.time()
    deadline = d.clock() + d.wait_s
    recovering_since: float | None = None
    while True:
        _past_not_started(d, engine_id, deadline)
        recovering_ok = recovering_since is None or (
            d.clock() - recovering_since < d.recovering_grace_s
        )
        try:
            check = sync_check(
                d.engines[engine_id], started, d.wait_s, time.time(), since, recovering_ok
            )
        except OperateError as exc:
            raise DeployError(f"{exc}; the deploy stopped there") from exc
        if not check.recovering:
            recovering_since = None
        elif recovering_since is None:
            recovering_since = d.clock()
        d.echo(f"  {check.message}")
        if check.done:
            return
        if d.engines[engine_id].server().role == "active":
            d.echo(f"  engine {engine_id}: leads now (the active was lost)")
            return
        if d.clock() > deadline:
            raise DeployError(f"engine {engine_id}: not in sync within {d.wait_s:.0f} s")
        d.sleep(d.poll_s)


def loaded(d: Deployment, engine_id: str, target: Target) -> None:
    """The engine, started again, must run the target: the code may have changed again."""
    running = d.engines[engine_id].server().pipeline_version
    if running != target.version:
        raise DeployError(
            f"engine {engine_id} started on version {running}, not {target.version}: the "
            "pipeline's code changed again during the deploy. Run `twinstream deploy` again "
            "once it is as you want it"
        )


def start_first(d: Deployment, engine_id: str, target: Target, record: Record, node: str) -> Record:
    """The first engine of the new version: restarted on its own checkpoint (state shape
    unchanged) or rebuilt by a replay of the retained input; where the new logic begins is
    returned in the record."""
    d.echo(f"engine {engine_id}: stopping it to start it on version {target.version}")
    d.processes.stop(engine_id)
    at = d.checkpoint_at(engine_id)
    if record.rebuilt == REPLAY or at is None:
        record.rebuilt = REPLAY
        d.set_aside(engine_id)
        d.processes.start(engine_id)
        loaded(d, engine_id, target)
        report = d.engines[engine_id].restore("cold")
        record.start = dict(report.next_offsets) or {0: report.next_offset}
        d.echo(
            f"engine {engine_id}: replaying the retained input from inbound offset "
            f"{positions_text(record.start)} (a window back), with no state"
        )
    else:
        record.rebuilt = CHECKPOINT
        record.start = at
        d.processes.start(engine_id)
        loaded(d, engine_id, target)
        d.echo(
            f"engine {engine_id}: runs {target.version} from its checkpoint; the new logic "
            f"applies from inbound offset {positions_text(at)}"
        )
    record.first_engine = engine_id
    if record.rebuilt == CHECKPOINT:
        # Taken at once, not after the catch-up: should the active be lost before the
        # switch, this engine leads, and the engines left on the old version need a
        # snapshot of the new version that a standby took (the active is never persisted).
        # A replaying engine is restoring until in sync: it can neither be persisted nor
        # win the election before then.
        await_running(d, engine_id)
        record.snapshot = persist_new(d, engine_id, target)
    # Recorded before the catch-up, which may take minutes: a deploy stopped during it and
    # run again continues from this start instead of restarting the engine for another.
    d.deploys.update(node, record)
    await_in_sync(d, engine_id, f"version {target.version} started")
    return record


def _past_not_started(d: Deployment, engine_id: str, deadline: float) -> PipelineInfo:
    """The engine's pipeline once it is past "not started" (its admin API answers a
    moment before it starts its query), or as it is at the deadline."""
    while True:
        info = d.engines[engine_id].pipeline()
        if info.state != "stopped" or info.reason != NOT_STARTED or d.clock() > deadline:
            return info
        d.echo(f"  engine {engine_id}: starting its query")
        d.sleep(d.poll_s)


def await_running(d: Deployment, engine_id: str) -> None:
    """Wait until the engine's query runs, so that it can be persisted; DeployError when
    it fails, restarts its query for longer than `recovering_grace_s`, or the deploy's
    wait is over."""
    deadline = d.clock() + d.wait_s
    info = _past_not_started(d, engine_id, deadline)
    recovering_until = d.clock() + d.recovering_grace_s
    while info.state == "recovering" and d.clock() < min(recovering_until, deadline):
        d.echo(f"  engine {engine_id}: recovering ({info.reason})")
        d.sleep(d.poll_s)
        info = _past_not_started(d, engine_id, deadline)
    if info.state != "running":
        raise DeployError(
            f"engine {engine_id}: {info.state} ({info.reason}) instead of running its "
            "query; the deploy stopped there. Its log says why"
        )


def persist_new(d: Deployment, source: str, target: Target) -> str:
    """A snapshot of `source`, a standby of the new version: the state a later engine of
    the version starts from. Its id."""
    manifest = persist_from(d.engines[source])
    snapshot_id = str(manifest["snapshot_id"])
    if manifest.get("pipeline_version") != target.version:
        raise DeployError(
            f"snapshot {snapshot_id} of engine {source} is of version "
            f"{manifest.get('pipeline_version')}, not {target.version}; the deploy stopped"
        )
    d.echo(
        f"engine {source}: snapshot {snapshot_id} of version {target.version}, continuing at "
        f"inbound offset {positions_text({int(k): v for k, v in manifest['next_offsets'].items()})}"
    )
    return snapshot_id


def start_later(d: Deployment, engine_id: str, snapshot_id: str, target: Target) -> None:
    """A later engine of the new version: its checkpoint set aside, then snapshot
    `snapshot_id` (of the version) restored into it on the new code."""
    d.echo(
        f"engine {engine_id}: stopping it to start it on version {target.version} from "
        f"snapshot {snapshot_id}"
    )
    d.processes.stop(engine_id)
    d.set_aside(engine_id)
    d.processes.start(engine_id)
    loaded(d, engine_id, target)
    d.engines[engine_id].restore(snapshot_id)
    await_in_sync(d, engine_id, f"the restore of {snapshot_id}")


def shadow_text(shadow: ShadowInfo | None) -> list[str]:
    """The shadow's difference summary as lines for the operator: the counts, then one
    example's rows of both versions."""
    if shadow is None:
        return ["no range compared yet (no input since the new version started?)"]
    lines = [shadow.text()]
    for example in shadow.examples[:1]:
        lines.append(f"  e.g. msg_id {example.msg_id} (partition {example.partition}):")
        for name, rows in (("old", example.active_rows), ("new", example.engine_rows)):
            shown = "; ".join(r.value for r in rows[:3]) or "(no output)"
            lines.append(f"    {name}: {shown}")
    return lines


def summary(d: Deployment, target: Target) -> list[str]:
    """What the operator decides the switch on: which engines run the target beside the
    active, and the shadow's difference summary of the first of them."""
    seen = views(d)
    on_target = [v for v in seen if v.role == "standby" and v.pipeline_version == target.version]
    actives = [v.engine_id for v in seen if v.role == "active"]
    if not on_target:
        return [
            f"no standby runs {target.version} (engines: {'; '.join(v.describe() for v in seen)})"
        ]
    shadow = d.engines[on_target[0].engine_id].pipeline().agreement.shadow
    return [
        f"version {target.version} runs on {', '.join(v.engine_id for v in on_target)} beside "
        f"the active {', '.join(actives) or '(none)'}:",
        *(f"  {line}" for line in shadow_text(shadow)),
    ]


def cutover(
    ranges: Iterable[PublishedRange], new: str, before: Mapping[int, int]
) -> dict[int, int]:
    """The last msg_id the old version published in each partition: the end of its last
    range after the mark, else what it had published before the switch (`before`).
    DeployError if an old range follows a new one in a partition (the versions
    interleaved: never, the election lets one engine publish at a time)."""
    last: dict[int, int] = dict(before)
    switched: dict[int, int] = {}
    for r in sorted(ranges, key=lambda r: (r.partition, r.first)):
        if r.version == new:
            switched.setdefault(r.partition, r.first)
            continue
        if r.partition in switched:
            raise DeployError(
                f"partition {r.partition}: version {r.version} published {r.text()} after "
                f"version {new} began at msg_id {switched[r.partition]}: the versions "
                "interleaved. Audit the output (audit_output_topic) before anything else"
            )
        last[r.partition] = max(last.get(r.partition, -1), r.last)
    return last


# Looks in a row at which a standby must be level: one look can fall on the moment its
# batch ends just after the active's; two show it keeping pace.
LEVEL_LOOKS = 2


def behind_active(published: Mapping[int, int], info: PipelineInfo) -> dict[int, int]:
    """Per partition, how many of the msg_ids in `published` (the active's) a standby
    (`info`) has not processed yet: empty when its buffer holds all of them."""
    processed = info.processed_positions()
    return {
        p: last - processed.get(p, -1)
        for p, last in sorted(published.items())
        if processed.get(p, -1) < last
    }


def await_level(d: Deployment, active: str, standbys: Sequence[str]) -> str | None:
    """Wait until a standby of the new version is level with the active: in sync, and its
    buffer holds every msg_id the active had published `level_s` before, at `LEVEL_LOOKS`
    looks in a row. Its takeover then publishes at once or after the batch it is finishing,
    within the takeover's own fence and read, instead of after a catch-up. Returns that
    standby; None when the active no longer runs (lost: a standby of the new version leads,
    as in any failover).

    "In sync" alone (a lag within TWINSTREAM_IN_SYNC_S at the engine's own catch-up rate)
    let a switch follow a standby's snapshot, whose query restarts: its first batches are
    slow, and in bench.deploy the output then paused 6.5 s, not a takeover's 1.5 s. Nor does
    "holds all the active has published" work: a restarted standby's batches end a moment
    after the active's, and at 100 events/s on a loaded machine it was 36 to 2,356 msg_ids
    short at every look for two minutes. DeployError when none levels within
    `level_wait_s`: the active leads on, the standbys stay on the new version, and the
    deploy run again switches."""
    deadline = d.clock() + d.level_wait_s
    in_a_row = dict.fromkeys(standbys, 0)
    last_said = -1.0
    # The active's published positions at each look, back to the newest one `level_s` old.
    history: collections.deque[tuple[float, dict[int, int]]] = collections.deque()
    while True:
        try:
            seen = d.engines[active].pipeline()
        except EngineError as exc:
            d.echo(f"  engine {active}: does not answer ({exc})")
            return None
        if seen.state != "running":
            return None
        now = d.clock()
        history.append((now, seen.published_positions()))
        while len(history) > 1 and history[1][0] <= now - d.level_s:
            history.popleft()
        then, published = history[0]
        ago = f"{now - then:.1f} s ago"
        lines = []
        for engine_id in standbys:
            info = d.engines[engine_id].pipeline()
            behind = behind_active(published, info)
            level = info.state == "running" and info.in_sync and not behind
            in_a_row[engine_id] = in_a_row[engine_id] + 1 if level else 0
            if in_a_row[engine_id] >= LEVEL_LOOKS:
                d.echo(
                    f"  engine {engine_id}: holds every msg_id {active} had published {ago} "
                    f"({positions_text(published)}) at {LEVEL_LOOKS} looks in a row: switching"
                )
                return engine_id
            lines.append(
                f"engine {engine_id}: {info.state}, "
                + ("in sync" if info.in_sync else f"not in sync (lag {info.lag})")
                + (
                    f", {sum(behind.values()):,} msg_ids short of what {active} had published "
                    f"{ago} ({positions_text(behind)})"
                    if behind
                    else f", holds all {active} had published {ago}"
                )
            )
        if now >= deadline:
            raise DeployError(
                f"no standby of the new version kept within {d.level_s:g} s of what {active} "
                f"publishes for {d.level_wait_s:.0f} s ({'; '.join(lines)}), so a switch "
                "would pause the output for its catch-up, longer than a takeover; nothing was "
                f"switched: {active} leads and the standbys run the new version. Run the "
                "deploy again when they keep pace (a lower inbound rate, or the platform's own "
                "jobs done)"
            )
        if now - last_said >= d.poll_s:
            last_said = now
            d.echo(f"  waiting to switch until a standby is level: {'; '.join(lines)}")
        d.sleep(d.level_poll_s)


def switch(d: Deployment, p: Plan, target: Target) -> tuple[Takeover, dict[int, int]]:
    """Stop the active's pipeline: a standby on the new version takes over at a
    transaction boundary. `run` calls it once `await_level` found a standby level with
    the active. Returns the takeover and the cutover per partition."""
    standbys = {e: d.engines[e] for e in d.engines if e != p.active}
    d.progress.mark()
    with d.tail() as tail:
        takeover = stop_and_measure(d.engines[p.active], standbys, tail, 60.0, d.clock)
    d.echo(f"switched: {takeover.describe()}")
    ranges = d.progress.since()
    return takeover, cutover(ranges, target.version, takeover.before())


def planned(d: Deployment, seen: list[EngineView], target: Target) -> tuple[list[EngineView], Plan]:
    """The plan of the engines as `seen`, looking again up to `level_wait_s` (a line a
    look) while standbys run but are not in sync; any other objection at once. The
    engines as last seen, and the plan."""
    deadline = d.clock() + d.level_wait_s
    while True:
        try:
            return seen, plan(seen, target)
        except StandbysBehind as exc:
            if d.clock() >= deadline:
                raise
            d.echo(f"  waiting for the standbys to be in sync: {exc}")
            d.sleep(d.poll_s)
        seen = views(d)


def run(d: Deployment, target: Target, *, rollback: bool = False) -> Record:
    """Deploy `target` on every engine of the pipeline (see the module's guarantee)."""
    seen = views(d)
    last = d.deploys.last()
    if (
        last is not None
        and last[1].version == target.version
        and last[1].cutover
        and all(v.pipeline_version == target.version for v in seen)
    ):
        # Done already (a lead passed before the switch finished it, or a run again).
        d.echo(f"already deployed on every engine of {d.pipeline}: {last[1].text()}")
        return last[1]
    seen, p = planned(d, seen, target)
    if rollback:
        if last is None:
            raise DeployError(
                f"pipeline {d.pipeline} was never deployed: there is no version before to "
                "roll back to"
            )
        if last[1].previous != target.version:
            raise DeployError(
                f"a rollback deploys the version before the last deploy, {last[1].previous}, "
                f"but the code on disk is {target.version}: check that version's code out "
                "(git checkout or restore) and run `twinstream deploy --rollback` again"
            )
    d.echo(
        f"deploying {target.version} on pipeline {d.pipeline}: active {p.active} runs "
        f"{p.active_version}; standbys to restart one at a time: {', '.join(p.stale) or 'none'}"
        + (f"; already on it: {', '.join(p.current)}" if p.current else "")
    )
    d.echo("running the new version's own tests")
    failed = d.run_tests()
    if failed is not None:
        raise DeployError(f"the new version's tests failed, nothing was restarted: {failed}")

    node, record = d.deploys.begin(
        Record(
            version=target.version,
            previous=p.active_version,
            started_at=d.now().isoformat(),
            rebuilt=REPLAY if _shape_changed(seen, p, target) else "",
            rolled_back=rollback,
        )
    )
    if record.rebuilt == REPLAY and not record.start:
        problem = d.replay_problem()
        if problem is not None:
            raise DeployError(
                f"the state's shape changed ({target.state_shape}), so the new version must "
                f"rebuild its state by replaying the retained input, and {problem}. Nothing "
                "was restarted"
            )
        d.echo(
            f"the state's shape changed (now {target.state_shape}): the first engine "
            "replays the retained input from a window back (TWINSTREAM_WINDOW_RETENTION_MS)"
        )
    # From here on, the progress topic tells who published what (a lead may pass early).
    d.progress.mark()
    current = list(p.current)
    stale = list(p.stale)
    if not record.start:
        # No start recorded: a standby already on the version was started by hand, from a
        # starting point of its own; every standby starts again from this deploy's.
        stale, current = stale + current, []
        first = stale.pop(0)
        record = start_first(d, first, target, record, node)  # recorded by it
        current.append(first)
    elif not current:
        raise DeployError(
            f"version {target.version} began at msg_id {positions_text(record.start)} "
            f"(engine {record.first_engine}), but no standby runs it now to take a snapshot "
            "from: another start would compute other rows. Declare a new version (the "
            "pipeline's `version`) and deploy again"
        )
    for i, engine_id in enumerate(stale):
        if (leader := _new_leads(d, target)) is not None:
            return _lead_passed(d, node, record, target, leader, [*stale[i:], p.active])
        record.snapshot = persist_new(d, current[0], target)
        d.deploys.update(node, record)
        start_later(d, engine_id, record.snapshot, target)
        current.append(engine_id)
    leader = _new_leads(d, target)
    if leader is None and len(current) == 1:
        # The old active restarts from a snapshot of the version after the switch; the only
        # standby of it leads by then, and the active is never persisted: take it now.
        record.snapshot = persist_new(d, current[0], target)
        d.deploys.update(node, record)
        await_in_sync(d, current[0], f"snapshot {record.snapshot}")
        leader = _new_leads(d, target)
    if leader is not None:
        return _lead_passed(d, node, record, target, leader, [p.active])

    for line in summary(d, target):
        d.echo(line)
    if not d.confirm(
        f"switch the lead of {d.pipeline} from {p.active} ({p.active_version}) to version "
        f"{target.version}?"
    ):
        d.echo(
            f"not switched: {', '.join(current)} run {target.version} as standbys beside the "
            f"active {p.active}; run `twinstream deploy {d.pipeline}` again to switch"
        )
        return record

    if await_level(d, p.active, current) is None and (leader := _new_leads(d, target)):
        return _lead_passed(d, node, record, target, leader, [p.active])
    takeover, cut = switch(d, p, target)
    record.cutover = cut
    record.switched_at = d.now().isoformat()
    record.takeover_s = takeover.first_output_s or takeover.role_s
    d.deploys.update(node, record)
    d.echo(f"cutover: {record.text()}")

    # The old active, stopped by the switch, restarts on the new version as a standby,
    # from a snapshot a standby of the version takes now (or the one taken before).
    source = next((e for e in current if e != takeover.new_active), None)
    if source is not None:
        record.snapshot = persist_new(d, source, target)
    start_later(d, p.active, record.snapshot, target)
    d.deploys.update(node, record)
    d.echo(f"deployed {target.version} on every engine of {d.pipeline}: {record.text()}")
    return record


def _new_leads(d: Deployment, target: Target) -> str | None:
    """The engine that leads on the new version before the switch (the active was lost
    and a standby of the new version won the election), or None."""
    for v in views(d):
        if v.problem is None and v.role == "active" and v.pipeline_version == target.version:
            return v.engine_id
    return None


def _lead_passed(
    d: Deployment, node: str, record: Record, target: Target, leader: str, old: list[str]
) -> Record:
    """The lead passed to the new version before the switch: the cutover recorded as the
    progress topic shows it (unplanned), then every engine left on the old version
    restarted on the new one from the newest snapshot of it."""
    if not record.snapshot:
        raise DeployError(
            f"engine {leader}, on version {target.version}, leads before the switch (the "
            "active was lost), and no snapshot of the version exists yet for the engines "
            f"left on the old version ({', '.join(old)}): they stay standbys on it, and the "
            "output goes on. Restore them on the new code with snapshot 'cold' "
            "(restore_and_resync), a replay from a window back: until a window has passed "
            "their rows may differ from the leader's, which the agreement check shows"
        )
    record.cutover = cutover(d.progress.since(), target.version, {})
    record.switched_at = d.now().isoformat()
    record.unplanned = True
    d.deploys.update(node, record)
    d.echo(
        f"engine {leader}, on version {target.version}, leads before the switch: the active "
        f"was lost and it took over, as in any failover. Cutover: {record.text()}"
    )
    on_target = {v.engine_id for v in views(d) if v.pipeline_version == target.version}
    for engine_id in old:
        if engine_id not in on_target:
            start_later(d, engine_id, record.snapshot, target)
    d.echo(f"deployed {target.version} on every engine of {d.pipeline}: {record.text()}")
    return record


def _shape_changed(seen: Sequence[EngineView], p: Plan, target: Target) -> bool:
    """Whether the active keeps another state shape than the target declares."""
    active = next(v for v in seen if v.engine_id == p.active)
    return active.state_shape != target.state_shape


# -- the deploy's parts on a running stack (the CLI wires them) --------------------------


# Prints the declared version and state shape of the pipeline `module[:attribute]` under
# a folder (argv 1 and 2), as JSON: run in a fresh interpreter by target_on_disk.
_READ_TARGET = (
    "import json, sys; from pathlib import Path; from twinstream.contract import load; "
    "p = load(sys.argv[1], Path(sys.argv[2])); print(json.dumps([p.version, p.state_shape]))"
)


def target_on_disk(settings: CommonSettings) -> Target:
    """The version of the pipeline's code on disk now and its state's shape, read as a
    started engine reads them: imported by a fresh interpreter (this process may hold an
    older import of the module), digested from the files."""
    import subprocess
    import sys

    from twinstream.platform import registry
    from twinstream.platform.versions import CodeVersion

    spec, root = registry.module_spec(settings)
    done = subprocess.run(
        [sys.executable, "-c", _READ_TARGET, spec, str(root)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise DeployError(
            f"the pipeline's code on disk ({spec} under {root}) does not load: {why}. Fix it "
            "(its own tests say more); nothing was restarted"
        )
    declared, shape = json.loads(done.stdout.strip().splitlines()[-1])
    return Target(str(CodeVersion(declared, registry.code_digest(settings))), shape)


def checkpoint_at(settings: CommonSettings, engine_id: str) -> dict[int, int] | None:
    """Where the engine's checkpoint continues (its process stopped), per partition."""
    from twinstream.engine import snapshot

    ckpt = settings.checkpoint_dir(engine_id)
    position = snapshot.checkpoint_position(ckpt, settings.inbound_topic) if ckpt.exists() else None
    return None if position is None else dict(position.next_offsets)


# Where a deploy keeps the checkpoint an engine of the old version left (until the next
# deploy of that engine): evidence, never resumed (the engine waits for a restore).
ASIDE_SUFFIX = ".before-deploy"


def set_aside(settings: CommonSettings, engine_id: str) -> None:
    from twinstream.platform import storage

    ckpt = settings.checkpoint_dir(engine_id)
    if not ckpt.exists():
        return
    aside = ckpt.with_name(ckpt.name + ASIDE_SUFFIX)
    storage.remove_tree(aside)
    storage.rename(ckpt, aside)


def replay_problem(settings: CommonSettings) -> str | None:
    """Why a replay of the retained inbound topic cannot rebuild the state from a window
    back (TWINSTREAM_WINDOW_RETENTION_MS): Kafka's log of a partition begins after the
    window's first record (retention deleted part of it), or may (its first record is
    the window's first and records before it were deleted). None: it reaches."""
    from twinstream.engine.positions import InboundWatermarks
    from twinstream.platform.kafka import connection

    marks = InboundWatermarks(connection(settings), settings.topics(), "deploy")
    try:
        starts = marks.log_starts()
        at = marks.offsets_at(int(time.time() * 1000) - settings.window_retention_ms)
    finally:
        marks.close()
    short = {p: s for p, s in sorted(starts.items()) if s > 0 and at.get(p, s) <= s}
    if not short:
        return None
    hours = settings.window_retention_ms / 3_600_000
    return (
        f"Kafka's log of {settings.inbound_topic} begins at inbound offset "
        f"{positions_text(short)}, where the window's first record is (or was deleted): "
        f"retention does not reach back the {hours:g} h window "
        f"(TWINSTREAM_WINDOW_RETENTION_MS). Raise the topic's retention.ms above the window "
        "plus a margin (the check_kafka_retention DAG says how much) and deploy once it holds "
        "a window, or keep the state's shape so that the new version resumes the old state"
    )


def pipeline_tests(settings: CommonSettings, skip: bool) -> str | None:
    """Run the tests beside the pipeline's code (test_*.py in its module's folder) with
    pytest: None when they pass, else the reason with pytest's last lines. No tests: None
    when `skip`, else the reason and what to do."""
    import subprocess
    import sys

    from twinstream.platform import registry

    if skip:
        return None
    folder = registry.module_folder(settings)
    tests = sorted(folder.glob("test_*.py")) + sorted(folder.glob("*_test.py"))
    if not tests:
        return (
            f"there are no tests beside the pipeline's code in {folder} (test_*.py): write "
            "some (`twinstream new-pipeline` writes a model), or deploy with --no-tests"
        )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *map(str, tests)],
        cwd=folder.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode == 0:
        return None
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
    return f"pytest {' '.join(t.name for t in tests)} exited {done.returncode}:\n{tail}"


# How long a read of the progress topic since the mark waits for a record or a partition's
# end before it gives up on the rest (KafkaProgressMarks.since).
PROGRESS_IDLE_S = 30.0


class KafkaProgressMarks:
    """ProgressMarks over the pipeline's progress topic, read_committed."""

    def __init__(self, settings: CommonSettings) -> None:
        self._settings = settings
        self._ends: dict[int, int] = {}

    def mark(self) -> None:
        from twinstream.platform.kafka import partition_ends

        self._ends = partition_ends(self._settings, self._settings.progress_topic)

    def since(self) -> list[PublishedRange]:
        from twinstream.edge.reader import read_committed

        ranges = []
        topic = self._settings.progress_topic
        # The read ends at every partition's end (its EOF); the idle bound only ends one
        # that never reaches it. At 2 s a fresh consumer's first fetch on a loaded machine
        # (its TLS and SASL login, its fetch session) came after it: the read returned
        # nothing, and a lead passed before the switch was recorded with no cutover.
        for record in read_committed(
            self._settings, topic, self._ends, idle_timeout_s=PROGRESS_IDLE_S, partition=None
        ):
            try:
                value = json.loads(record.raw)
                first, last = int(value["first"]), int(value["last"])
            except (ValueError, TypeError, KeyError):
                continue  # not a range: no version to account for
            ranges.append(
                PublishedRange(
                    record.partition,
                    first,
                    last,
                    value.get("digest"),
                    record.epoch,
                    record.engine_id,
                    record.timestamp_ms,
                    record.version,
                )
            )
        return ranges


def token_client(settings: Connections, engine_id: str) -> EngineClient:
    """An engine's admin API client from the settings' admin token (the CLI's, a
    benchmark's); a DAG task's come from Airflow's connections instead."""
    return EngineClient.from_settings(settings, engine_id, settings.secret("admin_token"), 30.0)


def on_stack(
    base: TaskSettings,
    name: str,
    closing: contextlib.ExitStack,
    *,
    client: Callable[[Connections, str], EngineClient],
    startup_timeout_s: float,
    confirm: Callable[[str], bool],
    echo: Echo = print,
    no_tests: bool = False,
    wait_s: float = 600.0,
) -> tuple[Deployment, Target]:
    """A deploy of pipeline `name` of the local stack (`base`: the stack's settings as the
    process reads them), with the target on disk: its engines' admin APIs through `client`
    (the CLI's from the token, a DAG task's from Airflow's connections), restarted through
    supervisord (each within `startup_timeout_s`); every client closed by `closing`. The
    CLI's and the deploy_pipeline DAG's."""
    from twinstream.engine.client import EngineError
    from twinstream.ops.drill import KafkaEpochTail
    from twinstream.platform import registry
    from twinstream.stack.restart import EngineProcesses

    settings = registry.chosen(base, name)
    target = target_on_disk(settings)
    engines: dict[str, EngineApi] = {
        e: closing.enter_context(client(settings, e)) for e in settings.engine_ids
    }

    def answers(engine_id: str) -> str | None:
        try:
            engines[engine_id].server()
        except EngineError as exc:
            return exc.reason[:200]
        return None

    deployment = Deployment(
        pipeline=settings.pipeline,
        engines=engines,
        processes=EngineProcesses(settings, answers, startup_timeout_s, echo=echo),
        deploys=closing.enter_context(zookeeper_log(settings)),
        progress=KafkaProgressMarks(settings),
        checkpoint_at=lambda e: checkpoint_at(settings, e),
        set_aside=lambda e: set_aside(settings, e),
        run_tests=lambda: pipeline_tests(settings, no_tests),
        replay_problem=lambda: replay_problem(settings),
        tail=lambda: KafkaEpochTail(settings),
        confirm=confirm,
        echo=echo,
        wait_s=wait_s,
    )
    return deployment, target


def task(params: Mapping[str, Any], *, switch: bool, echo: Echo = log.info) -> dict[str, Any]:
    """A deploy_pipeline task on the local stack's machine: the run's pipeline deployed up
    to the switch (`switch` False: its tests, then every standby on the code on disk, and
    the summary the operator approves the switch on), or resumed through the switch
    (`switch` True; the tests ran before the approval). A refusal fails the task at once,
    naming the fix; the record is the deploy log's."""
    from twinstream.engine.client import EngineError
    from twinstream.ops.operate import airflow_engine, refusals_fail_fast
    from twinstream.platform.settings import load
    from twinstream.stack.core import StackError

    with refusals_fail_fast(), contextlib.ExitStack() as closing:
        try:
            d, target = on_stack(
                load(TaskSettings),
                str(params["pipeline"]),
                closing,
                client=lambda settings, engine_id: airflow_engine(engine_id, settings),
                startup_timeout_s=60.0 * int(params["start_minutes"]),
                confirm=lambda question: switch,
                echo=echo,
                no_tests=switch or not params["run_tests"],
                wait_s=60.0 * int(params["wait_minutes"]),
            )
            record = run(d, target, rollback=bool(params["rollback"]))
            # run() has logged it before its question; read again for the XCom (after a
            # switch: the engines as they are now).
            lines = summary(d, target)
        except (StackError, EngineError) as exc:
            raise DeployError(f"{exc}; the deploy stopped there") from exc
    return {"version": target.version, "record": asdict(record), "summary": "\n".join(lines)}
