"""One typed settings object, read from ``TWINSTREAM_*`` environment variables.

Every process of the platform (the local stack, the engines, Airflow tasks, tests) builds its
view of the world from :func:`load_settings`, so a port or a topic name is defined once.
Lists are given comma-separated: ``TWINSTREAM_KAFKA_PORTS=9092,9093,9094``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parents[2]
DAY_MS = 24 * 60 * 60 * 1000

Port = Annotated[int, Field(ge=1, le=65535)]
PortList = Annotated[list[Port], NoDecode]


class SettingsError(ValueError):
    """The environment describes an impossible platform; the message says which variable."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TWINSTREAM_", frozen=True, extra="ignore")

    # Where the local stack keeps data, logs and generated secrets. Tests point it elsewhere
    # so that they never touch a developer's running stack.
    state_dir: Path = REPO_ROOT / ".twinstream"
    # Jars fetched by Maven. Kept apart from state_dir so that a test stack reuses them.
    jars_dir: Path = REPO_ROOT / ".twinstream" / "jars"
    dags_dir: Path = REPO_ROOT / "dags"
    plugins_dir: Path = REPO_ROOT / "plugins"

    bind_host: str = "127.0.0.1"
    zk_port: Port = 2181
    # ZooKeeper clamps session timeouts to [2, 20] x tickTime; 500 ms lets a dead engine's
    # session expire within about a second.
    zk_tick_ms: int = Field(default=500, ge=100, le=2000)
    kafka_ports: PortList = [9092, 9093, 9094]
    kafka_controller_ports: PortList = [9192, 9193, 9194]
    airflow_port: Port = 8080
    # Where clients find Kafka and ZooKeeper when they are not the local stack's own ports
    # on bind_host (compose: kafka-1:19092,..., zookeeper:2181). Empty: derived from ports.
    kafka_bootstrap: str = ""
    zk_connect: str = Field(default="", pattern=r"^$|^[A-Za-z0-9_.\-]+:\d{1,5}$")

    pipeline: str = Field(default="hostmetrics", pattern=r"^[a-z][a-z0-9_-]{0,62}$")
    inbound_topic: str = "hostmetrics.in"
    outbound_topic: str = "hostmetrics.out"
    dlq_topic: str = "hostmetrics.dlq"
    inbound_retention_ms: int = Field(default=7 * DAY_MS, ge=60_000)
    outbound_retention_ms: int = Field(default=7 * DAY_MS, ge=60_000)
    dlq_retention_ms: int = Field(default=14 * DAY_MS, ge=60_000)
    replication_factor: int = Field(default=3, ge=1)
    min_insync_replicas: int = Field(default=2, ge=1)

    zk_heap: str = Field(default="256m", pattern=r"^\d+[kmg]$")
    kafka_heap: str = Field(default="512m", pattern=r"^\d+[kmg]$")
    # How long `up` waits for every service to become healthy before it gives up.
    startup_timeout_s: float = Field(default=420.0, gt=0)

    @field_validator("kafka_ports", "kafka_controller_ports", mode="before")
    @classmethod
    def _split_ports(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _check_consistency(self) -> Settings:
        brokers = len(self.kafka_ports)
        if brokers == 0:
            raise ValueError("kafka_ports must name at least one broker port")
        if len(self.kafka_controller_ports) != brokers:
            raise ValueError(
                f"kafka_controller_ports has {len(self.kafka_controller_ports)} entries but "
                f"kafka_ports has {brokers}: every node runs one broker and one controller"
            )
        ports = [self.zk_port, self.airflow_port, *self.kafka_ports, *self.kafka_controller_ports]
        clashes = sorted({p for p in ports if ports.count(p) > 1})
        if clashes:
            raise ValueError(f"ports are used twice: {clashes}")
        if self.replication_factor > brokers:
            raise ValueError(
                f"replication_factor={self.replication_factor} needs at least that many "
                f"brokers, kafka_ports has {brokers}"
            )
        if self.min_insync_replicas > self.replication_factor:
            raise ValueError(
                f"min_insync_replicas={self.min_insync_replicas} exceeds "
                f"replication_factor={self.replication_factor}: no write could ever succeed"
            )
        topics = [self.inbound_topic, self.outbound_topic, self.dlq_topic]
        if len(set(topics)) != len(topics):
            raise ValueError(f"inbound, outbound and dead-letter topics must differ: {topics}")
        return self

    @property
    def bootstrap_servers(self) -> str:
        if self.kafka_bootstrap:
            return self.kafka_bootstrap
        return ",".join(f"{self.bind_host}:{port}" for port in self.kafka_ports)

    @property
    def zk_hosts(self) -> str:
        return self.zk_connect or f"{self.bind_host}:{self.zk_port}"

    @property
    def zk_address(self) -> tuple[str, int]:
        host, port = self.zk_hosts.rsplit(":", 1)
        return host, int(port)

    @property
    def airflow_url(self) -> str:
        return f"http://{self.bind_host}:{self.airflow_port}"

    @property
    def single_broker_dev(self) -> bool:
        """A one-broker development setup, where RF 3 checks become warnings."""
        return len(self.kafka_ports) == 1


def load_settings(**overrides: Any) -> Settings:
    """Read settings from the environment; a bad value raises SettingsError naming it."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"TWINSTREAM_{'_'.join(str(p) for p in err['loc']).upper() or '*'}: {err['msg']}"
            for err in exc.errors()
        )
        raise SettingsError(f"invalid Twinstream configuration: {problems}") from exc
