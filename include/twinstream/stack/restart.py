"""Restarting one engine of the local stack (`twinstream restart ENGINE`, `make restart
ENGINE=e`): its supervisord program is stopped and started again, as `supervisorctl -c
.twinstream/supervisor/supervisord.conf restart engine-e` would, and awaited until its
health probe passes, as `make up` awaits it (the same lines, the same deadline,
TWINSTREAM_STARTUP_TIMEOUT_S).

Restarting the active is a failover: a standby takes over at once, and the engine comes
back as a standby. Under Docker Compose an engine is a service: `docker compose restart
engine-e` restarts it, and nothing here applies.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from twinstream.platform import registry
from twinstream.platform.settings import Connections, Settings, SettingsError
from twinstream.stack import health
from twinstream.stack.core import StackError, wait_until_healthy
from twinstream.stack.layout import Layout
from twinstream.stack.supervisor import Supervisor

Echo = Callable[[str], None]
# wait_until_healthy's shape: (settings, layout, supervisor, echo, program names).
Wait = Callable[[Settings, Layout, Any, Echo, Iterable[str]], None]


def engine_program(engine_id: str) -> str:
    """The supervisord program that runs an engine (twinstream.stack.render)."""
    return f"engine-{engine_id}"


def owner(settings: Settings, engine_id: str, pipeline: str | None = None) -> Settings:
    """The settings of the stack's pipeline that runs `engine_id` (of `pipeline`, when
    given); SettingsError naming the engines there are when it is none of them. `settings`
    are the stack's, not one pipeline's: a pipeline's own settings give engine ids to a
    pipeline without an `engines` entry (registry.stack)."""
    pipelines = registry.stack(settings)
    if pipeline is not None and pipeline not in pipelines:
        raise SettingsError(
            f"no pipeline {pipeline!r} on this stack ({', '.join(pipelines)}): give one of "
            "them, or leave --pipeline out"
        )
    for name, found in pipelines.items():
        if engine_id in found.engine_ids:
            if pipeline is not None and name != pipeline:
                raise SettingsError(
                    f"engine {engine_id} runs pipeline {name}, not {pipeline} (whose engines "
                    f"are {', '.join(pipelines[pipeline].engine_ids)}): give one of those, "
                    "or leave --pipeline out"
                )
            return found
    known = ", ".join(f"{e} ({n})" for n, s in pipelines.items() for e in s.engine_ids)
    raise SettingsError(
        f"no engine {engine_id!r} on this stack ({settings.pipelines_file}): its engines "
        f"are {known}; `twinstream status` shows them"
    )


def restart_engine(
    settings: Settings,
    engine_id: str,
    *,
    pipeline: str | None = None,
    echo: Echo = print,
    supervisor: Any = None,
    wait: Wait = wait_until_healthy,
    role: Callable[[Settings, str], str] = lambda s, e: health.engine(s, e)[2],
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Restart engine `engine_id` of the stack `settings` describe and wait until it
    answers its health probe again. StackError when the
    stack is not running, the engine is no program of it, or it does not come back
    healthy in time (with its log's last lines); SettingsError for an unknown engine."""
    found = owner(settings, engine_id, pipeline)
    layout = Layout.of(settings)
    supervisor = supervisor if supervisor is not None else Supervisor(layout)
    if not supervisor.is_running():
        raise StackError(
            f"the local stack is not running (no supervisord at {layout.supervisor_socket}): "
            "start it with `make up`, which starts every engine; under Docker Compose, "
            f"`docker compose restart {engine_program(engine_id)}`"
        )
    program = engine_program(engine_id)
    try:
        before = supervisor.process(program)
    except KeyError:
        raise StackError(
            f"engine {engine_id} is in {settings.pipelines_file} but the running stack has no "
            f"program {program} (added since `make up`?): run `make up`, which starts it"
        ) from None
    was = role(found, engine_id) if before.state == "RUNNING" else "none"
    echo(
        f"restarting engine {engine_id} of pipeline {found.pipeline} ({was}, {program} "
        f"{before.state}{f', pid {before.pid}' if before.pid else ''})"
    )
    if was == "active":
        echo("  it is the active: a standby takes over now, and it comes back as a standby")
    start = clock()
    echo(f"  stopping {program} (its query and Spark first: up to its stopwaitsecs)")
    supervisor.stop(program)
    echo(f"  stopped after {clock() - start:.1f}s; starting {program}")
    supervisor.start(program, wait=False)
    wait(settings, layout, supervisor, echo, [program])
    echo(
        f"engine {engine_id} restarted in {clock() - start:.1f}s (pid "
        f"{supervisor.process(program).pid}); `twinstream status` shows every engine"
    )


class EngineProcesses:
    """The local stack's engines as processes, for a deploy (twinstream.ops.deploy):
    `stop` returns once supervisord has stopped the program; `start` once the engine answers
    its admin API (`answers`: None once it does, else why not; its pipeline may wait for a
    restore: the deploy looks at it then), within `timeout_s`. Only the stack's folder is
    read from `settings` (the supervisord socket under it): the CLI and a DAG task on the
    stack's machine alike."""

    def __init__(
        self,
        settings: Connections,
        answers: Callable[[str], str | None],
        timeout_s: float,
        echo: Echo = print,
        supervisor: Any = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._layout = Layout.of(settings)
        self._supervisor = supervisor if supervisor is not None else Supervisor(self._layout)
        self._answers, self._timeout_s = answers, timeout_s
        self._echo = echo
        self._clock, self._sleep = clock, sleep
        if not self._supervisor.is_running():
            raise StackError(
                f"the local stack is not running (no supervisord at "
                f"{self._layout.supervisor_socket}): start it with `make up`; under Docker "
                "Compose a deploy is not built yet (README, Change a running pipeline)"
            )

    def stop(self, engine_id: str) -> None:
        program = engine_program(engine_id)
        self._echo(f"  stopping {program} (its query and Spark first: up to its stopwaitsecs)")
        self._supervisor.stop(program)

    def start(self, engine_id: str) -> None:
        program = engine_program(engine_id)
        self._echo(f"  starting {program}")
        self._supervisor.start(program, wait=False)
        started = self._clock()
        deadline = started + self._timeout_s
        said = started
        while (why := self._answers(engine_id)) is not None:
            if self._supervisor.process(program).state == "FATAL":
                raise StackError(
                    f"{program} keeps failing to start (supervisord gave up): read "
                    f"{self._layout.log_file(program)}"
                )
            if self._clock() > deadline:
                raise StackError(
                    f"{program} does not answer after {self._timeout_s:.0f} s "
                    f"({why}): read {self._layout.log_file(program)}"
                )
            if self._clock() - said >= 10:
                said = self._clock()
                self._echo(f"  {program}: {said - started:.0f} s, not answering yet ({why})")
            self._sleep(0.5)
        self._echo(f"  {program} answers after {self._clock() - started:.1f} s")
