"""The operator's view of a deployment: every pipeline, its engines, its publisher adapters,
its last takeovers, its snapshots and its latest audit, in one typed model.

`twinstream status` prints it as a table (or JSON); the Airflow plugin
(`twinstream.ops.operator_ui`) shows it as a page. Both build it here, from the engines' admin
APIs (one typed client, `twinstream.engine.client`), the snapshot folders and the audit
reports; the only Kafka call is the inbound log-start offsets that say whether a snapshot
is still restorable, and it is optional (`log_starts`). The operating DAGs see an engine
as the same EngineView (`twinstream.ops.operate.observe`).

A pipeline's problems name what an operator must act on, each with what to do: not exactly
one active, a gap, a standby short of a takeover, an engine that does not answer, an engine
whose rows disagree with the published ones, a failed audit, and falling behind (no engine
in sync while one is behind, or a lag that grows over a minute: `falling_behind`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from twinstream.core.rows import range_text, record_id, record_text
from twinstream.edge.publisher import Status, StatusBoard
from twinstream.engine import snapshot
from twinstream.engine.api import (
    AgreementInfo,
    BufferedRow,
    LagTrend,
    PipelineInfo,
    ServerInfo,
    StandbyCover,
    buffer_text,
)
from twinstream.engine.client import EngineClient, EngineError
from twinstream.ops.audit import REPORT, data_docs_site
from twinstream.ops.audit_runs import last_run
from twinstream.platform.settings import CommonSettings, Connections, Settings, TaskSettings

log = logging.getLogger(__name__)

# Which problem an engine has, as an operator would name it (the table's colours use it).
OK, WARN, FAIL = "ok", "warn", "fail"
# Pipeline states in which an engine is doing its job (restoring is on its way there).
WORKING = ("running", "restoring", "persisting")
# What to do about a pipeline falling behind (docs/falling-behind.md says more). Engines
# are replicas: each computes everything, so another engine adds a standby, not speed.
FALLING_BEHIND_FIX = (
    "the engines process less than the inbound topic receives: give each engine more cores "
    "(TWINSTREAM_SPARK_MASTER=local[N], or a cluster) with inbound partitions to use them, "
    "make the pipeline's step cheaper, or reduce the inbound rate (another engine adds a "
    "standby, not throughput); see docs/falling-behind.md"
)
# What to do about an engine whose rows disagree with the published ones (docs/design.md,
# Operating agreement): it does not heal by itself, and it takes no part in the election.
DISAGREEMENT_FIX = (
    "restore it (restore_and_resync, snapshot proven) or override (POST /pipeline/override)"
)
# A row's value is cut here in one line of text: a disagreement shows both sides' rows.
ROW_TEXT_LIMIT = 200


def rows_text(rows: list[BufferedRow]) -> str:
    """ "[out key=k value={...}]": a msg_id's rows as one engine has them; "[]" for a
    record without output (its coverage row is no output)."""
    shown = []
    for row in rows:
        if row.kind == "none":
            continue
        value = row.value if len(row.value) <= ROW_TEXT_LIMIT else row.value[:ROW_TEXT_LIMIT] + "…"
        shown.append(f"{row.kind} key={row.key} value={value}")
    return "[" + "; ".join(shown) + "]"


class EngineView(BaseModel):
    pipeline: str
    engine_id: str
    # None: the engine answered; else one line saying why it did not (with the fix).
    problem: str | None = None
    # The engine refused the token (HTTP 401 or 403): the client's token is not its.
    unauthorized: bool = False
    role: str | None = None
    epoch: int | None = None
    zk_state: str | None = None
    state: str | None = None
    reason: str = ""
    lag: int | None = None
    # Per inbound partition: the last msg_id processed (buffered), and the last published
    # as this engine knows it.
    processed: dict[int, int] = Field(default_factory=dict)
    published: dict[int, int] = Field(default_factory=dict)
    in_sync: bool | None = None
    # Rows buffered over every partition; `buffer_fills` has each partition's, and
    # `buffer_size` is the bound of one partition (num_buffered_msgs), not of the sum.
    buffer_fill: int | None = None
    buffer_size: int | None = None
    buffer_fills: dict[int, int] = Field(default_factory=dict)
    # The lag in seconds of the engine's own measured rate (None: not measured yet).
    lag_s: float | None = None
    # The lag over the engine's last minute (None until it has sampled a whole one).
    lag_trend: LagTrend | None = None
    # On the active: which standbys it sees could take over, and since when none could.
    standbys: StandbyCover | None = None
    # A standby's rows above the active's last published msg_id: what it would publish
    # from its buffer if it took over now. Its buffer covers a takeover when it holds them.
    takeover_needs: int | None = None
    covers_takeover: bool | None = None
    quarantined: int = 0
    uncovered: list[str] = Field(default_factory=list)
    repairs: list[str] = Field(default_factory=list)
    paused: str | None = None
    # Whether the engine's rows equal the published ones (a standby's check): as its
    # GET /pipeline says, under the same name.
    agreement: AgreementInfo = Field(default_factory=AgreementInfo)
    # The pipeline's code the engine runs (declared version+digest), the digest of the code
    # on disk now, and whether they differ: its GET /server's, under the same names.
    pipeline_version: str | None = None
    code_on_disk: str = ""
    stale: bool = False
    state_shape: str = ""
    health: str = OK

    def buffer_text(self) -> str:
        """ "p0 9,800/10,000 · p1 10,000/10,000": each partition against its own bound."""
        return buffer_text(self.buffer_fills, self.buffer_fill, self.buffer_size)

    def lag_text(self) -> str:
        """ "12,000 (2.4 s)": the lag, and in seconds of the engine's rate when measured."""
        if self.lag is None:
            return "-"
        return f"{self.lag:,}" + ("" if self.lag_s is None else f" ({self.lag_s:.1f} s)")

    def why_not_ready(self) -> str | None:
        """None when this engine could take over from the active now; else why not (for a
        standby, or an engine that does not answer)."""
        if self.problem is not None:
            return f"does not answer ({self.problem})"
        if self.role == "active":
            return "is the active"
        if self.disagrees:
            return "may not lead: its rows disagree with the published output"
        if self.role != "standby" or self.state not in WORKING:
            return f"not a working standby (role {self.role}, pipeline {self.state})"
        if not self.in_sync:
            return "not in sync (lag " + ("unknown" if self.lag is None else self.lag_text()) + ")"
        if self.covers_takeover is False:
            return "its buffer does not cover a takeover"
        return None

    @property
    def lag_growing(self) -> bool:
        return self.lag_trend is not None and self.lag_trend.growing

    @property
    def disagrees(self) -> bool:
        """Its rows differ from the published ones and no operator overrode that: it does
        not heal by itself, and takes no part in the election (AgreementInfo.eligible)."""
        return self.problem is None and not self.agreement.eligible

    @property
    def healthy(self) -> bool:
        """Answering, doing its job (WORKING) and not disagreeing: what watch_engines asks.
        Not `health`, the table's colour: a standby catching up is healthy here, a warning
        there."""
        return self.problem is None and self.state in WORKING and not self.disagrees

    def agreement_text(self) -> str:
        """The agreement column: "agrees", "DISAGREES at msg_id 2:1234", "unchecked",
        "disagrees at msg_id 1234 (overridden)", or "-" for an engine that did not answer."""
        if self.problem is not None:
            return "-"
        agreement = self.agreement
        if agreement.state == "shadow" and agreement.shadow is not None:
            return agreement.shadow.text()
        if agreement.state != "disagrees":
            return agreement.state
        where = ""
        if agreement.difference is not None:
            d = agreement.difference
            where = f" at msg_id {record_text(record_id(d.partition, d.msg_id))}"
        if agreement.overridden:
            return f"disagrees{where} (overridden)"
        return f"DISAGREES{where}"

    def disagreement(self) -> str | None:
        """None unless the engine's rows differ from the published ones: then what differs,
        with both sides' rows, for a problem, a log line and a failed task. An overridden
        engine still says so (it leads on an operator's word)."""
        agreement = self.agreement
        if self.problem is not None or agreement.state != "disagrees":
            return None
        d = agreement.difference
        if d is None:  # an engine's state without its evidence: say what is known
            found = "at a msg_id it did not report"
        else:
            found = (
                f"at {d.text()}: active rows {rows_text(d.active_rows)}, engine rows "
                f"{rows_text(d.engine_rows)}" + (f", found at {d.found_at}" if d.found_at else "")
            )
        said = f"engine {self.engine_id} disagrees with the published output {found}"
        if agreement.overridden:
            return (
                f"{said}; overridden by an operator, it may lead: restore it "
                "(restore_and_resync, snapshot proven) once it need not"
            )
        return f"{said}; {DISAGREEMENT_FIX}"

    def describe(self) -> str:
        """One line for a task's log and an OperateError: "engine b: standby, pipeline
        running, not in sync (lag 500)", or why it did not answer; a disagreeing engine's
        line says where it disagrees and what to do."""
        if self.problem is not None:
            return f"engine {self.engine_id}: unreachable ({self.problem})"
        sync = "in sync" if self.in_sync else f"not in sync (lag {self.lag})"
        why = f", {self.reason}" if self.reason else ""
        line = f"engine {self.engine_id}: {self.role}, pipeline {self.state}{why}, {sync}"
        if self.agreement.state == "disagrees":
            d = self.agreement.difference
            at = f" at {d.text()}" if d is not None else ""
            if self.agreement.overridden:
                line += f", disagrees{at} (overridden)"
            else:
                line += f", DISAGREES with the published output{at}: {DISAGREEMENT_FIX}"
        return line


class TakeoverView(BaseModel):
    engine_id: str
    epoch: int
    at: str
    fence_and_read_s: float
    first_commit_s: float | None
    # The engine that took over runs in a warm spare's process (twinstream.engine.spare).
    from_spare: bool = False


class SnapshotView(BaseModel):
    snapshot_id: str
    engine_id: str | None
    created_at: str | None
    age_s: float | None
    size_bytes: int | None
    # None: valid; else why it must not be used.
    problem: str | None
    # None when not known (Kafka not asked, or not reachable).
    restorable: bool | None = None


class AuditTaskView(BaseModel):
    """One task of the last audit run, as it recorded its end (twinstream.ops.audit_runs)."""

    task: str
    ok: bool
    summary: str
    at: str


class AuditView(BaseModel):
    run: str
    # Every task of the run passed (and the job's report says ok).
    ok: bool
    summary: str
    at: str
    # The Data Docs page, relative to the pipeline's Data Docs site (None: none written).
    data_docs: str | None
    # Each task of the last run that recorded its outcome, by name: a run whose report
    # passed can still have failed its `agreement` task.
    tasks: list[AuditTaskView] = Field(default_factory=list)

    def tasks_text(self) -> str:
        """ "verdict passed, agreement FAILED"."""
        return ", ".join(f"{t.task} {'passed' if t.ok else 'FAILED'}" for t in self.tasks)


class _AdapterId(BaseModel):
    adapter_id: str


# Pydantic orders fields from the last base: the id first, then the Status, as `twinstream
# status --json` prints them.
class AdapterView(Status, _AdapterId):
    """A publisher adapter as it says it stands (twinstream.edge.publisher.StatusBoard):
    its Status, and its id."""

    def unreadable_text(self) -> str:
        """ "2 too long, 5 not UTF-8", or "-"."""
        parts = [f"{self.too_long:,} too long"] if self.too_long else []
        parts += [f"{self.not_utf8:,} not UTF-8"] if self.not_utf8 else []
        return ", ".join(parts) or "-"


class PipelineView(BaseModel):
    name: str
    active: str | None
    problems: list[str]
    engines: list[EngineView]
    takeovers: list[TakeoverView]
    snapshots: list[SnapshotView]
    audit: AuditView | None
    # The pipeline's publisher adapters, when it runs any.
    adapters: list[AdapterView] = Field(default_factory=list)
    # Its last deploy (twinstream.ops.deploy_log.Record.text()): versions, where the new
    # logic began, the cutover msg_id per partition; None: never deployed (or not read).
    deploy: str | None = None

    def add_adapters(self, adapters: list[AdapterView]) -> None:
        """The publisher adapters; more than one active, or lines they could not publish,
        are problems."""
        self.adapters = adapters
        actives = [a.adapter_id for a in adapters if a.role == "active"]
        if len(actives) > 1:
            self.problems.append(
                f"{len(actives)} publisher adapters say they are active ({', '.join(actives)}): "
                "the one fenced last writes nothing more; check their ZooKeeper sessions"
            )
        for adapter in adapters:
            for lost in adapter.lost:
                self.problems.append(f"publisher {adapter.adapter_id}: lines lost {lost}")

    def add_audit(self, audit: AuditView | None) -> None:
        """The pipeline's latest audit; a failed one (any of its tasks) is one of its
        problems."""
        self.audit = audit
        if audit is not None and not audit.ok:
            tasks = f" ({audit.tasks_text()})" if audit.tasks else ""
            self.problems.append(f"the last audit ({audit.run}) failed{tasks}: {audit.summary}")


class SpareView(BaseModel):
    """A warm spare of this machine's keeper (twinstream.engine.spare_keeper), or one that
    became an engine: which, and when."""

    name: str
    pid: int
    status: str  # warming, warm, adopted
    engine_id: str | None = None
    adopted_at: str | None = None

    def describe(self) -> str:
        if self.engine_id is None:
            return f"{self.status} (pid {self.pid})"
        return f"engine {self.engine_id} since {self.adopted_at} (pid {self.pid})"


def spare_views(rows: list[dict[str, Any]] | None) -> list[SpareView] | None:
    if rows is None:
        return None
    return [
        SpareView(
            name=str(r["name"]),
            pid=int(r["pid"]),
            status=str(r["status"]),
            engine_id=r.get("engine_id"),
            adopted_at=None
            if r.get("at") is None
            else datetime.fromtimestamp(float(r["at"]), UTC).isoformat(timespec="seconds"),
        )
        for r in rows
    ]


class Overview(BaseModel):
    generated_at: str
    pipelines: list[PipelineView]
    # This machine's warm spares; None: no keeper runs here (TWINSTREAM_SPARES=0, or
    # another machine's stack).
    spares: list[SpareView] | None = None

    @property
    def ok(self) -> bool:
        return not any(p.problems for p in self.pipelines)


# (pipeline's settings, engine id) -> the engine's client: an EngineClient, not any EngineApi,
# since whoever asks for one closes it.
EngineFactory = Callable[[Connections, str], EngineClient]


def engine_view(
    pipeline: str, engine_id: str, server: ServerInfo, pipe: PipelineInfo
) -> EngineView:
    """The engine as its GET /server and GET /pipeline answered, with its health."""
    view = EngineView(
        pipeline=pipeline,
        engine_id=engine_id,
        role=server.role,
        epoch=server.epoch,
        zk_state=server.zk_state,
        state=pipe.state,
        reason=pipe.reason,
        lag=pipe.lag,
        lag_s=pipe.lag_s,
        standbys=pipe.standbys,
        processed=pipe.processed_positions(),
        published=pipe.published_positions(),
        in_sync=pipe.in_sync,
        buffer_fill=pipe.buffer_fill,
        buffer_size=pipe.buffer_size,
        buffer_fills=dict(pipe.buffer_fills),
        lag_trend=pipe.lag_trend,
        quarantined=len(pipe.quarantined),
        uncovered=[range_text(u.partition, u.first, u.last) for u in pipe.uncovered_ranges],
        repairs=[
            range_text(r.partition, r.first, r.last)
            + (f" in {r.seconds} s" if r.seconds is not None else " (repairing)")
            for r in pipe.repairs
        ],
        paused=pipe.paused,
        agreement=pipe.agreement,
        pipeline_version=server.pipeline_version or None,
        code_on_disk=server.code_on_disk,
        stale=server.stale,
        state_shape=server.state_shape,
    )
    if (
        view.uncovered
        or view.disagrees
        or server.zk_state != "CONNECTED"
        or pipe.state == "stopped"
    ):
        view.health = FAIL
    elif (
        view.quarantined
        or view.paused
        # Overridden: it leads (or may) on an operator's word, its rows still differ.
        or view.agreement.state == "disagrees"
        or view.lag_growing
        or (server.role == "standby" and not pipe.in_sync)
        or view.stale
    ):
        view.health = WARN
    return view


def unanswered_view(
    pipeline: str, engine_id: str, exc: EngineError, problem: str | None = None
) -> EngineView:
    """An engine that did not answer, or refused the token: `problem` says why, by default
    the engine's reason (after its HTTP status, if it gave one)."""
    if problem is None:
        problem = exc.reason if exc.status is None else f"HTTP {exc.status}: {exc.reason}"
    return EngineView(
        pipeline=pipeline,
        engine_id=engine_id,
        problem=problem,
        unauthorized=exc.status in (401, 403),
        health=FAIL,
    )


def covers(standby: PipelineInfo, active: PipelineInfo) -> tuple[int, bool]:
    """(rows the standby would publish from its buffer at a takeover now, whether its
    buffer holds them): those above the active's last published msg_id, per partition.
    Each partition's buffer must hold its own partition's rows (one partition's spare rows
    cover no other's); an engine that gives no per-partition fills is judged on the sum."""
    needs = {
        partition: max(0, processed - active.published.get(partition, -1))
        for partition, processed in standby.processed.items()
    }
    total = sum(needs.values())
    if standby.buffer_fills:
        held = all(standby.buffer_fills.get(p, 0) >= n for p, n in needs.items())
        return total, held
    return total, standby.buffer_fill >= total


def falling_behind(
    engines: list[EngineView], in_sync_lag: int, in_sync_s: float = 3.0
) -> str | None:
    """The pipeline's "falling behind" problem, or None. Either no engine that answered is
    in sync while one's lag is known and above the in-sync bound (`in_sync_s` of its own
    rate, or `in_sync_lag` records before it measured one; an unknown lag, right after a
    start, is no evidence), or an engine's lag grew through its last minute
    (twinstream.engine.lag_trend: a burst the pair absorbs never counts)."""
    answered = [e for e in engines if e.problem is None]

    def is_behind(e: EngineView) -> bool:
        if e.lag_s is not None:
            return e.lag_s > in_sync_s
        return e.lag is not None and e.lag > in_sync_lag

    behind = [e for e in answered if is_behind(e)]
    growing = [(e, e.lag_trend) for e in answered if e.lag_trend and e.lag_trend.growing]
    reasons = []
    if behind and not any(e.in_sync for e in answered):
        lags = ", ".join(f"{e.engine_id} {e.lag_text()}" for e in behind)
        reasons.append(
            f"no engine is in sync (lag {lags}; in sync is within {in_sync_s:g} s of the "
            "engine's own rate)"
        )
    for e, t in growing:
        reasons.append(
            f"the lag of engine {e.engine_id} grew from {t.first:,} to {t.last:,} over the "
            f"last {t.window_s:.0f} s"
        )
    if not reasons:
        return None
    return f"falling behind: {'; '.join(reasons)}. {FALLING_BEHIND_FIX}"


def no_ready_standby(engines: list[EngineView]) -> str | None:
    """The pipeline's "no standby could take over" problem, or None: its one active has no
    other engine that could take over now (answering, a working standby, in sync, allowed to
    lead, its buffer covering the takeover), so its next failure stops the output. It names
    each engine's reason and what to do about it; how long it has lasted is the active's own
    account (GET /pipeline `standbys`), when it gives one."""
    actives = [e for e in engines if e.problem is None and e.role == "active"]
    if len(actives) != 1:
        return None  # "N active engines" says more
    active = actives[0]
    others = [e for e in engines if e.engine_id != active.engine_id]
    reasons = {e.engine_id: e.why_not_ready() for e in others}
    if others and any(why is None for why in reasons.values()):
        return None
    fixes = []
    if any(e.problem is not None or e.state not in WORKING for e in others):
        fixes.append(
            "an engine that is down comes back through its supervisor (locally "
            "`twinstream restart ENGINE`; watch_engines restores one that stays down)"
        )
    if any(e.problem is None and e.state in WORKING and not e.in_sync for e in others):
        fixes.append(
            "one catching up needs nothing unless its lag stops falling (docs/falling-behind.md)"
        )
    if any(e.disagrees for e in others):
        fixes.append(f"one that disagrees: {DISAGREEMENT_FIX}")
    if any(e.covers_takeover is False for e in others):
        fixes.append("a short buffer: raise TWINSTREAM_NUM_BUFFERED_MSGS")
    if not others:
        fixes.append("give the pipeline a second engine (its `engines` in pipelines.toml)")
    cover = active.standbys
    lasted = ""
    if cover is not None and cover.unprotected_since is not None:
        lasted = f" for {age_text(cover.unprotected_s)} (since {cover.unprotected_since})"
    said = "; ".join(f"engine {e} {why}" for e, why in sorted(reasons.items()))
    return (
        f"no standby could take over from engine {active.engine_id}{lasted}: "
        + (said or "the pipeline has no other engine")
        + ". Its next failure stops the output; "
        + "; ".join(fixes)
    )


def age_text(seconds: float | None) -> str:
    """ "42 s", "17 min", "3.5 h", "2.0 d"; "?" when unknown."""
    if seconds is None:
        return "?"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def snapshot_views(
    settings: CommonSettings, log_starts: Mapping[int, int] | None, now: float, keep: int = 5
) -> list[SnapshotView]:
    """The newest `keep` snapshots of the pipeline, verified, each with its age and (given
    the inbound log-start offsets) whether Kafka still holds what it would replay."""
    views = []
    for info in snapshot.list_snapshots(settings.snapshot_dir, settings.pipeline)[:keep]:
        manifest = info.manifest
        if manifest is None:
            views.append(
                SnapshotView(
                    snapshot_id=info.snapshot_id,
                    engine_id=None,
                    created_at=None,
                    age_s=None,
                    size_bytes=None,
                    problem=info.problem,
                )
            )
            continue
        created = datetime.fromisoformat(manifest.created_at)
        restorable = None
        if log_starts is not None:
            restorable = all(o >= log_starts.get(p, 0) for p, o in manifest.positions().items())
        views.append(
            SnapshotView(
                snapshot_id=info.snapshot_id,
                engine_id=manifest.engine_id,
                created_at=manifest.created_at,
                age_s=round(now - created.timestamp(), 1),
                size_bytes=manifest.size_bytes,
                problem=None,
                restorable=restorable,
            )
        )
    return views


def latest_audit(audit_dir: Path) -> AuditView | None:
    """The pipeline's last audit: the newest run's tasks as they recorded their ends
    (twinstream.ops.audit_runs) with the job's newest report (any cursor); None if it was
    never audited. The run fails when any of its tasks failed, whatever the report says."""
    report = _latest_report(audit_dir)
    run = last_run(audit_dir)
    if run is None:
        return report
    tasks = [AuditTaskView(**asdict(t)) for t in run.tasks]
    failed = [t for t in tasks if not t.ok]
    same = report is not None and report.run == run.run
    summary = "; ".join(f"{t.task}: {t.summary}" for t in failed)
    if not summary:
        summary = report.summary if report is not None and same else tasks[-1].summary
    return AuditView(
        run=run.run,
        ok=not failed and (report.ok if report is not None and same else True),
        summary=summary,
        at=run.at,
        data_docs=report.data_docs if report is not None and same else None,
        tasks=tasks,
    )


def _latest_report(audit_dir: Path) -> AuditView | None:
    """The newest report the audit job wrote (any cursor), None if it never wrote one."""
    reports = (
        sorted(audit_dir.rglob(REPORT), key=lambda p: p.stat().st_mtime)
        if audit_dir.is_dir()
        else []
    )
    for path in reversed(reports):
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            log.warning("audit report %s unreadable: %s", path, exc)
            continue
        if not isinstance(report, dict):
            log.warning("audit report %s is not a JSON object; skipped", path)
            continue
        docs = report.get("data_docs")
        site = data_docs_site(audit_dir)
        page = None
        if docs:
            try:
                page = Path(docs).relative_to(site).as_posix()
            except ValueError:
                page = None
        return AuditView(
            run=str(report.get("run") or report.get("run_id", "")),
            ok=bool(report.get("ok")),
            summary=str(report.get("summary", "")),
            at=datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat(timespec="seconds"),
            data_docs=page,
        )
    return None


def pipeline_view(
    name: str,
    settings: TaskSettings,
    engines: EngineFactory,
    log_starts: Mapping[int, int] | None = None,
    clock: Callable[[], float] = time.time,
    with_history: bool = True,
) -> PipelineView:
    views: list[EngineView] = []
    infos: dict[str, PipelineInfo] = {}
    takeovers: dict[int, TakeoverView] = {}

    def ask(engine_id: str) -> tuple[ServerInfo, PipelineInfo] | EngineError:
        try:
            with engines(settings, engine_id) as client:
                return client.server(), client.pipeline()
        except EngineError as exc:
            return exc

    # Every engine at once: one after the other, a busy engine's slow answer (seconds, on a
    # loaded machine) delayed every later engine's, and the page's view of a takeover.
    with ThreadPoolExecutor(len(settings.engine_ids) or 1, "overview-engine") as pool:
        answers = list(pool.map(ask, settings.engine_ids))
    for engine_id, answer in zip(settings.engine_ids, answers, strict=True):
        if isinstance(answer, EngineError):
            views.append(unanswered_view(name, engine_id, answer))
            continue
        server, pipe = answer
        views.append(engine_view(name, server.engine_id, server, pipe))
        infos[engine_id] = pipe
        for t in pipe.takeovers:
            takeovers.setdefault(t.epoch, TakeoverView(engine_id=engine_id, **t.model_dump()))
    actives = [v.engine_id for v in views if v.role == "active"]
    for view in views:
        if view.role == "standby" and len(actives) == 1 and view.engine_id in infos:
            needs, ok = covers(infos[view.engine_id], infos[actives[0]])
            view.takeover_needs, view.covers_takeover = needs, ok
            if not ok:
                view.health = FAIL
    problems = [f"engine {v.engine_id}: {v.problem}" for v in views if v.problem]
    if len(actives) != 1:
        problems.insert(
            0,
            f"{len(actives)} active engines (want exactly 1)"
            + (": " + ", ".join(actives) if actives else ""),
        )
    problems += [
        f"engine {v.engine_id}: UNCOVERED {', '.join(v.uncovered)}" for v in views if v.uncovered
    ]
    problems += [
        f"engine {v.engine_id}: its buffer "
        f"({v.buffer_text() if v.buffer_fills else v.buffer_fill}) does not cover a takeover "
        f"({v.takeover_needs} rows)"
        for v in views
        if v.covers_takeover is False
    ]
    problems += [text for v in views if v.disagrees and (text := v.disagreement()) is not None]
    unprotected = no_ready_standby(views)
    if unprotected is not None:
        problems.append(unprotected)
    behind = falling_behind(views, settings.in_sync_lag, settings.in_sync_s)
    if behind is not None:
        problems.append(behind)
    result = PipelineView(
        name=name,
        active=actives[0] if len(actives) == 1 else None,
        problems=problems,
        engines=views,
        takeovers=sorted(takeovers.values(), key=lambda t: t.epoch, reverse=True)[:10],
        snapshots=snapshot_views(settings, log_starts, clock()) if with_history else [],
        audit=None,
    )
    if with_history:
        result.add_audit(latest_audit(settings.audit_dir))
    return result


def overview(
    pipelines: Mapping[str, TaskSettings],
    engines: EngineFactory,
    log_starts: Callable[[CommonSettings], Mapping[int, int] | None] | None = None,
    clock: Callable[[], float] = time.time,
    with_history: bool = True,
    adapters: Callable[[CommonSettings], list[AdapterView]] | None = None,
    deploys: Callable[[CommonSettings], str | None] | None = None,
    spares: Callable[[], list[dict[str, Any]] | None] | None = None,
) -> Overview:
    """Every pipeline of `pipelines` (name -> its settings); `adapters`, if given, reads a
    pipeline's publisher adapters, `deploys` its last deploy (AdapterReader reads both),
    `spares` this machine's warm spares (twinstream.engine.spare_keeper.read_status)."""
    views = []
    for name, settings in pipelines.items():
        starts = log_starts(settings) if log_starts is not None and with_history else None
        view = pipeline_view(name, settings, engines, starts, clock, with_history)
        if adapters is not None:
            view.add_adapters(adapters(settings))
        if deploys is not None:
            view.deploy = deploys(settings)
        views.append(view)
    return Overview(
        generated_at=datetime.fromtimestamp(clock(), UTC).isoformat(timespec="seconds"),
        pipelines=views,
        spares=None if spares is None else spare_views(spares()),
    )


class AdapterReader:
    """Reads pipelines' publisher adapters from their status nodes in ZooKeeper
    (twinstream.edge.publisher.StatusBoard), and their last deploys (`last_deploy`): what
    `twinstream status` and the operator page both show. It connects on first use, with
    `settings` or else the first pipeline's (ZooKeeper is the stack's), and again after a
    lost connection; when ZooKeeper does not answer in `timeout_s` (or no password is
    configured) it reads none for `retry_s`, so a page that polls every second never waits
    on it (the engines' table says more)."""

    def __init__(
        self,
        settings: Settings | None = None,
        timeout_s: float = 3.0,
        retry_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._timeout_s = timeout_s
        self._retry_s = retry_s
        self._clock = clock
        self._client: Any = None
        self._retry_at = 0.0
        # The page asks from several threads at once: one connection for them all.
        self._lock = threading.Lock()

    def __call__(self, pipeline: CommonSettings) -> list[AdapterView]:
        client = self._connected(pipeline)
        if client is None:
            return []
        try:
            found = StatusBoard.read(client, pipeline.topics())
        except Exception as exc:
            log.info("pipeline %s: publisher adapters not read: %s", pipeline.pipeline, exc)
            return []
        return [
            AdapterView(adapter_id=name, **status.model_dump()) for name, status in found.items()
        ]

    def last_deploy(self, pipeline: CommonSettings) -> str | None:
        """The pipeline's last deploy in a line (twinstream.ops.deploy_log), None if none
        or ZooKeeper does not answer."""
        from twinstream.ops.deploy_log import ZooKeeperDeployLog

        client = self._connected(pipeline)
        if client is None:
            return None
        try:
            last = ZooKeeperDeployLog(client, pipeline.deploys_path).last()
        except Exception as exc:
            log.info("pipeline %s: deploys not read: %s", pipeline.pipeline, exc)
            return None
        return None if last is None else last[1].text()

    def _connected(self, pipeline: Connections) -> Any:
        from twinstream.core.election import zk_client

        with self._lock:
            if self._client is not None and not self._client.connected:
                self._drop()
            if self._client is None and self._clock() >= self._retry_at:
                settings = self._settings or pipeline
                client: Any = None
                try:
                    client = zk_client(settings.zookeeper(), connection_retry={"max_tries": 1})
                    client.start(timeout=self._timeout_s)
                    self._client = client
                except Exception as exc:
                    if client is not None:
                        with contextlib.suppress(Exception):
                            client.stop()
                            client.close()
                    self._retry_at = self._clock() + self._retry_s
                    log.info(
                        "publisher adapters unknown: ZooKeeper did not answer (%s); trying "
                        "again in %s s",
                        exc,
                        self._retry_s,
                    )
            return self._client

    def _drop(self) -> None:
        client, self._client = self._client, None
        with contextlib.suppress(Exception):
            client.stop()
            client.close()

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._drop()
