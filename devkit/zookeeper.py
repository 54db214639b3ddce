"""A ZooKeeper ensemble of its own for a test: the stack's own renderers (zoo.cfg, myid,
the java command a `TWINSTREAM_ZK_NODES=3 make up` runs), each server a process this kit
starts and stops by pid, so that a test can kill the leader without touching the shared
stack's ZooKeeper.

    with Ensemble(settings, tmp_path / "zk") as zk:
        leader = zk.leader()
        zk.kill9(leader)
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from devkit.harness import wait_for
from devkit.services import LocalServices
from twinstream.platform.settings import Settings
from twinstream.stack import health, render
from twinstream.stack.core import write_if_changed
from twinstream.stack.layout import Layout


class Ensemble(LocalServices):
    """`nodes` ZooKeeper servers on bind_host, node n's client, peer and election ports
    `ports` + n - 1 (fixed, as the test stack's are), data and logs in `folder`."""

    def __init__(
        self,
        settings: Settings,
        folder: Path,
        nodes: int = 3,
        ports: tuple[int, int, int] = (23181, 23281, 23381),
    ) -> None:
        super().__init__()
        client, peer, election = ports
        self.settings = settings.model_copy(
            update={
                "state_dir": folder,
                "zk_nodes": nodes,
                "zk_port": client,
                "zk_peer_port": peer,
                "zk_election_port": election,
                "zk_connect": "",
                # Its clients authenticate as the stack's do (its state folder is this one).
                "zk_password": settings.secret("zk_password"),
            }
        )
        self.layout = Layout.of(self.settings)
        self.servers: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def connect(self) -> str:
        """The connect string of every server (no chroot)."""
        return self.settings.zk_hosts

    def start(self) -> None:
        self.layout.zookeeper_dir.mkdir(parents=True, exist_ok=True)
        (self.layout.zookeeper_dir / "logback.xml").write_text(render.zookeeper_logback())
        write_if_changed(
            render.zookeeper_jaas_path(self.layout),
            render.zookeeper_jaas(self.settings),
            private=True,
        )
        for node in range(1, self.settings.zk_nodes + 1):
            folder = render.zookeeper_dir(self.settings, self.layout, node)
            (folder / "data").mkdir(parents=True, exist_ok=True)
            (folder / "zoo.cfg").write_text(render.zoo_cfg(self.settings, self.layout, node))
            (folder / "data" / "myid").write_text(f"{node}\n")
            self.start_server(node)
        wait_for(self.leader, 60, "the ensemble to elect a leader", every_s=0.2)

    def start_server(self, node: int) -> None:
        programs = render.programs(self.settings, self.layout, pipelines={})
        (program,) = [p for p in programs if p.name == f"zookeeper-{node}"]
        log = self.layout.zookeeper_dir / f"node-{node}.log"
        self.servers[node] = self.spawn(program.command, log)

    def mode(self, node: int) -> str | None:
        """leader, follower, or None (down, or not serving: no quorum)."""
        ok, detail = health.zookeeper(self.settings, node)
        return detail.rsplit(" ", 1)[-1] if ok else None

    def leader(self) -> int | None:
        for node in self.servers:
            if self.mode(node) == "leader":
                return node
        return None

    def kill9(self, node: int) -> None:
        proc = self.servers[node]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
