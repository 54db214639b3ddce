"""Where the local stack keeps things, all below ``settings.state_dir``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from twinstream.platform.settings import Connections

# AF_UNIX socket paths are limited to 108 bytes on Linux, terminator included.
MAX_SOCKET_PATH = 107


@dataclass(frozen=True)
class Layout:
    root: Path

    @classmethod
    def of(cls, settings: Connections) -> Layout:
        return cls(settings.state_dir.resolve())

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def supervisor_dir(self) -> Path:
        return self.root / "supervisor"

    @property
    def supervisor_conf(self) -> Path:
        return self.supervisor_dir / "supervisord.conf"

    @property
    def supervisor_pidfile(self) -> Path:
        return self.supervisor_dir / "supervisord.pid"

    @property
    def supervisor_socket(self) -> Path:
        return self.supervisor_dir / "supervisor.sock"

    @property
    def zookeeper_dir(self) -> Path:
        return self.root / "zookeeper"

    @property
    def kafka_dir(self) -> Path:
        return self.root / "kafka"

    @property
    def kafka_cluster_id(self) -> Path:
        return self.kafka_dir / "cluster-id"

    def kafka_node_dir(self, node_id: int) -> Path:
        return self.kafka_dir / f"node-{node_id}"

    @property
    def airflow_home(self) -> Path:
        return self.root / "airflow"

    @property
    def airflow_connections(self) -> Path:
        """The engines' Airflow connections, which `up` rewrites (render.airflow_connections)."""
        return self.airflow_home / "connections.json"

    @property
    def airflow_password_file(self) -> Path:
        return self.airflow_home / "simple_auth_manager_passwords.json.generated"

    def log_file(self, program: str) -> Path:
        return self.logs / f"{program}.log"

    def check(self) -> None:
        socket = str(self.supervisor_socket)
        if len(socket.encode()) > MAX_SOCKET_PATH:
            raise ValueError(
                f"TWINSTREAM_STATE_DIR is too deep: the supervisor socket {socket} exceeds "
                f"the {MAX_SOCKET_PATH}-byte limit of Unix sockets; choose a shorter path"
            )
