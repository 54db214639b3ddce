"""Failures inflicted on a running stack's own engines, for the chaos suite and the
failover benchmark: the engines run under the stack's supervisord (autorestart), as in
production under a process supervisor, and are reached through their admin APIs.

Every process touched is addressed by the pid supervisord reports; nothing by name.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

import psutil

from devkit.harness import Load, inbound_ends, wait_for, wait_gone
from pipelines.hostmetrics.generate import synthetic
from twinstream.core.rows import positions_text, record_id
from twinstream.engine.api import PipelineInfo, ServerInfo
from twinstream.engine.client import EngineClient, EngineError
from twinstream.ops.audit import Findings, window
from twinstream.ops.drill import KafkaEpochTail, Takeover, measure_takeover
from twinstream.platform import registry
from twinstream.platform.settings import Settings
from twinstream.stack.layout import Layout
from twinstream.stack.supervisor import Supervisor, at_once

log = logging.getLogger(__name__)

KINDS = ("kill", "sigstop", "expire")
# How long a SIGSTOPped active stays frozen after its successor has published.
ZOMBIE_AFTER_S = 5.0


class SupervisedEngines:
    """The stack's engines: their supervisord programs and admin APIs."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.supervisor = Supervisor(Layout.of(settings))
        token = settings.secret("admin_token")
        self.clients = {
            e: EngineClient.from_settings(settings, e, token, timeout_s=5.0)
            for e in settings.engine_ids
        }

    def close(self) -> None:
        for client in self.clients.values():
            client.close()

    def pid(self, engine_id: str) -> int:
        """The engine's process as it says itself (GET /server); 0 while it does not answer.
        Not supervisord's program: once a warm spare became the engine, that program's
        process only stands for it (twinstream.engine.spare.follow)."""
        try:
            return self.clients[engine_id].server().pid
        except EngineError:
            return 0

    def _status(self, engine_id: str) -> tuple[ServerInfo, PipelineInfo] | None:
        try:
            client = self.clients[engine_id]
            return client.server(), client.pipeline()
        except EngineError:
            return None

    def is_standby_in_sync(self, engine_id: str) -> bool:
        status = self._status(engine_id)
        if status is None:
            return False
        server, info = status
        return bool(server.role == "standby" and info.state == "running" and info.in_sync)

    def current_pair(self) -> tuple[str, str] | None:
        """(active, standby) if one engine is active with a live session and another is an
        in-sync standby now, else None."""
        actives, standbys = [], []
        for engine_id in self.clients:
            status = self._status(engine_id)
            if status is None:
                continue
            server, _info = status
            if server.role == "active" and server.zk_state == "CONNECTED":
                actives.append(engine_id)
            elif self.is_standby_in_sync(engine_id):
                standbys.append(engine_id)
        if len(actives) == 1 and standbys:
            return actives[0], standbys[0]
        return None

    def wait_pair(self, timeout_s: float = 180.0) -> tuple[str, str]:
        """(active, standby) once one engine is active with a live session and another is
        an in-sync standby."""
        result: tuple[str, str] = wait_for(
            self.current_pair, timeout_s, "an active and an in-sync standby"
        )
        return result

    def wait_published(self, ends: int | Mapping[int, int], timeout_s: float = 600.0) -> None:
        """Until an engine reports every msg_id below `ends` published (partition ->
        offset; an int: partition 0's); one that is down or does not answer counts as not
        yet."""
        wanted = {0: ends} if isinstance(ends, int) else {p: e for p, e in ends.items() if e}

        def published() -> bool:
            for client in self.clients.values():
                with contextlib.suppress(EngineError):
                    now = client.pipeline().published_positions()
                    if all(now.get(p, -1) >= end - 1 for p, end in wanted.items()):
                        return True
            return False

        what = f"msg_id {positions_text({p: e - 1 for p, e in wanted.items()})} published"
        wait_for(published, timeout_s, what, every_s=1.0)

    def wait_restarted(self, engine_id: str, old_pid: int, timeout_s: float = 120.0) -> int:
        """The pid of the engine's next process (supervisord's restart, or the warm spare
        that became it), once it answers."""

        def restarted() -> int:
            pid = self.pid(engine_id)
            return pid if pid and pid != old_pid else 0

        pid: int = wait_for(restarted, timeout_s, f"supervisord to restart engine {engine_id}")
        return pid


def only_this_pipeline(settings: Settings) -> SupervisedEngines:
    """The stack's engines of `settings`' pipeline, the other pipelines' (payments) stopped:
    the two cores left to these."""
    supervisor = Supervisor(Layout.of(settings))
    others = [e for e in registry.engines(settings) if e not in settings.engine_ids]
    at_once(supervisor.stop, [f"engine-{e}" for e in others])
    return SupervisedEngines(settings)


def process_tree(pid: int) -> set[int]:
    """The engine and its children (Spark's JVM), noted before a kill."""
    with contextlib.suppress(psutil.NoSuchProcess):
        return {pid} | {p.pid for p in psutil.Process(pid).children(recursive=True)}
    return {pid}


def granted_session_s(settings: Settings) -> float:
    """ZooKeeper grants no session shorter than 2 x tickTime, whatever the client asks."""
    return max(settings.zk_session_timeout_s, 2 * settings.zk_tick_ms / 1000)


def audit_range(settings: Settings, first: int, end: int, partition: int = 0) -> Findings:
    """Every msg_id first..end-1 of a partition in exactly one published transaction, with
    its outputs (that partition of the progress, outbound and dead-letter topics)."""
    from twinstream.ops.operate import committed_since

    records = committed_since(settings, first, partition=partition)
    return window(((kind, r.msg_id, r.value) for kind, r in records), first, end)


def audit_ranges(
    settings: Settings, firsts: Mapping[int, int], ends: Mapping[int, int]
) -> dict[int, Findings]:
    """audit_range in every partition, from `firsts` (a partition it does not name: from
    0) to `ends`."""
    return {
        p: audit_range(settings, firsts.get(p, 0), end, p)
        for p, end in sorted(ends.items())
        if end > firsts.get(p, 0)
    }


def audit_load(
    engines: SupervisedEngines, firsts: Mapping[int, int], sent: int, timeout_s: float = 600.0
) -> dict[int, Findings]:
    """After a load of `sent` records that began when the inbound partitions ended at
    `firsts` (the only writer meanwhile): every one of them arrived, is published, and is
    in exactly one transaction with its outputs; the findings per partition."""
    ends = inbound_ends(engines.settings)
    grew = sum(ends.values()) - sum(firsts.values())
    if grew != sent:
        raise AssertionError(f"inbound grew by {grew}, the load sent {sent}")
    engines.wait_published(ends, timeout_s)
    return audit_ranges(engines.settings, firsts, ends)


def audit_summary(audited: Mapping[int, Findings]) -> str:
    return "; ".join(f"partition {p}: {f.summary()}" for p, f in audited.items()) or "nothing"


def flagged(audited: Mapping[int, Findings], what: str) -> list[tuple[int, int]]:
    """The ranges of one kind of finding (`missing`, `duplicated`) over every partition, as
    record ids (partition 0: the offsets themselves)."""
    return [
        (record_id(p, first), record_id(p, last))
        for p, f in audited.items()
        for first, last in getattr(f, what)
    ]


@dataclass
class Round:
    kind: str
    takeover: Takeover
    rejoin_s: float  # from the failure to the pair being whole again, the victim in it
    # The victim came back as the active: the successor lost its ZooKeeper session after
    # the takeover (on two cores a restarting JVM can starve it past a 1 s session).
    swapped: bool = False


def failover_round(
    engines: SupervisedEngines,
    kind: str,
    takeover_timeout_s: float = 60.0,
    rejoin_timeout_s: float = 240.0,
    pair: tuple[str, str] | None = None,
) -> Round:
    """Inflict one failure on the active and measure the takeover and the rejoin.

    kill: SIGKILL; supervisord restarts the engine, which resumes from its checkpoint as a
    standby. sigstop: the active freezes (a zombie) until ZOMBIE_AFTER_S after its
    successor has published, then resumes and must find itself fenced and step down.
    expire: the active freezes just long enough for its ZooKeeper session to expire, then
    resumes mid-takeover.

    `pair` (active, standby) strikes at once, whether the standby is in sync or not (young
    engines still catching up); by default the round first waits for an in-sync standby."""
    if kind not in KINDS:
        raise ValueError(f"unknown failure {kind!r}; one of {KINDS}")
    active, standby = pair if pair is not None else engines.wait_pair()
    client = engines.clients[active]
    server = client.server()
    result = Takeover.of(active, server.epoch, client.pipeline())
    pid = server.pid
    tree = process_tree(pid)
    thaw: threading.Timer | None = None
    with KafkaEpochTail(engines.settings) as tail:
        started = time.monotonic()
        if kind == "kill":
            os.kill(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGSTOP)
        if kind == "expire":
            # The freeze itself is the failure: 2.5 granted session timeouts, so the session
            # has expired and the successor is taking over when it resumes. A timer ends it
            # so that the takeover is watched during the freeze, not after it.
            thaw = threading.Timer(
                2.5 * granted_session_s(engines.settings), os.kill, (pid, signal.SIGCONT)
            )
            thaw.start()
        try:
            measure_takeover(
                result, {standby: engines.clients[standby]}, tail, started, takeover_timeout_s
            )
            if kind == "sigstop" and result.first_output_s is not None:
                # A zombie that wakes while its successor is publishing: the freeze is the
                # failure under test, so it lasts a fixed time, not until some condition.
                time.sleep(ZOMBIE_AFTER_S)
        finally:
            if thaw is not None:
                thaw.join()
            if kind != "kill":
                os.kill(pid, signal.SIGCONT)
    if result.role_s is None:
        raise AssertionError(f"{kind}: no takeover within {takeover_timeout_s} s: {result}")
    if kind == "kill":
        wait_gone(tree)
        engines.wait_restarted(active, pid)

    def rejoined() -> tuple[str, str] | None:
        # Usually the victim returns as the in-sync standby. If the successor's session is
        # lost meanwhile the victim may win again: the pair is whole all the same, and
        # waiting for the victim to be the standby would wait for a failure that is not
        # coming (a 20-round benchmark died on exactly that after 13 rounds).
        pair = engines.current_pair()
        return pair if pair is not None and active in pair else None

    whole: tuple[str, str] = wait_for(
        rejoined, rejoin_timeout_s, f"engine {active} back, with an active and an in-sync standby"
    )
    rejoin_s = time.monotonic() - started
    swapped = whole[0] == active
    if swapped:
        log.warning(
            "%s of %s: roles swapped after the takeover: %s is active again, %s standby",
            kind,
            active,
            active,
            whole[1],
        )
    log.info("%s of %s: %s; pair whole after %.1f s", kind, active, result.describe(), rejoin_s)
    return Round(kind, result, rejoin_s, swapped)


@dataclass
class SteadyLoad:
    """Synthetic records over `hosts` distinct hosts (the key) to the inbound topic at
    `rate`/s until stopped; `stop()` returns how many were sent (each acknowledged, or it
    raises)."""

    settings: Settings
    rate: float
    hosts: int = 10
    _load: Load | None = None

    @property
    def sent(self) -> int:
        return 0 if self._load is None else self._load.sent

    def start(self) -> SteadyLoad:
        records = synthetic(
            10**10, hosts=self.hosts, max_record_bytes=self.settings.max_record_bytes
        )
        # Keyed by host with several partitions, as the hostmetrics contract's partition_by
        # asks: a host's events stay in one partition, in order.
        key = "host" if self.settings.partitions > 1 else None
        self._load = Load(self.settings, records, self.rate, "steady-load", key_field=key)
        return self

    def stop(self, timeout_s: float = 120.0) -> int:
        assert self._load is not None
        self._load.stop()
        self._load.join(timeout_s)
        if self._load.is_alive():
            raise AssertionError("the load did not stop")
        if self._load.errors:
            raise AssertionError(f"the load failed: {self._load.errors}")
        return self.sent
