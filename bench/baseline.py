"""The usual alternatives to a Twinstream pair, for bench/kafka_streams.py and
bench/flink.py: processes of java/kafka-streams' StandbyPipeline (a stateful pipeline,
exactly_once_v2, one standby replica, every other setting Kafka Streams' default) and of
java/flink's CheckpointedPipeline (a stateful pipeline with an exactly-once Kafka sink,
restarted from its latest checkpoint), started and restarted by pid as a process
supervisor would, and followed through the status lines they print.

Their outputs carry the same `msg_id` and `engine_id` headers as a Twinstream engine's, so
the same read_committed audit checks them for gaps and duplicates.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.plots import plot, rate_series
from devkit.chaos import SteadyLoad
from devkit.harness import OutputSampler, machine, summary, wait_for
from twinstream.edge.reader import read_committed
from twinstream.ops.audit import Findings, find_id_problems
from twinstream.platform.kafka import connection, watermarks
from twinstream.platform.settings import REPO_ROOT, Settings
from twinstream.stack.core import write_if_changed
from twinstream.stack.render import java_command

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class App:
    """A baseline's main class, the jar folder `make install` builds it into, its heap."""

    folder: str
    jar_prefix: str
    main: str
    heap: str


KAFKA_STREAMS = App(
    "kafka-streams",
    "twinstream-kafka-streams-baseline",
    "io.twinstream.baseline.StandbyPipeline",
    "256m",
)
# Flink's local MiniCluster (job manager and task manager in one JVM) wants more room.
FLINK = App(
    "flink", "twinstream-flink-baseline", "io.twinstream.baseline.CheckpointedPipeline", "768m"
)
# One input partition, as the Twinstream pipeline has: one task, 0_0.
TASK = "0_0"
_STATUS = re.compile(
    r"^status state=(?P<state>\w+) active=(?P<active>\S*) standby=(?P<standby>\S*)"
    r" lag=(?P<lag>-|\d+)$"
)


@dataclass(frozen=True)
class Status:
    state: str
    active: tuple[str, ...]
    standby: tuple[str, ...]
    lag: int | None  # the standby store's offset lag; None while not known


def parse_status(line: str) -> Status | None:
    """A StandbyPipeline status line; None for any other line."""
    match = _STATUS.match(line.strip())
    if match is None:
        return None
    return Status(
        state=match["state"],
        active=tuple(t for t in match["active"].split(",") if t),
        standby=tuple(t for t in match["standby"].split(",") if t),
        lag=None if match["lag"] == "-" else int(match["lag"]),
    )


def pair(statuses: Mapping[str, Status | None], max_lag: int) -> tuple[str, str] | None:
    """(active, standby) once one running instance holds the task and another, running,
    keeps its standby replica within `max_lag` records: the Kafka Streams counterpart of a
    Twinstream active with an in-sync standby."""
    running = {n: s for n, s in statuses.items() if s is not None and s.state == "RUNNING"}
    actives = [n for n, s in running.items() if TASK in s.active]
    standbys = [
        n
        for n, s in running.items()
        if TASK in s.standby and s.lag is not None and s.lag <= max_lag
    ]
    if len(actives) == 1 and standbys and standbys[0] != actives[0]:
        return actives[0], standbys[0]
    return None


class Instance:
    """One baseline process. Its stdout is read by a thread: Kafka Streams status lines
    update `status` (and `active_since`, when this instance took the task); every line goes
    to its log file."""

    def __init__(
        self,
        name: str,
        settings: Settings,
        application_id: str,
        workdir: Path,
        app: App = KAFKA_STREAMS,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.app = app
        self.extra_args = list(extra_args)
        self.settings = settings
        self.application_id = application_id
        self.state_dir = workdir / f"{app.folder}-{name}"
        self.log_path = workdir / f"{app.folder}-{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.status: Status | None = None
        self.active_since: float | None = None
        self.starts = 0

    def command(self) -> list[str]:
        return java_command(
            self.app.main,
            self.settings.jars_dir / self.app.folder,
            self.app.heap,
            [
                self.settings.bootstrap_servers,
                self.application_id,
                self.settings.inbound_topic,
                self.settings.outbound_topic,
                # Its outputs' engine_id: which process wrote them, across restarts.
                self.tag,
                str(self.state_dir),
                *self.extra_args,
            ],
            {},
        )

    def client_env(self) -> dict[str, str]:
        """With Kafka security, the stack's admin login (a super user: a baseline's internal
        topics, groups and transactional ids are its own, and no pipeline's ACLs name them)
        in a properties file only its owner reads, named to the JVM by the variable
        java/baseline-common's ClientConfig reads."""
        security = connection(
            self.settings.model_copy(update={"kafka_role": "admin"})
        ).java_security()
        if not security:
            return {}
        path = self.state_dir.parent / f"{self.app.folder}-{self.name}-client.properties"
        write_if_changed(path, "".join(f"{k}={v}\n" for k, v in security.items()), private=True)
        return {"TWINSTREAM_KAFKA_CLIENT_PROPERTIES": str(path)}

    @property
    def tag(self) -> str:
        """The engine_id its current process writes."""
        return f"{self.name}.{self.starts}"

    def start(self) -> None:
        jars = self.settings.jars_dir / self.app.folder
        if not any(jars.glob(f"{self.app.jar_prefix}*.jar")):
            raise FileNotFoundError(f"no {self.app.main} in {jars}: run `make install`")
        self.starts += 1
        self.status = None
        self.active_since = None
        self.proc = subprocess.Popen(
            self.command(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.client_env()},
        )
        threading.Thread(
            target=self._read, args=(self.proc,), daemon=True, name=f"{self.app.folder}-{self.name}"
        ).start()
        log.info("%s instance %s started, pid %s", self.app.folder, self.name, self.proc.pid)

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        with self.log_path.open("ab") as out:
            out.write(f"--- start {self.starts}, pid {proc.pid}\n".encode())
            for raw in proc.stdout:
                out.write(raw)
                out.flush()
                status = parse_status(raw.decode("utf-8", errors="replace"))
                if status is None or proc is not self.proc:
                    continue
                if TASK not in status.active:
                    self.active_since = None
                elif self.active_since is None:
                    self.active_since = time.monotonic()
                self.status = status

    def kill9(self) -> None:
        """SIGKILL, as when its machine dies; returns once the process is gone."""
        if self.proc is None:
            return
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        """SIGTERM (Kafka Streams closes and leaves the group), SIGKILL after 30 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait(30)


class OutputTail(threading.Thread):
    """(monotonic time visible, engine_id) of each committed output, and the highest msg_id
    seen, from the outbound topic's end when created."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(daemon=True, name="output-tail")
        self.settings = settings
        self.seen: list[tuple[float, str | None]] = []
        self.last_msg_id = -1
        self.done = threading.Event()
        self.offset = watermarks(settings, settings.outbound_topic)[1]
        self.start()

    def run(self) -> None:
        while not self.done.is_set():
            # Short idle timeouts: the loop notices `done` while no output arrives (as
            # during a Kafka Streams takeover, for most of a minute).
            for record in read_committed(
                self.settings, self.settings.outbound_topic, self.offset, 2.0, follow=True
            ):
                self.seen.append((time.monotonic(), record.engine_id))
                if record.msg_id is not None:
                    self.last_msg_id = max(self.last_msg_id, record.msg_id)
                self.offset = record.offset + 1

    def first_after(self, since: float, other_than: str) -> float | None:
        """When the first output after `since` from another process than `other_than`
        became visible."""
        return next((t for t, engine in self.seen if t >= since and engine != other_than), None)

    def stop(self) -> None:
        self.done.set()
        self.join(10)


def output_caught_up(settings: Settings, tail: OutputTail) -> bool:
    """The output is within TWINSTREAM_IN_SYNC_LAG events of the input: the steady state a
    round must start from, and what a takeover has not finished before it reaches."""
    end = watermarks(settings, settings.inbound_topic)[1]
    return end - 1 - tail.last_msg_id <= settings.in_sync_lag


def kill_and_restart(
    instances: Mapping[str, Instance], victim: str, tail: OutputTail, timeout_s: float
) -> tuple[float, float, Callable[[], None]]:
    """Kill -9 `victim`, restart it at once as a supervisor would, and wait for the first
    output of another process than the killed one. Returns the kill's and that output's
    monotonic times, and the progress reporter for the caller's further waits."""
    process = instances[victim]
    tag = process.tag
    killed = time.monotonic()
    process.kill9()
    process.start()
    report = progress(instances, killed, f"since the kill of {victim}")

    def visible() -> float | None:
        report()
        return tail.first_after(killed, tag)

    first_output: float = wait_for(
        visible, timeout_s, f"output after the kill of {victim}", every_s=0.05
    )
    return killed, first_output, report


def figure(rounds: Sequence[Mapping[str, Any]], key: str) -> dict[str, Any] | None:
    """summary() of one per-round figure, rounds without it left out; None if none has it."""
    values = [r[key] for r in rounds if r.get(key) is not None]
    return summary(values) if values else None


def progress(
    instances: Mapping[str, Instance], since: float, what: str, every_s: float = 5.0
) -> Callable[[], None]:
    """A callable that prints, at most every `every_s`, how long `what` has taken and where
    each instance stands: the waits of a baseline's takeover last up to a minute."""
    last = [time.monotonic()]

    def report() -> None:
        now = time.monotonic()
        if now - last[0] >= every_s:
            last[0] = now
            states = "; ".join(f"{n}: {i.status or 'running'}" for n, i in instances.items())
            print(f"  {now - since:5.1f} s {what}: {states}", flush=True)

    return report


def arguments(description: str) -> argparse.ArgumentParser:
    """The options every baseline benchmark takes; each adds its own."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5, help="kills of the active process")
    parser.add_argument("--rate", type=float, default=1000.0, help="inbound events per second")
    parser.add_argument(
        "--settle", type=float, default=60.0, help="seconds of load before the first round"
    )
    parser.add_argument(
        "--takeover-timeout", type=float, default=300.0, help="seconds for the first output"
    )
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "bench")
    return parser


@dataclass
class Run:
    """What a baseline benchmark measured: its rounds (each with `killed_at`, monotonic),
    why it stopped early if it did, the load sent, the audit, and the output over time."""

    rounds: list[dict[str, Any]]
    stopped: str | None
    sent: int
    findings: Findings
    samples: list[tuple[float, int]]
    t0: float


def run_rounds(
    settings: Settings,
    instances: Mapping[str, Instance],
    one_round: Callable[[OutputTail], dict[str, Any]],
    args: argparse.Namespace,
) -> Run:
    """Start `instances` under steady load at `args.rate`, wait `args.settle` seconds, run
    `one_round` `args.rounds` times (the options arguments() defines), then stop the load,
    wait for every event to be output and audit the output exactly once. A round that
    fails, or Ctrl-C, ends the rounds; the ones before it are kept. Every instance is
    stopped by pid at the end, however the run ended."""
    rounds, rate, settle_s = args.rounds, args.rate, args.settle
    done: list[dict[str, Any]] = []
    stopped: str | None = None
    try:
        first = watermarks(settings, settings.inbound_topic)[1]
        t0 = time.monotonic()
        sampler = OutputSampler(settings, [settings.outbound_topic])
        tail = OutputTail(settings)
        load = SteadyLoad(settings, rate).start()
        try:
            for instance in instances.values():
                instance.start()
            print(f"started; {settle_s:.0f} s of load first", flush=True)
            report = progress(instances, t0, "of load")
            wait_for(
                lambda: report() or time.monotonic() - t0 >= settle_s, settle_s + 5, "settling"
            )
            try:
                for n in range(1, rounds + 1):
                    result = one_round(tail)
                    done.append(result)
                    shown = ", ".join(
                        f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                        for k, v in result.items()
                        if v is not None and k != "killed_at"
                    )
                    print(f"kill {n}/{rounds}: {shown}", flush=True)
            except (AssertionError, KeyboardInterrupt) as exc:
                stopped = str(exc) or "interrupted"
                print(f"run stopped early: {stopped}", flush=True)
        finally:
            sent = load.stop()
        print(f"waiting for all {sent:,} events of the run to be output", flush=True)
        wait_for(lambda: len(tail.seen) >= sent, 600, "the run's events output", every_s=1.0)
        tail.stop()
        sampler.stop()
        ids = [r.msg_id for r in read_committed(settings, settings.outbound_topic, 0)]
        findings = find_id_problems(ids, first, first + sent)
    finally:
        for instance in instances.values():
            instance.stop()
    return Run(done, stopped, sent, findings, sampler.samples, t0)


def write_run(run: Run, output: Path, name: str, title: str, figures: dict[str, Any]) -> int:
    """Print `figures` with the run's audit, write them to `output`/<name>.json and the
    output rate over time, kills marked, to <name>.png; the exit status: 0 when every round
    ran and the output holds every event exactly once."""
    figures = {
        **figures,
        "messages": run.sent,
        "stopped_early": run.stopped,
        "gaps": run.findings.missing,
        "duplicates": run.findings.duplicated,
        "machine": machine(),
    }
    print(json.dumps(figures, indent=2))
    output.mkdir(parents=True, exist_ok=True)
    (output / f"{name}.json").write_text(json.dumps(figures, indent=2) + "\n")
    path = plot(
        output / f"{name}.png",
        title,
        {"output events/s, 3 s average": rate_series(run.samples, run.t0, window_s=3.0)},
        "output events/s",
        marks=[(r["killed_at"] - run.t0, "kill") for r in run.rounds],
    )
    print(f"wrote {path}")
    return 0 if run.findings.ok and run.stopped is None else 1
