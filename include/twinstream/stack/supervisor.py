"""Talks to the stack's supervisord over its Unix socket (XML-RPC), and starts it."""

from __future__ import annotations

import subprocess
import sys
import xmlrpc.client
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from supervisor.xmlrpc import SupervisorTransport

from twinstream.stack.layout import Layout


@dataclass(frozen=True)
class ProcessInfo:
    name: str
    group: str
    state: str  # RUNNING, STARTING, BACKOFF, STOPPED, EXITED, FATAL, ...
    pid: int  # 0 when not running
    description: str
    start: float = 0.0  # epoch seconds of the last start

    @property
    def full_name(self) -> str:
        """The name supervisord's RPC calls take: group:name inside a group."""
        return self.name if self.group == self.name else f"{self.group}:{self.name}"

    @classmethod
    def of(cls, info: dict[str, Any]) -> ProcessInfo:
        return cls(
            info["name"],
            info["group"],
            info["statename"],
            int(info["pid"]),
            info["description"],
            float(info["start"]),
        )


def at_once(action: Callable[[str], object], names: Iterable[str]) -> None:
    """action(name) for every name at the same time, each in a thread of its own; back
    once all have ended, raising the first error. For supervisord's start and stop, which
    each wait for their program (an engine's Spark shutdown, its `startsecs`): one after
    the other added those seconds up."""
    listed = list(names)
    if not listed:
        return
    with ThreadPoolExecutor(max_workers=len(listed)) as pool:
        for future in [pool.submit(action, name) for name in listed]:
            future.result()


class Supervisor:
    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    def _proxy(self) -> Any:
        transport = SupervisorTransport(None, None, f"unix://{self.layout.supervisor_socket}")
        # The host part is ignored: the transport always uses the socket.
        return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)

    def is_running(self) -> bool:
        if not self.layout.supervisor_socket.exists():
            return False
        try:
            return cast(str, self._proxy().supervisor.getState()["statename"]) == "RUNNING"
        except (OSError, xmlrpc.client.Fault):
            return False

    def pid(self) -> int:
        return cast(int, self._proxy().supervisor.getPID())

    def start_daemon(self) -> None:
        """Start supervisord; it forks into the background once its socket is bound."""
        self.layout.supervisor_socket.unlink(missing_ok=True)
        supervisord = Path(sys.executable).parent / "supervisord"
        subprocess.run(
            [str(supervisord), "-c", str(self.layout.supervisor_conf)],
            check=True,
            cwd=self.layout.root,
        )

    def processes(self) -> list[ProcessInfo]:
        return [ProcessInfo.of(p) for p in self._proxy().supervisor.getAllProcessInfo()]

    def process(self, name: str) -> ProcessInfo:
        """A program by its short name (kafka-2) or its full name (kafka:kafka-2)."""
        for info in self.processes():
            if name in (info.name, info.full_name):
                return info
        raise KeyError(f"no program {name!r} in {self.layout.supervisor_conf}")

    def start(self, name: str, wait: bool = True) -> None:
        """Start a program; `wait`: return once it has stayed up its `startsecs` (not
        waiting, a caller starts several at once and watches them itself)."""
        try:
            self._proxy().supervisor.startProcess(self.process(name).full_name, wait)
        except xmlrpc.client.Fault as fault:
            if "ALREADY_STARTED" not in fault.faultString:
                raise

    def stop(self, name: str) -> None:
        try:
            self._proxy().supervisor.stopProcess(self.process(name).full_name, True)
        except xmlrpc.client.Fault as fault:
            if "NOT_RUNNING" not in fault.faultString:
                raise

    def remove(self, name: str) -> None:
        """Stop a program (its group: an engine is a group of one) and drop it from the
        running supervisord, as `supervisorctl remove` does. The next `up` writes a
        supervisord.conf without it, and its reload then finds nothing to change."""
        info = self.process(name)
        proxy = self._proxy()
        try:
            proxy.supervisor.stopProcessGroup(info.group, True)
        except xmlrpc.client.Fault as fault:
            if "NOT_RUNNING" not in fault.faultString:
                raise
        proxy.supervisor.removeProcessGroup(info.group)

    def reload(self) -> tuple[list[str], list[str], list[str]]:
        """Re-read the config file; apply it like `supervisorctl update`. Returns the
        (added, changed, removed) program names."""
        proxy = self._proxy()
        [[added, changed, removed]] = proxy.supervisor.reloadConfig()
        for name in removed + changed:
            proxy.supervisor.stopProcessGroup(name, True)
            proxy.supervisor.removeProcessGroup(name)
        for name in changed + added:
            proxy.supervisor.addProcessGroup(name)
        return added, changed, removed

    def shutdown(self) -> None:
        self._proxy().supervisor.shutdown()
