"""Services a test starts for itself from the stack's own renderers (a ZooKeeper ensemble,
a Spark standalone cluster): processes started and stopped by pid, last started first
stopped, with a log file each."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self


class LocalServices:
    """A context manager: `start()` brings the services up (a subclass's), exit stops every
    process this object spawned, even when the start failed half-way."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        raise NotImplementedError

    def spawn(
        self, command: Sequence[str], log: Path, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            proc = subprocess.Popen(
                list(command),
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
            )
        self.procs.append(proc)
        return proc

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(30)
