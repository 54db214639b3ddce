"""The Kafka Streams alternative to a Twinstream pair, for bench/kafka_streams.py: instances
of java/kafka-streams' StandbyPipeline (a stateful pipeline, exactly_once_v2, one standby
replica, every other setting Kafka Streams' default), started and restarted by pid as a
process supervisor would, and followed through the status lines they print.

Its outputs carry the same `msg_id` and `engine_id` headers as a Twinstream engine's, so
the same read_committed audit checks them for gaps and duplicates.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from twinstream.config import Settings
from twinstream.stack.render import java_command

log = logging.getLogger(__name__)

MAIN = "io.twinstream.baseline.StandbyPipeline"
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
    """One StandbyPipeline process. Its stdout is read by a thread: status lines update
    `status` (and `active_since`, when this instance took the task); every line goes to
    its log file."""

    def __init__(self, name: str, settings: Settings, application_id: str, workdir: Path) -> None:
        self.name = name
        self.settings = settings
        self.application_id = application_id
        self.state_dir = workdir / f"kstreams-{name}"
        self.log_path = workdir / f"kstreams-{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.status: Status | None = None
        self.active_since: float | None = None
        self.starts = 0

    def command(self) -> list[str]:
        return java_command(
            MAIN,
            self.settings.jars_dir / "kafka-streams",
            "256m",
            [
                self.settings.bootstrap_servers,
                self.application_id,
                self.settings.inbound_topic,
                self.settings.outbound_topic,
                # Its outputs' engine_id: which process wrote them, across restarts.
                f"{self.name}.{self.starts}",
                str(self.state_dir),
            ],
            {},
        )

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def start(self) -> None:
        jars = self.settings.jars_dir / "kafka-streams"
        if not any(jars.glob("twinstream-kafka-streams-baseline*.jar")):
            raise FileNotFoundError(f"no Kafka Streams baseline in {jars}: run `make install`")
        self.starts += 1
        self.status = None
        self.active_since = None
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        threading.Thread(
            target=self._read, args=(self.proc,), daemon=True, name=f"kstreams-{self.name}"
        ).start()
        log.info("kafka streams instance %s started, pid %s", self.name, self.proc.pid)

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
