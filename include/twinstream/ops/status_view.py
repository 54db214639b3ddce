"""`twinstream status` on a terminal: the operator's view (`twinstream.ops.overview`) as rich
tables, roles, each engine's agreement with the published output and problems in colour;
`--watch` redraws it in place, with each pipeline's last 15 minutes
(`twinstream.engine.timeline`, what the operator page charts) as sparklines: p99
end-to-end latency, input rate, each engine's lag, and the takeovers marked."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from twinstream.core.rows import positions_text
from twinstream.engine.timeline import PipelineTimeline
from twinstream.ops.overview import (
    FAIL,
    WARN,
    EngineView,
    Overview,
    PipelineView,
    SpareView,
    age_text,
)

ROLE_STYLES = {"active": "bold green", "standby": "cyan"}
HEALTH_STYLES = {FAIL: "bold red", WARN: "yellow"}
# Lowest to highest; a slot without a figure is a space (nothing known, not zero).
BARS = "▁▂▃▄▅▆▇█"
TAKEOVER = "▲"
# Characters a sparkline spans: 15 s a character over 15 minutes.
SPARK_WIDTH = 60


def console() -> Console:
    """A terminal's own width; piped, wide enough that a row is one line (scripts grep)."""
    probe = Console()
    # 240: the agreement column ("DISAGREES at msg_id 2:1234") keeps the notes on the line.
    return probe if probe.is_terminal else Console(width=240)


def _number(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _notes(engine: EngineView) -> Text:
    if engine.problem is not None:
        return Text(engine.problem, style="bold red")
    notes = Text()
    if engine.uncovered:
        notes.append(f"UNCOVERED {', '.join(engine.uncovered)} ", style="bold red")
    if engine.covers_takeover is False:
        notes.append("BUFFER SHORT OF A TAKEOVER ", style="bold red")
    if engine.lag_trend is not None and engine.lag_trend.growing:
        notes.append(
            f"LAG GROWING {engine.lag_trend.first:,} -> {engine.lag_trend.last:,} in "
            f"{engine.lag_trend.window_s:.0f} s ",
            style="yellow",
        )
    if engine.quarantined:
        notes.append(
            f"QUARANTINED {engine.quarantined} (twinstream quarantine list) ", style="yellow"
        )
    if engine.paused:
        notes.append("PAUSED ", style="yellow")
    if engine.stale:
        notes.append(
            f"CODE CHANGED ON DISK (now {engine.code_on_disk}): this engine runs the code it "
            f"started with; twinstream deploy {engine.pipeline} ",
            style="yellow",
        )
    for repair in engine.repairs:
        notes.append(f"REPAIRED {repair} ", style="yellow")
    if engine.state not in ("running", None) and engine.reason:
        notes.append(engine.reason[:80], style="yellow")
    return notes


def _agreement(engine: EngineView) -> Text:
    """ "agrees", "DISAGREES at msg_id 2:1234" in red (the problems below say the rest),
    "unchecked"; an overridden disagreement in yellow."""
    text = engine.agreement_text()
    if engine.disagrees:
        return Text(text, style="bold red")
    if engine.agreement.state in ("disagrees", "shadow"):
        return Text(text, style="yellow")
    return Text(text, style="green" if engine.agreement.state == "agrees" else "")


def engines_table(pipeline: PipelineView) -> Table:
    active = f"active {pipeline.active}" if pipeline.active else "NO SINGLE ACTIVE"
    table = Table(
        title=Text.assemble(
            (f"pipeline {pipeline.name}", "bold"),
            "  ",
            (active, "green" if pipeline.active else "bold red"),
        ),
        title_justify="left",
        expand=False,
    )
    for column in (
        "engine",
        "role",
        "epoch",
        "state",
        "lag",
        "processed",
        "published",
        "in sync",
        "buffer",
    ):
        table.add_column(column, no_wrap=True)
    table.add_column("takeover needs", no_wrap=True)
    table.add_column("zk", no_wrap=True)
    # After the columns scripts already cut by position.
    table.add_column("agreement", no_wrap=True)
    table.add_column("version", no_wrap=True)
    table.add_column("notes")
    for e in pipeline.engines:
        style = HEALTH_STYLES.get(e.health, "")
        needs = "-"
        if e.takeover_needs is not None:
            needs = f"{e.takeover_needs:,} " + ("covered" if e.covers_takeover else "NOT covered")
        table.add_row(
            Text(e.engine_id, style=style),
            Text(e.role or "unreachable", style=ROLE_STYLES.get(e.role or "", "bold red")),
            "-" if e.epoch is None else str(e.epoch),
            e.state or "-",
            e.lag_text(),
            positions_text(e.processed) or "-",
            positions_text(e.published) or "-",
            "-" if e.in_sync is None else ("yes" if e.in_sync else "no"),
            e.buffer_text(),
            needs,
            e.zk_state or "-",
            _agreement(e),
            Text(e.pipeline_version or "-", style="yellow" if e.stale else ""),
            _notes(e),
        )
    return table


def adapters_table(pipeline: PipelineView) -> Table:
    """The pipeline's publisher adapters, as their status nodes say: what the operator
    page's table shows."""
    table = Table(
        title=Text(f"publisher adapters of {pipeline.name}", style="bold"),
        title_justify="left",
        expand=False,
    )
    for column in ("adapter", "role", "epoch", "source position", "lag to source end"):
        table.add_column(column, no_wrap=True)
    for column in ("published", "unreadable lines", "last error"):
        table.add_column(column)
    for a in pipeline.adapters:
        table.add_row(
            a.adapter_id,
            Text(a.role, style=ROLE_STYLES.get(a.role, "")),
            "-" if a.epoch is None else str(a.epoch),
            a.position or "-",
            "-" if a.source_lag is None else f"{a.source_lag:,} B",
            f"{a.published:,}",
            Text(a.unreadable_text(), style="yellow" if a.too_long or a.not_utf8 else ""),
            Text(a.last_error or "-", style="yellow" if a.last_error else ""),
        )
    return table


def history(pipeline: PipelineView) -> Text:
    lines = Text()
    if pipeline.takeovers:
        t = pipeline.takeovers[0]
        first = "not yet" if t.first_commit_s is None else f"{t.first_commit_s:.2f} s"
        process = "a warm spare" if t.from_spare else "started cold"
        lines.append(
            f"  last takeover: engine {t.engine_id} ({process}) at epoch {t.epoch}, {t.at}; "
            f"fenced and read in {t.fence_and_read_s:.2f} s, first commit after {first}\n"
        )
    else:
        lines.append("  last takeover: none that a running engine remembers\n")
    valid = [s for s in pipeline.snapshots if s.problem is None]
    if valid:
        s = valid[0]
        lines.append(
            f"  newest snapshot: {s.snapshot_id} (engine {s.engine_id}, {age_text(s.age_s)} old)\n"
        )
    else:
        lines.append("  newest snapshot: none (persist_standby_state makes one)\n", style="yellow")
    audit = pipeline.audit
    if audit is None:
        lines.append("  last audit: none yet (audit_output_topic)\n")
    else:
        tasks = f" [{audit.tasks_text()}]" if audit.tasks else ""
        lines.append(
            f"  last audit: {'passed' if audit.ok else 'FAILED'}{tasks} ({audit.run}, "
            f"{audit.at}): {audit.summary}\n",
            style="" if audit.ok else "bold red",
        )
    if pipeline.deploy is not None:
        lines.append(f"  last deploy: {pipeline.deploy}\n")
    for problem in pipeline.problems:
        lines.append(f"  PROBLEM: {problem}\n", style="bold red")
    return lines


def slots(
    times: Sequence[float],
    values: Sequence[float | int | None],
    start: float,
    end: float,
    width: int,
    worst: bool,
) -> list[float | None]:
    """`values` (at `times`) in `width` equal slots of start..end: each slot's highest
    (`worst`: a p99, a lag) or its mean (a rate); None for a slot with no figure."""
    span = (end - start) / width
    held: list[list[float]] = [[] for _ in range(width)]
    for t, v in zip(times, values, strict=True):
        if v is None or t < start or t > end:
            continue
        held[min(width - 1, int((t - start) / span))].append(float(v))
    return [None if not h else (max(h) if worst else sum(h) / len(h)) for h in held]


def sparkline(values: Sequence[float | None]) -> str:
    """▁ to █ from 0 to the highest value; a space where nothing is known."""
    top = max((v for v in values if v is not None), default=0.0)
    out = []
    for v in values:
        if v is None:
            out.append(" ")
        else:
            level = 0 if top <= 0 else round(v / top * (len(BARS) - 1))
            out.append(BARS[max(0, min(len(BARS) - 1, level))])
    return "".join(out)


def _figure(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return f"{value:.2f} s" if value < 100 else f"{value:,.0f} s"
    return f"{value:,.0f}{unit}"


def timeline_text(
    timeline: PipelineTimeline, roles: Mapping[str, str | None], width: int = SPARK_WIDTH
) -> Text:
    """The pipeline's last `window_s` as sparklines, oldest left, `now` at the right end;
    takeovers as ▲ under the slots they fell in, and those slots red in every line."""
    end, start = timeline.now, timeline.now - timeline.window_s
    span = (end - start) / width
    marks = [m for m in timeline.takeovers if start <= m.t <= end]
    marked = {min(width - 1, int((m.t - start) / span)) for m in marks}
    lines: list[tuple[str, list[float | None], str]] = [
        ("p99 latency", slots(timeline.t, timeline.p99_s, start, end, width, True), "s"),
        ("input rate", slots(timeline.t, timeline.in_per_s, start, end, width, False), "/s"),
    ]
    for engine_id, lags in sorted(timeline.lag.items()):
        role = roles.get(engine_id) or "unreachable"
        lines.append(
            (f"lag {engine_id} ({role})", slots(timeline.t, lags, start, end, width, True), "")
        )
    label_width = max(len(label) for label, _, _ in lines) + 2
    minutes = timeline.window_s / 60
    text = Text(f"  {'last ' + format(minutes, 'g') + ' min':<{label_width}}", style="dim")
    text.append(f"{'◀ ' + format(minutes, 'g') + ' min ago':<{width - 5}}now ▶\n", style="dim")
    for label, values, unit in lines:
        text.append(f"  {label:<{label_width}}")
        for i, char in enumerate(sparkline(values)):
            text.append(char, style="bold red" if i in marked else "cyan")
        newest = next((v for v in reversed(values) if v is not None), None)
        top = max((v for v in values if v is not None), default=None)
        text.append(f"  now {_figure(newest, unit)}, max {_figure(top, unit)}\n")
    if marks:
        row = [" "] * width
        for i in marked:
            row[i] = TAKEOVER
        said = ", ".join(
            f"epoch {m.epoch} {m.engine_id} at "
            f"{datetime.fromtimestamp(m.t, UTC).strftime('%H:%M:%S')}"
            for m in marks
        )
        text.append(f"  {'takeovers':<{label_width}}")
        text.append("".join(row), style="bold red")
        text.append(f"  {said}\n")
    for engine_id, why in sorted(timeline.unread.items()):
        text.append(f"  engine {engine_id}: no figures ({why})\n", style="yellow")
    return text


def view(seen: Overview, timelines: Mapping[str, PipelineTimeline] | None = None) -> Group:
    parts: list[Table | Text] = []
    for pipeline in seen.pipelines:
        parts += [engines_table(pipeline)]
        if pipeline.adapters:
            parts.append(adapters_table(pipeline))
        timeline = (timelines or {}).get(pipeline.name)
        if timeline is not None:
            roles = {e.engine_id: e.role for e in pipeline.engines}
            parts.append(timeline_text(timeline, roles))
        parts.append(history(pipeline))
    if seen.spares is not None:
        parts.append(spares_text(seen.spares))
    parts.append(Text(f"as of {seen.generated_at}", style="dim"))
    return Group(*parts)


def spares_text(spares: Sequence[SpareView]) -> Text:
    """This machine's warm spares: how many are warm, and the engines some became."""
    waiting = [s for s in spares if s.engine_id is None]
    warm = sum(s.status == "warm" for s in waiting)
    line = Text(f"warm spares: {warm} warm, {len(waiting) - warm} warming")
    if warm == 0:
        line.stylize("yellow")
        line.append(" (a killed engine restarts cold until one is warm)")
    for spare in spares:
        if spare.engine_id is not None:
            line.append(f"; adopted as {spare.describe()}")
    return line


def render(seen: Overview, out: Console | None = None) -> None:
    (out or console()).print(view(seen))


def watch(
    look: Callable[[], Overview],
    every_s: float,
    sleep: Callable[[float], None] = time.sleep,
    rounds: int | None = None,
    timelines: Callable[[], Mapping[str, PipelineTimeline]] | None = None,
) -> int:
    """Redraw until Ctrl-C (or `rounds` redraws, for tests); 0. With `timelines`, each
    pipeline's sparklines are drawn under its table."""
    out = console()
    done = 0

    def seen() -> Group:
        return view(look(), None if timelines is None else timelines())

    try:
        with Live(seen(), console=out, auto_refresh=False) as live:
            while rounds is None or done < rounds:
                sleep(every_s)
                live.update(seen(), refresh=True)
                done += 1
    except KeyboardInterrupt:
        out.print(f"stopped watching at {datetime.now(UTC).isoformat(timespec='seconds')}")
    return 0
