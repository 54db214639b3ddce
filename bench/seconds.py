"""Every target of issue 35 ("Seconds, not minutes") in one run of one command, on the
stack's own hostmetrics pair as `make up` left it (its engines under supervisord, which
restarts one after a kill; the stack's other engines running beside it).

    make up
    .venv/bin/python -m bench.seconds --first --hosts 10000 --make-up-seconds 241

Steady synthetic load over `--hosts` (10,000) distinct hosts (the key) on the stack's
inbound topic, keyed as the contract asks; a read_committed consumer of the outbound and
dead-letter topics for what a reader sees. In order:
 0. `--first` (for a run started right after `make up`): the end-to-end latency (producer
    send to read_committed visibility) of the first `--first-seconds` (60) at 1,000
    events/s, every event of it measured (target p99 <= 3 s); without it, `--warm-up` (60)
    seconds at 1,000 events/s, not measured, until the standby is in sync;
 1. latency p50/p99 at each of `--rates` (100 and 1,000 events/s), `--seconds` (60) each,
    measured after a lead-in of 10 s at the step's rate (target p99 <= 1 s);
 2. the pair's capacity: a ramp from `--ramp-from` by `--ramp-step` events/s,
    `--ramp-seconds` each, on the stack's own pair, until the lag grows (the steps of 1.
    count as its first steps). A ramp rather than the drain of a backlog: the capacity is
    used as the steady rate of 3., and a drain measures catch-up batches of 20,000
    records, not what the pair sustains when level with the head;
 3. kill -9 of the active -> first output of the new epoch visible read_committed,
    `--rounds` (20) at 50 % of that capacity (target worst <= 2 s), then as many at 80 %
    (target worst <= 3 s); each round waits for the killed engine to be back in sync first;
 4. kill -9 of both engines at once at 1,000 events/s -> the first output of the new
    epoch visible, `--double-kills` (3) rounds (target <= 30 s);
 5. kill -9 of the standby at 1,000 events/s -> the restarted engine back as an in-sync
    standby (GET /pipeline in_sync), `--rejoins` (3) rounds (target <= 30 s);
 6. every event of every step audited in the committed outbound, dead-letter and progress
    topics, chunk by chunk as the run goes: lost and duplicated counted (target 0 and 0).
A progress line at least every 10 s. Each figure is printed against its target, met or
missed; docs/bench/seconds.json and docs/bench/seconds.png (output rate, the steps and
kills marked; the latency of each measured event) are written. `--make-up-seconds` or
`--make-up-log` (the output of the `make up` that started the stack) adds the time of
`make up` (target <= 300 s) to the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import KafkaException

from bench.failover import warm_up
from bench.latency import WARM_UP_S, latency_figures
from bench.plots import plot, rate_series, write_figures
from devkit.chaos import (
    SteadyLoad,
    SupervisedEngines,
    audit_ranges,
    failover_round,
    process_tree,
)
from devkit.harness import (
    OutputSampler,
    VisibleTimes,
    example_pipeline,
    inbound_ends,
    machine,
    summary,
    wait_for,
    wait_gone,
)
from twinstream.engine.client import EngineClient, EngineError
from twinstream.ops.drill import KafkaEpochTail, Takeover, measure_takeover
from twinstream.platform import registry
from twinstream.platform.settings import REPO_ROOT, Settings

PROGRESS_EVERY_S = 10.0
T = TypeVar("T")

# --------------------------------------------------------------------------------------
# The pure part: targets, verdicts, the capacity from a ramp (tests/unit/kits/test_bench_seconds.py)


@dataclass(frozen=True)
class Target:
    key: str  # where the figure is in the JSON, dotted
    what: str
    limit: float
    unit: str


TARGETS: tuple[Target, ...] = (
    Target("first_minute.p99_s", "p99 latency, first 60 s after make up, 1,000/s", 3.0, "s"),
    Target("latency.100.p99_s", "p99 latency at 100 events/s", 1.0, "s"),
    Target("latency.1000.p99_s", "p99 latency at 1,000 events/s", 1.0, "s"),
    Target("kill_active.50.worst_s", "kill -9 of the active -> next output, 50 % cap.", 2.0, "s"),
    Target("kill_active.80.worst_s", "kill -9 of the active -> next output, 80 % cap.", 3.0, "s"),
    Target("kill_both.worst_s", "kill -9 of both engines -> output back", 30.0, "s"),
    Target("rejoin.worst_s", "kill -9 of the standby -> in sync again", 30.0, "s"),
    Target("audit.lost", "events lost over the whole run", 0, "events"),
    Target("audit.duplicated", "events duplicated over the whole run", 0, "events"),
    Target("make_up_s", "make up (as the caller measured it)", 300.0, "s"),
)


@dataclass(frozen=True)
class Verdict:
    target: Target
    value: float | None

    @property
    def met(self) -> bool | None:
        """None when not measured in this run."""
        return None if self.value is None else self.value <= self.target.limit

    def line(self) -> str:
        t = self.target
        limit = f"<= {t.limit:g} {t.unit}"
        if self.value is None:
            return f"{t.what}: not measured (target {limit})"
        value = f"{self.value:,.0f}" if t.unit == "events" else f"{self.value:.2f}"
        return f"{t.what}: {value} {t.unit} (target {limit}): {'met' if self.met else 'MISSED'}"


def lookup(figures: Mapping[str, Any], key: str) -> Any:
    """figures["a"]["b"]... for "a.b..."; None where any part is missing."""
    value: Any = figures
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def verdicts(figures: Mapping[str, Any]) -> list[Verdict]:
    """Each target with the run's figure for it (None: not measured)."""
    found = []
    for target in TARGETS:
        value = lookup(figures, target.key)
        found.append(Verdict(target, None if value is None else float(value)))
    return found


def lag_growing(samples: Sequence[tuple[float, int]], rate: float) -> bool:
    """Whether the lag sampled through a steady step, (seconds, records), grew: both its
    least-squares slope above 5 % of the input rate and its last third's mean more than one
    second of input above its first third's (the rule of bench/latency.py). A micro-batch
    pair's lag is a saw tooth of up to a batch; one rule alone flags a tooth or misses a
    slow climb."""
    if len(samples) < 6:
        return False
    xs = [t for t, _ in samples]
    ys = [float(lag) for _, lag in samples]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / spread if spread else 0
    third = max(1, len(ys) // 3)
    rose = statistics.fmean(ys[-third:]) > statistics.fmean(ys[:third]) + rate
    return slope > 0.05 * rate and rose


def held(step: Mapping[str, Any]) -> bool:
    """A ramp step the pair sustained: the load reached 95 % of its target rate and the lag
    did not grow."""
    return bool(step["rate_achieved"] >= 0.95 * step["rate_target"] and not step["lag_growing"])


def capacity_from_ramp(steps: Sequence[Mapping[str, Any]]) -> tuple[float | None, str]:
    """The highest achieved rate of the steps held before the first one not held (steps in
    rising order), and why the ramp ended there."""
    capacity: float | None = None
    for step in steps:
        if not held(step):
            if step["lag_growing"]:
                why = f"the lag grew at {step['rate_target']:,.0f} events/s"
            else:
                why = (
                    f"the load reached only {step['rate_achieved']:,.0f} of "
                    f"{step['rate_target']:,.0f} events/s (the feeder's limit, not the pair's)"
                )
            return capacity, why
        capacity = float(step["rate_achieved"])
    return capacity, "the ramp's last step was held: the capacity is at least this"


def ramp_rates(start: float, step: float, highest: float) -> list[float]:
    rates = []
    rate = start
    while rate <= highest:
        rates.append(rate)
        rate += step
    return rates


def make_up_seconds(text: str) -> float | None:
    """The time a `make up` took, from its output as the caller kept it: a `SECONDS=<n>` line
    a wrapper added, or the `real` line of bash's `time` (`real 4m15.9s`); the last one."""
    found: float | None = None
    for line in text.splitlines():
        if m := re.search(r"SECONDS=(\d+(?:\.\d+)?)", line):
            found = float(m[1])
        elif m := re.fullmatch(r"\s*real\s+(?:(\d+)m)?(\d+(?:\.\d+)?)s\s*", line):
            found = 60 * int(m[1] or 0) + float(m[2])
    return found


def kafka_retried(action: Callable[[], T], what: str, tries: int = 10, every_s: float = 3.0) -> T:
    """action(), again after a KafkaException up to `tries` times: a partition's leader moves
    when a broker is starved (2 cores shared), and an audit then failed on "Not leader for
    partition"."""
    for attempt in range(1, tries + 1):
        try:
            return action()
        except KafkaException as exc:
            if attempt == tries:
                raise
            print(f"  {what}: {exc}; again in {every_s:.0f} s ({attempt}/{tries})", flush=True)
            time.sleep(every_s)
    raise AssertionError("unreachable")


def counted(ranges: Sequence[tuple[int, int]]) -> int:
    """Events in inclusive (first, last) ranges."""
    return sum(last - first + 1 for first, last in ranges)


# --------------------------------------------------------------------------------------
# The run on the stack


@dataclass
class Run:
    settings: Settings
    engines: SupervisedEngines
    hosts: int
    t0: float = field(default_factory=time.monotonic)
    wall_t0: float = field(default_factory=time.time)
    phase: str = "starting"
    load: SteadyLoad | None = None
    sent: int = 0  # by the loads stopped so far
    marks: list[tuple[float, str]] = field(default_factory=list)
    latency_points: list[tuple[float, float]] = field(default_factory=list)
    audits: list[dict[str, Any]] = field(default_factory=list)
    audited_to: dict[int, int] = field(default_factory=dict)
    started_at: dict[int, int] = field(default_factory=dict)
    sampler: OutputSampler | None = None
    probe: SupervisedEngines | None = None  # quick_engines, for the lag samples of a step

    def __post_init__(self) -> None:
        self.probe = quick_engines(self.settings)
        self.started_at = inbound_ends(self.settings)
        self.audited_to = dict(self.started_at)
        self.sampler = OutputSampler(
            self.settings, [self.settings.outbound_topic, self.settings.dlq_topic]
        )

    def now(self) -> float:
        return time.monotonic() - self.t0

    def say(self, text: str) -> None:
        print(f"[{self.now():6.0f} s] {text}", flush=True)

    def mark(self, what: str) -> None:
        """A line on the plot at this moment; one colour per `what` (four: a step, the kills
        of the active, of both, of the standby)."""
        self.marks.append((self.now(), what))

    def start_load(self, rate: float) -> SteadyLoad:
        assert self.load is None, "one load at a time: the audit counts what each sent"
        self.load = SteadyLoad(self.settings, rate, self.hosts).start()
        return self.load

    def stop_load(self) -> int:
        if self.load is None:
            return 0
        sent = self.load.stop()
        # Both at once for the progress line's `sending` in its thread.
        self.sent, self.load = self.sent + sent, None
        return sent

    @property
    def sending(self) -> int:
        return self.sent + (self.load.sent if self.load is not None else 0)

    def audit(self, step: str, timeout_s: float = 900.0) -> dict[str, Any]:
        """Every event since the last audit, up to the inbound topic's end now (the load
        may go on meanwhile), once an engine has published it: in exactly one committed
        transaction with its outputs."""
        phase, self.phase = self.phase, f"audit ({step}): waiting for it published, reading it"
        ends = inbound_ends(self.settings)
        self.engines.wait_published(ends, timeout_s)
        found = kafka_retried(
            lambda: audit_ranges(self.settings, self.audited_to, ends), f"the audit of {step}"
        )
        self.audited_to = ends
        chunk = {
            "step": step,
            "events": sum(f.rows for f in found.values()),
            "lost": sum(counted(f.missing) for f in found.values()),
            "duplicated": sum(counted(f.duplicated) for f in found.values()),
            "mismatched": sum(counted(f.mismatched) for f in found.values()),
            "problems": [f"partition {p}: {f.summary()}" for p, f in found.items() if not f.ok],
        }
        self.audits.append(chunk)
        self.phase = phase
        self.say(
            f"audit ({step}): {chunk['events']:,} events, {chunk['lost']} lost, "
            f"{chunk['duplicated']} duplicated"
        )
        return chunk


def engine_line(engines: SupervisedEngines) -> str:
    """Each engine's role and lag, as its admin API says."""
    parts = []
    for engine_id, client in engines.clients.items():
        try:
            server, info = client.server(), client.pipeline()
        except EngineError:
            parts.append(f"{engine_id} down")
            continue
        sync = ", in sync" if info.in_sync and server.role == "standby" else ""
        parts.append(f"{engine_id} {server.role} lag {info.lag}{sync}")
    return "; ".join(parts)


def quick_engines(settings: Settings, timeout_s: float = 1.0) -> SupervisedEngines:
    """The stack's engines with admin clients of a short timeout, for samples and progress
    lines that must come on time (a starved engine's 5 s timeouts spaced them out)."""
    engines = SupervisedEngines(settings)
    engines.close()
    token = settings.secret("admin_token")
    engines.clients = {
        e: EngineClient.from_settings(settings, e, token, timeout_s=timeout_s)
        for e in settings.engine_ids
    }
    return engines


class Ticker(threading.Thread):
    """A progress line every PROGRESS_EVERY_S whatever the run is waiting for: the step,
    the events sent, each engine's role and lag, through admin clients of its own with a
    short timeout (a starved engine's 5 s timeouts spaced the lines 15 s apart)."""

    def __init__(self, run: Run) -> None:
        super().__init__(daemon=True, name="progress")
        self.run_ = run
        self.engines = quick_engines(run.settings)
        self._stop_event = threading.Event()
        self.start()

    def run(self) -> None:
        due = time.monotonic() + PROGRESS_EVERY_S
        while not self._stop_event.wait(max(0.0, due - time.monotonic())):
            due += PROGRESS_EVERY_S
            with contextlib.suppress(Exception):  # a progress line never ends the run
                self.run_.say(
                    f"... {self.run_.phase}: {self.run_.sending:,} events sent; "
                    f"{engine_line(self.engines)}"
                )

    def stop(self) -> None:
        self._stop_event.set()
        self.join(15)
        self.engines.close()


def active_lag(engines: SupervisedEngines) -> int | None:
    for client in engines.clients.values():
        with contextlib.suppress(EngineError):
            if client.server().role == "active":
                return client.pipeline().lag
    return None


def hold(run: Run, rate: float, seconds: float) -> dict[str, Any]:
    """The load at `rate` for `seconds` (already started), sampling the active's lag each
    second: the rate achieved, the lag's path and whether it grew."""
    assert run.load is not None
    started, sent0 = time.monotonic(), run.load.sent
    lags: list[tuple[float, int]] = []
    assert run.probe is not None
    while (elapsed := time.monotonic() - started) < seconds:
        lag = active_lag(run.probe)
        if lag is not None:
            lags.append((elapsed, lag))
        time.sleep(max(0.0, min(1.0, started + seconds - time.monotonic())))
    achieved = (run.load.sent - sent0) / (time.monotonic() - started)
    return {
        "rate_target": rate,
        "rate_achieved": round(achieved),
        "seconds": seconds,
        "lag_first": lags[0][1] if lags else None,
        "lag_last": lags[-1][1] if lags else None,
        "lag_max": max((v for _, v in lags), default=None),
        "lag_growing": lag_growing(lags, rate),
    }


def latency_step(run: Run, name: str, rate: float, seconds: float, lead_s: float) -> dict[str, Any]:
    """End-to-end latency of the events sent at `rate` over `seconds` after `lead_s` at the
    same rate (not measured); the lag through the step as hold() gives it."""
    run.phase = f"{name}: {rate:,.0f} events/s"
    run.mark("step")
    visible = VisibleTimes(run.settings)
    try:
        firsts = inbound_ends(run.settings)
        run.start_load(rate)
        wall_started = time.time()
        step = hold(run, rate, lead_s + seconds)
        run.stop_load()
        ends = inbound_ends(run.settings)
        run.phase = f"{name}: waiting for the step's last events to be visible"
        wait_for(lambda: visible.has(ends), 600, f"the last records {ends} visible", every_s=0.5)
        since_ms = int(1000 * (wall_started + lead_s)) if lead_s else 0
        measured = visible.latencies(firsts, ends, since_ms)
        run.latency_points.extend(
            (visible.seen[m] - run.wall_t0, 1000 * v) for m, v in list(measured.items())[::10]
        )
    finally:
        visible.stop()
    figures = latency_figures(list(measured.values()))
    step.update(figures)
    step["p50_s"] = round(figures["p50_ms"] / 1000, 3)
    step["p99_s"] = round(figures["p99_ms"] / 1000, 3)
    run.say(
        f"{name} at {rate:,.0f} events/s ({step['rate_achieved']:,} achieved): p50 "
        f"{step['p50_s']} s, p99 {step['p99_s']} s, max {figures['max_ms'] / 1000} s over "
        f"{figures['measured']:,} events; lag {step['lag_first']} -> {step['lag_last']}"
    )
    run.audit(name)
    return step


def ramp(run: Run, rates: Sequence[float], seconds: float) -> list[dict[str, Any]]:
    """A step per rate, up to the first the pair does not hold."""
    steps = []
    for rate in rates:
        run.phase = f"ramp: {rate:,.0f} events/s for {seconds:.0f} s"
        run.mark("step")
        run.start_load(rate)
        try:
            step = hold(run, rate, seconds)
        finally:
            run.stop_load()
        steps.append(step)
        run.say(
            f"ramp {rate:,.0f} events/s: {step['rate_achieved']:,} achieved, lag "
            f"{step['lag_first']} -> {step['lag_last']} (max {step['lag_max']}): "
            f"{'held' if held(step) else 'not held'}"
        )
        if not held(step):
            break
    run.phase = "ramp: the backlog published"
    run.audit("ramp")
    return steps


@contextlib.contextmanager
def loaded(run: Run, rate: float, settle_s: float) -> Iterator[None]:
    """The load at `rate` throughout, once the pair is in sync under it (bench.failover's
    warm-up: after `settle_s` of load at least); its last events audited after it."""
    run.start_load(rate)
    try:
        warm_up(run.engines, time.monotonic(), settle_s)
        yield
    finally:
        run.stop_load()


def kill_active_rounds(
    run: Run, label: str, rate: float, rounds: int, rejoin_timeout_s: float, settle_s: float
) -> dict[str, Any]:
    """kill -9 of the active, `rounds` times at `rate`, each after the pair is whole again."""
    outputs: list[float] = []
    roles: list[float] = []
    rejoin: list[float] = []
    swaps = 0
    with loaded(run, rate, settle_s):
        for n in range(1, rounds + 1):
            run.phase = f"kill -9 of the active at {label} ({rate:,.0f}/s), round {n}/{rounds}"
            r = failover_round(run.engines, "kill", rejoin_timeout_s=rejoin_timeout_s)
            # At the kill (the round waited for the pair first): rejoin_s counts from it.
            run.marks.append((run.now() - r.rejoin_s, "kill -9 of the active"))
            if r.takeover.first_output_s is None:
                raise AssertionError(f"no output after the takeover: {r.takeover.describe()}")
            outputs.append(r.takeover.first_output_s)
            if r.takeover.role_s is not None:
                roles.append(r.takeover.role_s)
            rejoin.append(r.rejoin_s)
            swaps += r.swapped
            run.say(
                f"kill active {label} {n}/{rounds}: {r.takeover.describe()}; pair whole again "
                f"after {r.rejoin_s:.1f} s"
            )
            run.audit(f"kill active {label}, round {n}")
    run.audit(f"kill active {label}, the load's end")
    return {
        "rate": rate,
        **(
            {"worst_s": round(max(outputs), 3), "to_first_output_s": summary(outputs)}
            if outputs
            else {}
        ),
        "to_active_s": summary(roles) if roles else None,
        "pair_whole_again_s": summary(rejoin) if rejoin else None,
        "role_swaps": swaps,
    }


def kill_both(run: Run, timeout_s: float) -> tuple[Takeover, float | None]:
    """kill -9 of both engines at once; (the takeover as seen from the kill: who and when
    active, the first output of the new epoch; when the pair was whole again)."""
    active, _standby = run.engines.wait_pair(timeout_s=600)
    client = run.engines.clients[active]
    result = Takeover.of(active, client.server().epoch, client.pipeline())
    pids = {e: run.engines.pid(e) for e in run.engines.clients}
    trees = [process_tree(pid) for pid in pids.values() if pid]
    with KafkaEpochTail(run.settings) as tail:
        started = time.monotonic()
        run.mark("kill -9 of both")
        for pid in pids.values():
            if pid:
                os.kill(pid, signal.SIGKILL)
        # The drivers gone, so that no dying admin API answers "active" to the watch.
        wait_gone(set(pids.values()) - {0}, 30)
        measure_takeover(result, run.engines.clients, tail, started, timeout_s)
    for tree in trees:
        wait_gone(tree, 120)
    for engine_id, pid in pids.items():
        run.engines.wait_restarted(engine_id, pid)
    whole: float | None = None
    with contextlib.suppress(AssertionError):
        run.engines.wait_pair(timeout_s=900)
        whole = time.monotonic() - started
    return result, whole


def kill_both_rounds(run: Run, rate: float, rounds: int, timeout_s: float) -> dict[str, Any]:
    outputs: list[float] = []
    wholes: list[float] = []
    with loaded(run, rate, 0.0):
        for n in range(1, rounds + 1):
            run.phase = f"kill -9 of both engines at {rate:,.0f}/s, round {n}/{rounds}"
            result, whole = kill_both(run, timeout_s)
            if result.first_output_s is None:
                raise AssertionError(f"no output within {timeout_s} s of killing both engines")
            outputs.append(result.first_output_s)
            if whole is not None:
                wholes.append(whole)
            run.say(
                f"kill both {n}/{rounds}: {result.describe()}; pair in sync again after "
                f"{'(not within 900 s)' if whole is None else f'{whole:.1f} s'}"
            )
            run.audit(f"kill both, round {n}")
    run.audit("kill both, the load's end")
    return {
        "rate": rate,
        **(
            {"worst_s": round(max(outputs), 3), "to_first_output_s": summary(outputs)}
            if outputs
            else {}
        ),
        "pair_in_sync_again_s": summary(wholes) if wholes else None,
    }


def rejoin_rounds(run: Run, rate: float, rounds: int, timeout_s: float) -> dict[str, Any]:
    """kill -9 of the standby; supervisord restarts it: until it reports in sync."""
    times: list[float] = []
    with loaded(run, rate, 0.0):
        for n in range(1, rounds + 1):
            run.phase = f"kill -9 of the standby at {rate:,.0f}/s, round {n}/{rounds}"
            active, standby = run.engines.wait_pair(timeout_s=600)
            pid = run.engines.pid(standby)
            tree = process_tree(pid)
            run.mark("kill -9 of the standby")
            started = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            wait_gone({pid}, 30)
            run.engines.wait_restarted(standby, pid)

            def back(engine_id: str = standby) -> bool:
                # Back to redundancy: normally as the in-sync standby; should the active
                # lose its session meanwhile (failover_round's role swap) the restarted
                # engine may be the active, the other in sync: the pair is whole as well.
                pair = run.engines.current_pair()
                return pair is not None and engine_id in pair

            wait_for(back, timeout_s, f"engine {standby} back in an in-sync pair", every_s=0.2)
            times.append(time.monotonic() - started)
            wait_gone(tree, 60)
            still = run.engines.current_pair()
            run.say(
                f"rejoin {n}/{rounds}: engine {standby} in sync {times[-1]:.1f} s after the "
                f"kill (active {still[0] if still else '?'}, was {active})"
            )
            run.audit(f"rejoin, round {n}")
    run.audit("rejoin, the load's end")
    return {
        "rate": rate,
        **({"worst_s": round(max(times), 3), "s": summary(times)} if times else {}),
    }


def arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, default=10_000, help="distinct keys in the load")
    parser.add_argument("--first", action="store_true", help="measure the first minute first")
    parser.add_argument("--first-rate", type=float, default=1000.0)
    parser.add_argument("--first-seconds", type=float, default=60.0)
    parser.add_argument(
        "--warm-up", type=float, default=60.0, help="seconds of load before step 1 (no --first)"
    )
    parser.add_argument("--warm-up-rate", type=float, default=1000.0)
    parser.add_argument("--rates", type=float, nargs="+", default=[100.0, 1000.0])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of a latency step")
    parser.add_argument("--ramp-from", type=float, default=2000.0)
    parser.add_argument("--ramp-step", type=float, default=500.0)
    parser.add_argument("--ramp-to", type=float, default=12000.0, help="the ramp's last rate")
    parser.add_argument("--ramp-seconds", type=float, default=45.0)
    parser.add_argument(
        "--capacity", type=float, help="skip the ramp and take this capacity (events/s)"
    )
    parser.add_argument("--rounds", type=int, default=20, help="kills of the active per rate")
    parser.add_argument("--shares", type=float, nargs="+", default=[0.5, 0.8])
    parser.add_argument("--double-kills", type=int, default=3)
    parser.add_argument("--rejoins", type=int, default=3)
    parser.add_argument("--kill-rate", type=float, default=1000.0, help="rate of steps 4 and 5")
    parser.add_argument("--settle", type=float, default=30.0, help="load before kill rounds")
    parser.add_argument("--rejoin-timeout", type=float, default=900.0)
    parser.add_argument("--make-up-seconds", type=float)
    parser.add_argument("--make-up-log", type=Path)
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "bench")
    parser.add_argument("--name", default="seconds", help="the JSON's and plot's file name")
    return parser.parse_args(argv)


def measure(run: Run, args: argparse.Namespace, figures: dict[str, Any]) -> None:
    """Steps 0-5 into `figures`, as they are measured (a failed step ends the run; the
    figures so far are kept)."""
    if args.first:
        step = latency_step(run, "first minute", args.first_rate, args.first_seconds, 0.0)
        figures["first_minute"] = step
    else:
        run.phase = f"warm-up at {args.warm_up_rate:,.0f} events/s, {args.warm_up:.0f} s at least"
        run.mark("step")
        with loaded(run, args.warm_up_rate, args.warm_up):
            pass
        run.audit("warm-up")
    run.phase = "waiting for an active and an in-sync standby"
    run.engines.wait_pair(timeout_s=900)
    steps = []
    for rate in args.rates:
        step = latency_step(run, "latency", rate, args.seconds, WARM_UP_S)
        figures["latency"][f"{rate:.0f}"] = step
        steps.append(step)
    how = "a ramp: the latency steps, then rising steady rates until the lag grows"
    if args.capacity:
        capacity, why, how = args.capacity, "given with --capacity", "not measured"
    else:
        if all(held(step) for step in steps):  # else the ramp has ended already
            rates = ramp_rates(args.ramp_from, args.ramp_step, args.ramp_to)
            steps += ramp(run, [r for r in rates if r > max(args.rates)], args.ramp_seconds)
        figures["ramp"] = steps
        capacity, why = capacity_from_ramp(steps)
    figures["capacity"] = {"events_per_s": capacity, "why": why, "how": how}
    run.say(f"capacity: {capacity} events/s ({why})")
    if capacity is None:
        # Steps 4 and 5 run at their own rate: still measured.
        figures["kill_active"]["skipped"] = f"no capacity measured: {why}"
    for share in args.shares if capacity is not None else []:
        label = f"{100 * share:.0f}"
        figures["kill_active"][label] = kill_active_rounds(
            run,
            f"{label} %",
            round(share * capacity),
            args.rounds,
            args.rejoin_timeout,
            args.settle,
        )
    figures["kill_both"] = kill_both_rounds(run, args.kill_rate, args.double_kills, 300.0)
    figures["rejoin"] = rejoin_rounds(run, args.kill_rate, args.rejoins, 600.0)


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments(argv)
    settings = example_pipeline()
    if registry.load(settings).name != "hostmetrics":
        raise SystemExit("bench.seconds drives the stack's hostmetrics pipeline")
    engines = SupervisedEngines(settings)
    if not engines.supervisor.is_running():
        raise SystemExit("the local stack is not running: start it with `make up`")
    make_up = args.make_up_seconds
    if make_up is None and args.make_up_log is not None:
        make_up = make_up_seconds(args.make_up_log.read_text(errors="replace"))
    run = Run(settings, engines, args.hosts)
    ticker = Ticker(run)
    figures: dict[str, Any] = {
        "command": "python -m bench.seconds " + " ".join(sys.argv[1:] if argv is None else argv),
        "hosts": args.hosts,
        "make_up_s": make_up,
        "latency": {},
        "kill_active": {},
        "stopped_early": None,
    }
    try:
        measure(run, args, figures)
    except (AssertionError, RuntimeError, KafkaException, KeyboardInterrupt) as exc:
        figures["stopped_early"] = str(exc) or type(exc).__name__
        run.say(f"run stopped early: {figures['stopped_early']}")
    finally:
        run.stop_load()
    try:
        run.phase = "the last audit"
        try:
            # After a step failed the engines may never publish the rest: a shorter wait.
            run.audit("the rest", 900.0 if figures["stopped_early"] is None else 300.0)
        except (AssertionError, RuntimeError, KafkaException, KeyboardInterrupt) as exc:
            # The figures so far are still written (Ctrl-C here skips only the audit); the
            # audit says what it could not check.
            figures["audit_error"] = str(exc) or type(exc).__name__
            run.say(f"the last audit failed: {exc}")
        grew = sum(run.audited_to.values()) - sum(run.started_at.values())
        figures["audit"] = {
            "events_sent": run.sent,
            "inbound_grew": grew,
            "events": sum(a["events"] for a in run.audits),
            "lost": sum(a["lost"] for a in run.audits),
            "duplicated": sum(a["duplicated"] for a in run.audits),
            "mismatched": sum(a["mismatched"] for a in run.audits),
            "chunks": run.audits,
        }
        if grew != run.sent:
            figures["audit"]["note"] = f"the inbound grew by {grew:,}, the loads sent {run.sent:,}"
    finally:
        ticker.stop()
        assert run.sampler is not None
        run.sampler.stop()
        engines.close()
        if run.probe is not None:
            run.probe.close()
    figures["machine"] = machine()
    figures["verdicts"] = [
        {"what": v.target.what, "value": v.value, "target": v.target.limit, "met": v.met}
        for v in verdicts(figures)
    ]
    path = write_figures(args.output, args.name, figures, echo=False)
    print(
        json.dumps(
            {k: v for k, v in figures.items() if k not in ("ramp", "audit", "verdicts")}, indent=1
        )
    )
    print("\nIssue 35's targets, this run:")
    for v in verdicts(figures):
        print(f"  {v.line()}")
    print(f"wrote {path}")
    print(f"wrote {plot_run(run, args.output / f'{args.name}.png')}")
    met = [v.met for v in verdicts(figures) if v.met is not None]
    return 0 if figures["stopped_early"] is None and all(met) else 1


def plot_run(run: Run, path: Path) -> Path:
    assert run.sampler is not None
    points = sorted(run.latency_points)
    return plot(
        path,
        f"Issue 35's targets in one run: the stack's hostmetrics pair, {run.hosts:,} keys",
        {"output events/s, 3 s average": rate_series(run.sampler.samples, run.t0, window_s=3.0)},
        "output events/s",
        marks=run.marks,
        xlabel="seconds since the run's start",
        second=(
            "latency (ms)",
            {
                "send -> read_committed, every 10th": (
                    [t for t, _ in points],
                    [v for _, v in points],
                )
            },
        ),
    )


if __name__ == "__main__":
    raise SystemExit(main())
