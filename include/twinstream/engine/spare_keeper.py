"""The keeper of a machine's warm spares (twinstream.engine.spare): it keeps `count` spare
processes warming or warm, and starts a new one as soon as one becomes an engine or ends.

Guarantee: the keeper never stops, signals or counts as a spare a process that became an
engine (the spare's adopted note says so before it serves as one), and it stops its spares,
by pid, when it stops. Each spare runs niced (`SPARE_NICENESS`) in a session of its own, so
that a supervisor's stop of the keeper's process group reaches no engine, and retires by
itself once its keeper is gone.

`make up` runs one keeper per machine (supervisord's program `spares`, TWINSTREAM_SPARES
spares); a test's harness keeps its own in the test process (devkit/spares.py) and asks its
spares itself (`take`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from twinstream.engine.spare import SPARE_NICENESS, Adoption, SpareState, adopted_note, ask
from twinstream.platform.settings import REPO_ROOT

log = logging.getLogger(__name__)

ENGINE_SCRIPT = REPO_ROOT / "spark_jobs" / "engine.py"
# What a keeper keeps, rewritten each second in its folder (JSON: keeper, at, spares).
STATUS_FILE = "status.json"


def spare_command(socket_path: Path) -> list[str]:
    """A spare engine process listening on `socket_path` once warm, niced: its JVM inherits
    the priority, and once adopted it raises its threads' when in sync or leading
    (twinstream.engine.priority)."""
    return [
        "nice",
        "-n",
        str(SPARE_NICENESS),
        sys.executable,
        str(ENGINE_SCRIPT),
        "--spare",
        str(socket_path),
    ]


@dataclass
class SpareProcess:
    name: str
    socket: Path
    log_path: Path
    proc: subprocess.Popen[bytes]

    def adopted(self) -> dict[str, Any] | None:
        """Which engine it became (engine_id, pid, at), once adopted."""
        try:
            note: dict[str, Any] = json.loads(adopted_note(self.socket).read_text())
        except (OSError, ValueError):
            return None
        return note

    @property
    def status(self) -> SpareState:
        """Its state as seen from outside (twinstream.engine.spare's states; an offer in
        flight shows as warm): its note, its exit, its socket."""
        if self.adopted() is not None:
            return SpareState.ADOPTED
        if self.proc.poll() is not None:
            return SpareState.RETIRED
        return SpareState.WARM if self.socket.is_socket() else SpareState.WARMING


class Keeper:
    """`count` spares in `folder` (their sockets, logs and adopted notes), started with
    `env` (the engines' own environment)."""

    def __init__(
        self,
        folder: Path,
        count: int,
        env: Mapping[str, str],
        command: Callable[[Path], list[str]] | None = None,
    ) -> None:
        """`command`: a spare's argv given its socket (a unit test's stand-in spare); by
        default the engine's own, niced."""
        self.folder = folder
        self.command = command or spare_command
        self.count = count
        self.env = dict(env)
        self.spares: list[SpareProcess] = []
        self.adopted: list[SpareProcess] = []
        self._lock = threading.Lock()  # `take` (a test's thread) and `fill` (the loop)
        # Names of their own per keeper: a restarted keeper's spares never meet an earlier
        # one's notes.
        self._names = (f"{os.getpid()}-{n}" for n in itertools.count(1))

    def fill(self) -> None:
        """Count again (an adopted or ended spare is none), and start what is missing."""
        with self._lock:
            kept = []
            for spare in self.spares:
                status = spare.status
                if status is SpareState.ADOPTED:
                    self.adopted.append(spare)
                    log.info("spare %s became engine %s", spare.name, spare.adopted())
                elif status is SpareState.RETIRED:
                    log.warning(
                        "spare %s ended (exit %s): see %s",
                        spare.name,
                        spare.proc.returncode,
                        spare.log_path,
                    )
                else:
                    kept.append(spare)
            self.spares = kept
            while len(self.spares) < self.count:
                self.spares.append(self._start())

    def _start(self) -> SpareProcess:
        self.folder.mkdir(parents=True, exist_ok=True)
        name = next(self._names)
        socket_path = self.folder / f"spare-{name}.sock"
        log_path = self.folder / f"spare-{name}.log"
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                self.command(socket_path),
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                # Its own session: a stop of the keeper's group never reaches it, nor the
                # engine it may become.
                start_new_session=True,
            )
        log.info("spare %s started (pid %s), warming; its log: %s", name, proc.pid, log_path)
        return SpareProcess(name, socket_path, log_path, proc)

    def take(self, engine_id: str, env: Mapping[str, str]) -> SpareProcess | None:
        """One of this keeper's warm spares, now the engine `engine_id` with `env`; None: start
        the engine cold. A new spare starts warming in its place."""
        try:
            for spare in list(self.spares):
                if spare.status is SpareState.WARM and ask(spare.socket, Adoption(engine_id, env)):
                    return spare
            return None
        finally:
            self.fill()

    def run(self, stop: threading.Event, every_s: float = 1.0) -> None:
        """Keep the count until `stop` is set; then stop the spares. Each round writes what
        it keeps to `STATUS_FILE` (what `twinstream status` and the page show)."""
        try:
            while True:
                self.fill()
                write_status(self.folder, self.status())
                if stop.wait(every_s):
                    return
        finally:
            self.close()
            with contextlib.suppress(FileNotFoundError):
                (self.folder / STATUS_FILE).unlink()

    def status(self) -> list[dict[str, Any]]:
        """Each spare and each adopted one still alive: name, pid, status, engine_id, at."""
        with self._lock:
            rows = []
            self.adopted = [s for s in self.adopted if s.proc.poll() is None]
            for spare in [*self.spares, *self.adopted]:
                note = spare.adopted() or {}
                rows.append(
                    {
                        "name": spare.name,
                        "pid": spare.proc.pid,
                        "status": str(spare.status),
                        "engine_id": note.get("engine_id"),
                        "at": note.get("at"),
                    }
                )
            return rows

    def close(self, timeout_s: float = 30.0) -> None:
        """Every spare not adopted stopped, by pid, with its JVM; adopted ones are engines and
        left alone."""
        with self._lock:
            spares, self.spares = self.spares, []
        for spare in spares:
            if spare.adopted() is not None:
                continue
            tree: list[psutil.Process] = []
            with contextlib.suppress(psutil.NoSuchProcess):
                tree = psutil.Process(spare.proc.pid).children(recursive=True)
            with contextlib.suppress(ProcessLookupError):
                spare.proc.send_signal(signal.SIGKILL)
            spare.proc.wait(timeout=timeout_s)
            for child in tree:
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
            psutil.wait_procs(tree, timeout=timeout_s)
            with contextlib.suppress(FileNotFoundError):
                spare.socket.unlink()


def write_status(folder: Path, rows: list[dict[str, Any]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    body = {"keeper": os.getpid(), "at": time.time(), "spares": rows}
    temporary = folder / f".{STATUS_FILE}.{os.getpid()}"
    temporary.write_text(json.dumps(body))
    temporary.rename(folder / STATUS_FILE)


def read_status(folder: Path) -> list[dict[str, Any]] | None:
    """The spares a live keeper keeps in `folder` (its last round's), or None: no keeper
    runs there."""
    try:
        body = json.loads((folder / STATUS_FILE).read_text())
        keeper = int(body["keeper"])
        rows: list[dict[str, Any]] = list(body["spares"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return rows if psutil.pid_exists(keeper) else None
