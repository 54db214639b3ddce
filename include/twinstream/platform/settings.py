"""Typed settings, read from ``TWINSTREAM_*`` environment variables, in groups per process.

Each process reads and validates only the groups it uses, at its edge:

==================  ==========================================================================
``EngineSettings``  an engine (``spark_jobs/engine.py``): where things are, its pipeline, the
                    engine's tuning and in-sync bounds
``TaskSettings``    an Airflow task or DAG file: where things are, the pipelines, the
                    housekeeping schedules and bounds
``AdapterSettings`` a publisher or subscriber adapter: where things are, its pipeline
``Settings``        the local stack and the operator's CLI, which start and configure every
                    other process, so read every group (``StackLayout`` only here)
==================  ==========================================================================

The groups: ``Connections`` (where Kafka, ZooKeeper, the engines' admin APIs, shared storage
and the pipelines file are, and who this process is), ``PipelineSettings`` (the per-pipeline
context: its name, topics and their configuration; a process's own from
``TWINSTREAM_PIPELINE``, any other from `twinstream.platform.registry`), ``EngineTuning``,
``InSyncBounds``, ``Housekeeping`` and ``StackLayout``. A function takes the narrowest group
it reads, or the few values it reads: a port or a topic name is still defined once.
Lists are given comma-separated: ``TWINSTREAM_KAFKA_PORTS=9092,9093,9094``.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from twinstream.platform.connections import PipelineTopics, ZooKeeperConnection
from twinstream.platform.storage import Location, StorageError, location

REPO_ROOT = Path(__file__).resolve().parents[3]
DAY_MS = 24 * 60 * 60 * 1000
# A pipeline's topics when not set: <pipeline>.<suffix>.
TOPIC_SUFFIXES = {
    "inbound_topic": "in",
    "outbound_topic": "out",
    "dlq_topic": "dlq",
    "progress_topic": "progress",
}

Port = Annotated[int, Field(ge=1, le=65535)]
PortList = Annotated[list[Port], NoDecode]
NameList = Annotated[list[Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,30}$")]], NoDecode]
PIPELINE_NAME = r"^[a-z][a-z0-9_-]{0,62}$"
# host:port[,host:port...][/chroot]: one ZooKeeper server or an ensemble, and optionally the
# node under which every Twinstream node lives (kazoo's connect string).
_ZK_HOST = r"[A-Za-z0-9_.\-]+:\d{1,5}"
ZK_CONNECT = rf"^$|^{_ZK_HOST}(,{_ZK_HOST})*(/[A-Za-z0-9_.\-]+)*$"
PipelineList = Annotated[list[Annotated[str, Field(pattern=PIPELINE_NAME)]], NoDecode]
_ENV = SettingsConfigDict(env_prefix="TWINSTREAM_", frozen=True, extra="ignore")


class SettingsError(ValueError):
    """The environment describes an impossible platform; the message says which variable."""


def _split_commas(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class Connections(BaseSettings):
    """Where Kafka, ZooKeeper, the engines' admin APIs, the shared storage and the pipelines
    file are, and who this process is on them: what every process reads."""

    model_config = _ENV

    # Where the local stack keeps data, logs and generated secrets. Tests point it elsewhere
    # so that they never touch a developer's running stack.
    state_dir: Path = REPO_ROOT / ".twinstream"
    # Jars fetched by Maven. Kept apart from state_dir so that a test stack reuses them.
    jars_dir: Path = REPO_ROOT / ".twinstream" / "jars"
    bind_host: str = "127.0.0.1"
    zk_port: Port = 2181
    # The local stack's ZooKeeper: one server, or an ensemble of 3 or 5 (node n serves clients
    # on zk_port + n - 1, its peers on zk_peer_port + n - 1 and zk_election_port + n - 1).
    zk_nodes: int = Field(default=1, ge=1, le=5)
    kafka_ports: PortList = [9092, 9093, 9094]
    # Where clients find Kafka and ZooKeeper when they are not the local stack's own ports
    # on bind_host (compose: kafka-1:19092,..., zookeeper:2181). Empty: derived from ports.
    kafka_bootstrap: str = ""
    # Several hosts and a chroot are accepted: "zk1:2181,zk2:2181,zk3:2181/prod".
    zk_connect: str = Field(default="", pattern=ZK_CONNECT)
    # Kafka with SASL/SCRAM over TLS and ACLs (twinstream.platform.kafka_auth); false: PLAINTEXT
    # listeners without an authorizer, where anyone who reaches a broker may write anything.
    kafka_security: bool = True
    # The CA clients verify the brokers with, and the SCRAM passwords (user -> password,
    # JSON); empty: tls/ca.pem and kafka-credentials.json in state_dir, which `up` makes.
    kafka_tls_cafile: str = ""
    kafka_credentials_file: str = ""
    # Who this process's Kafka clients are: one of the pipeline's users (engine: its engines;
    # publisher: writes .in only; reader: reads the outputs only), or the stack's admin
    # (topics, configs, users and ACLs: `up`, the operator's tools, the tests' setup).
    kafka_role: Literal["admin", "engine", "publisher", "reader"] = "admin"
    # Which pipelines run, and where their code is (twinstream.platform.registry).
    pipelines_file: Path = REPO_ROOT / "pipelines.toml"
    # A pipeline's module[:attribute] outside the pipelines file (tests' own pipelines).
    pipeline_module: str = ""
    # The pipelines the stack runs (`make up`, the DAGs); empty: every pipeline in the
    # pipelines file. `TWINSTREAM_PIPELINE` is the one pipeline a process works on.
    stack_pipelines: PipelineList = []
    # The engines: ids and admin API ports, pairwise. `engine_admin_host` is where their admin
    # APIs are reached; "{id}" is replaced by the engine id (compose: "engine-{id}").
    engine_ids: NameList = ["a", "b"]
    engine_admin_ports: PortList = [8701, 8702]
    engine_admin_host: str = ""
    # Bearer token of the engines' admin API and the ZooKeeper SASL password. Empty: read
    # from admin-token / zk-password in state_dir, which the local stack generates.
    admin_token: str = Field(default="", repr=False)
    # TLS of the engines' admin APIs, PEM files; empty: plain HTTP, where the token crosses
    # the network readable. With a certificate and its (unencrypted) key an engine serves
    # https. Clients verify the engines' certificates against admin_tls_cafile (empty: the
    # system's trusted CAs); a client without the key pair sets the CA alone. Either way the
    # engine URLs the platform builds (engine_admin_url) say https.
    admin_tls_certfile: str = ""
    admin_tls_keyfile: str = ""
    admin_tls_cafile: str = ""
    # Letters, digits and '_': it becomes a JAAS option name (user_<name>) in ZooKeeper.
    zk_user: str = Field(default="twinstream", pattern=r"^[A-Za-z0-9_]+$")
    zk_password: str = Field(default="", repr=False)
    # The largest session timeout request ZooKeeper clamps to 2 x tickTime (1 s at 500 ms).
    zk_session_timeout_s: float = Field(default=0.2, gt=0)
    # Persist and restore. The snapshot root is shared storage (compose: a shared volume):
    # a folder or a URL Spark and Python both know (twinstream.platform.storage: hdfs://, s3a://,
    # gs://, abfs://, file://); snapshots live in <snapshot_root>/<pipeline>/. Empty:
    # <state_dir>/snapshots.
    snapshot_root: str = ""
    # Where the engines' checkpoints live, the same kinds of location: <root>/<pipeline>/
    # <engine>. Empty: <state_dir>/engines/<engine>/checkpoint. On a Spark cluster an
    # executor writes state there, so it must be storage every worker reaches.
    checkpoint_root: str = ""

    @field_validator(
        "kafka_ports", "engine_ids", "engine_admin_ports", "stack_pipelines", mode="before"
    )
    @classmethod
    def _split_lists(cls, value: Any) -> Any:
        return _split_commas(value)

    @field_validator("snapshot_root", "checkpoint_root", mode="before")
    @classmethod
    def _a_location(cls, value: Any) -> Any:
        text = str(value) if isinstance(value, Path) else value
        if isinstance(text, str) and text.strip():
            try:
                location(text)
            except StorageError as exc:
                raise ValueError(str(exc)) from None
        return text

    @field_validator("admin_tls_certfile", "admin_tls_keyfile", "admin_tls_cafile")
    @classmethod
    def _an_existing_file(cls, value: str) -> str:
        if value and not Path(value).is_file():
            raise ValueError(
                f"{value}: no such file; give the path of a PEM file this process can read"
            )
        return value

    @model_validator(mode="after")
    def _check_connections(self) -> Connections:
        if not self.kafka_ports:
            raise ValueError("kafka_ports must name at least one broker port")
        if len(self.engine_admin_ports) != len(self.engine_ids):
            raise ValueError(
                f"engine_admin_ports has {len(self.engine_admin_ports)} entries but engine_ids "
                f"has {len(self.engine_ids)}: every engine needs its admin port"
            )
        if self.zk_nodes % 2 == 0:
            raise ValueError(
                f"zk_nodes={self.zk_nodes}: a ZooKeeper ensemble has an odd number of servers "
                "(1, 3 or 5); an even one tolerates no more failures than one server fewer"
            )
        if len(set(self.engine_ids)) != len(self.engine_ids):
            raise ValueError(f"engine_ids repeat a name: {self.engine_ids}")
        self._check_admin_tls()
        return self

    def _check_admin_tls(self) -> None:
        """The key pair and the CA load, so that a wrong file fails here, named, rather than
        at the engine's start (uvicorn) or at a client's first request."""
        cert, key = self.admin_tls_certfile, self.admin_tls_keyfile
        if bool(cert) != bool(key):
            given, missing = ("CERTFILE", "KEYFILE") if cert else ("KEYFILE", "CERTFILE")
            raise ValueError(
                f"TWINSTREAM_ADMIN_TLS_{given} is set but TWINSTREAM_ADMIN_TLS_{missing} is "
                "not: an engine serves https with its certificate and that certificate's "
                "private key, so set both (or neither, for plain HTTP)"
            )
        if cert:
            try:
                ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
            except (ssl.SSLError, OSError) as exc:
                raise ValueError(
                    f"TWINSTREAM_ADMIN_TLS_CERTFILE={cert} and TWINSTREAM_ADMIN_TLS_KEYFILE="
                    f"{key} do not load ({exc}): give a PEM certificate and its own private "
                    "key, unencrypted"
                ) from None
        if self.admin_tls_cafile:
            try:
                ssl.create_default_context(cafile=self.admin_tls_cafile)
            except (ssl.SSLError, OSError) as exc:
                raise ValueError(
                    f"TWINSTREAM_ADMIN_TLS_CAFILE={self.admin_tls_cafile} does not load "
                    f"({exc}): give the PEM certificate of the CA that signed the engines' "
                    "certificates"
                ) from None

    @property
    def admin_tls(self) -> bool:
        """The engines serve their admin API over https (this process holds the key pair)."""
        return bool(self.admin_tls_certfile)

    @property
    def admin_scheme(self) -> str:
        """https when the engines serve TLS, or when this client has a CA to verify them."""
        return "https" if self.admin_tls or self.admin_tls_cafile else "http"

    @property
    def kafka_ca_path(self) -> Path:
        return Path(self.kafka_tls_cafile) if self.kafka_tls_cafile else self.tls_dir / "ca.pem"

    @property
    def tls_dir(self) -> Path:
        """The stack's TLS material (twinstream.stack.tls)."""
        return self.state_dir / "tls"

    @property
    def kafka_credentials_path(self) -> Path:
        if self.kafka_credentials_file:
            return Path(self.kafka_credentials_file)
        return self.state_dir / "kafka-credentials.json"

    @property
    def bootstrap_servers(self) -> str:
        if self.kafka_bootstrap:
            return self.kafka_bootstrap
        return ",".join(f"{self.bind_host}:{port}" for port in self.kafka_ports)

    @property
    def zk_client_ports(self) -> list[int]:
        """The local stack's ZooKeeper client ports, node 1 first."""
        return [self.zk_port + n for n in range(self.zk_nodes)]

    @property
    def zk_hosts(self) -> str:
        """kazoo's connect string: every server, and the chroot if there is one."""
        if self.zk_connect:
            return self.zk_connect
        return ",".join(f"{self.bind_host}:{port}" for port in self.zk_client_ports)

    @property
    def zk_servers(self) -> list[tuple[str, int]]:
        """(host, port) of every ZooKeeper server, as kazoo reads the connect string."""
        return self._zk_parts()[0]

    @property
    def zk_chroot(self) -> str:
        """The node every Twinstream node lives under ("" for ZooKeeper's root)."""
        return self._zk_parts()[1]

    def _zk_parts(self) -> tuple[list[tuple[str, int]], str]:
        from kazoo.hosts import collect_hosts

        servers, chroot = collect_hosts(self.zk_hosts)
        return [(host, int(port)) for host, port in servers], str(chroot or "")

    def zookeeper(self) -> ZooKeeperConnection:
        """Where ZooKeeper is and who this process is there; reads the password file (see
        `secret`) once, here."""
        return ZooKeeperConnection(
            hosts=self.zk_hosts,
            session_timeout_s=self.zk_session_timeout_s,
            user=self.zk_user,
            password=self.secret("zk_password"),
        )

    def engine_admin_port(self, engine_id: str) -> int:
        try:
            return self.engine_admin_ports[self.engine_ids.index(engine_id)]
        except ValueError:
            raise SettingsError(
                f"unknown engine {engine_id!r}; TWINSTREAM_ENGINE_IDS={','.join(self.engine_ids)}"
            ) from None

    def engine_admin_url(self, engine_id: str) -> str:
        host = self.engine_admin_host.replace("{id}", engine_id) or self.bind_host
        return f"{self.admin_scheme}://{host}:{self.engine_admin_port(engine_id)}"

    def engine_dir(self, engine_id: str) -> Path:
        return self.state_dir / "engines" / engine_id

    @property
    def spares_dir(self) -> Path:
        """Where this machine's warm spares listen (twinstream.engine.spare)."""
        return self.state_dir / "spares"

    def engine_conn_id(self, engine_id: str) -> str:
        """The Airflow connection that holds the engine's admin URL and token."""
        return f"twinstream_engine_{engine_id.replace('-', '_')}"

    def secret(self, name: str) -> str:
        """admin_token or zk_password: the setting, else the file the local stack wrote."""
        value: str = getattr(self, name)
        if value:
            return value
        path = self.state_dir / name.replace("_", "-")
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            raise SettingsError(
                f"no {name}: set TWINSTREAM_{name.upper()} or run `make up`, which writes {path}"
            ) from None

    @property
    def single_broker_dev(self) -> bool:
        """A one-broker development setup, where RF 3 checks become warnings."""
        return len(self.kafka_ports) == 1


class PipelineSettings(BaseSettings):
    """The per-pipeline context: which pipeline, its topics and their configuration. A
    process's own pipeline is TWINSTREAM_PIPELINE (no default: the product has no example
    pipeline of its own); `twinstream.platform.registry` gives any other one's."""

    model_config = _ENV

    # The pipeline this process works on; "" for a process over every pipeline (the stack,
    # the DAGs), and an error (`pipeline_name`) where one is needed and none was chosen.
    pipeline: str = Field(default="", pattern=rf"^$|{PIPELINE_NAME}")
    # A pipeline's topics; empty: <pipeline>.in, .out, .dlq and .progress. The progress
    # topic holds one record per published transaction, the inbound range it covers
    # (twinstream.core.outbound): how an input with no output is accounted for.
    inbound_topic: str = ""
    outbound_topic: str = ""
    dlq_topic: str = ""
    progress_topic: str = ""
    inbound_retention_ms: int = Field(default=7 * DAY_MS, ge=60_000)
    outbound_retention_ms: int = Field(default=7 * DAY_MS, ge=60_000)
    dlq_retention_ms: int = Field(default=14 * DAY_MS, ge=60_000)
    replication_factor: int = Field(default=3, ge=1)
    min_insync_replicas: int = Field(default=2, ge=1)
    # Partitions of each of the pipeline's four topics: a record's identity is (partition,
    # offset), and its outputs go to the same partition number (twinstream.core.rows). A
    # key's records must all be in one partition (producers partition by key) for per-key
    # state; more partitions spread a pipeline over more executor cores. A pipelines.toml
    # entry may set its own (`partitions = 3`).
    partitions: int = Field(default=1, ge=1, le=32_767)
    # Publisher adapters `make up` runs for the pipeline (twinstream.edge.publisher), from
    # its pipelines-file entry (`publishers`): the source they follow (a file, a folder, or
    # http://HOST:PORT to serve), how many (1 active, the rest standby), a folder's files.
    publisher_source: str = ""
    publisher_count: int = Field(default=0, ge=0, le=9)
    publisher_pattern: str = "*.jsonl"
    window_retention_ms: int = Field(default=60 * 60 * 1000, ge=1000)
    # The largest inbound record: a larger one is a dead letter (`oversize`) before it is
    # parsed (twinstream.engine.pipeline.validated).
    max_record_bytes: int = Field(default=64 * 1024, ge=64)
    # The largest Kafka message an engine writes. The outbound and dead-letter topics get
    # max.message.bytes of at least this; a dead letter whose raw bytes would exceed it
    # carries their prefix, full length and sha256 (twinstream.core.rows.dead_letter).
    max_message_bytes: int = Field(default=1_000_000, ge=16_384)

    @model_validator(mode="before")
    @classmethod
    def _default_topics(cls, values: Any) -> Any:
        if isinstance(values, dict) and values.get("pipeline"):
            for field, suffix in TOPIC_SUFFIXES.items():
                if not values.get(field):
                    values[field] = f"{values['pipeline']}.{suffix}"
        return values

    @model_validator(mode="after")
    def _check_pipeline(self) -> PipelineSettings:
        if self.min_insync_replicas > self.replication_factor:
            raise ValueError(
                f"min_insync_replicas={self.min_insync_replicas} exceeds "
                f"replication_factor={self.replication_factor}: no write could ever succeed"
            )
        topics = [self.inbound_topic, self.outbound_topic, self.dlq_topic, self.progress_topic]
        if self.pipeline and len(set(topics)) != len(topics):
            raise ValueError(
                f"inbound, outbound, dead-letter and progress topics must differ: {topics}"
            )
        return self

    @property
    def pipeline_name(self) -> str:
        """The pipeline; a process that works on one and was given none stops here, named."""
        if not self.pipeline:
            raise SettingsError(
                "no pipeline chosen: give --pipeline NAME, or set TWINSTREAM_PIPELINE to one "
                "of the pipelines file's"
            )
        return self.pipeline

    @property
    def transactional_id(self) -> str:
        """Shared by every engine of the pipeline: a new active's init fences the old one."""
        return self.topics().transactional_id

    def topics(self) -> PipelineTopics:
        """The pipeline's names in Kafka, for the clients that use nothing else of these."""
        return PipelineTopics(
            pipeline=self.pipeline_name,
            inbound=self.inbound_topic,
            outbound=self.outbound_topic,
            dlq=self.dlq_topic,
            progress=self.progress_topic,
        )

    @property
    def election_path(self) -> str:
        return f"/twinstream/{self.pipeline_name}/election"

    @property
    def epoch_path(self) -> str:
        return f"/twinstream/{self.pipeline_name}/epoch"

    @property
    def quarantine_path(self) -> str:
        return f"/twinstream/{self.pipeline_name}/quarantine"

    @property
    def deploys_path(self) -> str:
        """The pipeline's deploys, one znode each (twinstream.ops.deploy)."""
        return f"/twinstream/{self.pipeline_name}/deploys"


class CommonSettings(Connections, PipelineSettings):
    """What every process reads: where things are, and its pipeline. Where a pipeline's
    checkpoints, snapshots and audit live joins the two."""

    @model_validator(mode="after")
    def _check_common(self) -> CommonSettings:
        if self.replication_factor > len(self.kafka_ports):
            raise ValueError(
                f"replication_factor={self.replication_factor} needs at least that many "
                f"brokers, kafka_ports has {len(self.kafka_ports)}"
            )
        return self

    def checkpoint_dir(self, engine_id: str) -> Location:
        """The engine's Spark checkpoint: a local folder, or one on the shared storage
        `checkpoint_root` names."""
        return location(self.checkpoint_uri(engine_id))

    def checkpoint_uri(self, engine_id: str) -> str:
        """The same checkpoint as Spark's checkpointLocation names it: the configured URL
        as written (universal-pathlib's str of an HDFS path drops its namenode)."""
        if self.checkpoint_root:
            root = self.checkpoint_root.strip().rstrip("/")
            return f"{root}/{self.pipeline_name}/{engine_id}"
        return str(self.engine_dir(engine_id) / "checkpoint")

    @property
    def snapshot_dir(self) -> Location:
        """This pipeline's snapshots."""
        root = location(self.snapshot_root or self.state_dir / "snapshots")
        return root / self.pipeline_name

    @property
    def audit_dir(self) -> Path:
        """This pipeline's audit cursor, results and Great Expectations Data Docs."""
        return self.state_dir / "audit" / self.pipeline_name


class EngineTuning(BaseSettings):
    """How an engine runs its query: batches, buffers, Spark, the warm-up; read by the
    engines (and by the stack, which starts them)."""

    model_config = _ENV

    # The admin API's OpenAPI document and Swagger UI (/openapi.json, /docs) are served to
    # anyone who reaches the port, like /healthz: they describe the endpoints, no engine
    # data. false: not served at all.
    admin_api_docs: bool = True
    num_buffered_msgs: int = Field(default=10_000, ge=1)
    # The memory bound, in rows, of both roles (twinstream.core.gate): a standby keeps every
    # output the active has not published yet, and pauses its query once it holds this
    # many; an active that cannot publish pauses its query once it holds this many
    # unpublished. Nothing is dropped: a paused query leaves its input in Kafka.
    max_buffered_msgs: int = Field(default=100_000, ge=1)
    # Test-only fault injection, off unless set: the transform raises on any batch holding
    # a record that contains this text (a bug outside the per-record guard), so that tests
    # can prove the quarantine. Never set it in production.
    fault_marker: str = ""
    trigger_interval_ms: int = Field(default=250, ge=0)
    # Bounds a catch-up batch, so a standby that replays a backlog still reaches takeover
    # readiness batch by batch rather than in one long batch. A steady stream runs in small
    # batches whatever this is (what arrived in one trigger interval); a backlog (a restart,
    # a rejoin, the end of an outage) drains in batches this large, each paying a batch's
    # fixed cost (~0.6 s on two cores) once: at 5,000 that cost caps a drain near 5,000
    # events/s, at 20,000 one batch takes ~2 s and a drain runs twice as fast.
    max_offsets_per_trigger: int = Field(default=20_000, ge=1)
    # A catch-up batch's length in time (twinstream.engine.batching): each query start sizes its
    # batches to what the engine measured it processes in this long, between
    # min_offsets_per_trigger and max_offsets_per_trigger. A takeover, a persist or a stop
    # waits for the batch in flight: this bounds that wait on any machine.
    max_batch_s: float = Field(default=3.0, gt=0)
    min_offsets_per_trigger: int = Field(default=2_000, ge=1)
    # An engine runs this many of its pipeline's sample records (`Pipeline.sample`) through
    # its whole plan when its Spark session starts, before its query: the first batches of
    # real records then run warm (twinstream.engine.pipeline.warm_up). 0: no warm-up.
    warm_up_records: int = Field(default=2_000, ge=0)
    # How often an engine logs where its batches spent their time (the medians since the
    # last line: Spark's parts, the batch's job and the gate's publish on the driver).
    batch_timings_log_s: float = Field(default=60.0, gt=0)
    # Warm spares per machine (twinstream.engine.spare): engine processes started ahead, at
    # a low CPU priority, past their JVM's start, Spark session and a warm-up, that a
    # restarted engine asks to become it instead of starting cold. 0: every start is cold.
    spares: int = Field(default=1, ge=0)
    # How long an adopted spare may catch up at its low priority before it is raised to the
    # engines' own anyway (twinstream.engine.priority): it is raised at once when in sync or
    # leading. On two cores a catch-up at the active's priority paused its output 7-9 s. 0:
    # raised on adoption.
    catch_up_niced_s: float = Field(default=120.0, ge=0)
    # The engine's JVM heap (its Spark driver's memory: spark.driver.memory).
    engine_heap: str = Field(default="1g", pattern=r"^\d+[kmg]$")
    # Where an engine's Spark runs: local[n] in the engine's own JVM (the default), a
    # standalone cluster (spark://host:7077), yarn, k8s://...; "" leaves it to spark-submit's
    # --master or spark-defaults.conf. On a cluster the executors need this project's Python
    # (PYSPARK_PYTHON) and the pipelines' folder on their PYTHONPATH (README, "On a Spark
    # cluster").
    spark_master: str = Field(
        default="local[2]",
        pattern=r"^$|^(local(\[[0-9*]+\])?|spark://[^\s]+|yarn|k8s://[^\s]+|mesos://[^\s]+)$",
    )
    # More Spark settings for the engines, key=value pairs separated by ";" (Spark's values
    # hold commas and spaces, never semicolons): a cluster's deploy settings, say
    # "spark.executor.memory=2g;spark.kubernetes.container.image=...". The framework's own
    # and the pipeline's win where they meet.
    spark_conf: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    # Cores an engine's application takes on a cluster (spark.cores.max): a standalone
    # master gives an application every free core by default, and the standby's would wait.
    spark_cores: int = Field(default=1, ge=1)
    # The local stack runs a Spark standalone master and one worker (`make up SPARK=standalone`)
    # and its engines use them; the ports are the master's and its web UI's.
    spark_standalone: bool = False
    # Where the master and the worker listen and are reached; empty: bind_host (compose:
    # their service names).
    spark_master_host: str = ""
    spark_master_port: Port = 7077

    @field_validator("spark_conf", mode="before")
    @classmethod
    def _split_pairs(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        pairs: dict[str, str] = {}
        for part in value.split(";"):
            if not part.strip():
                continue
            key, sep, item = part.partition("=")
            if not sep or not key.strip().startswith("spark."):
                raise ValueError(
                    f"{part.strip()!r} is not spark.<key>=<value>; pairs are separated by ';'"
                )
            pairs[key.strip()] = item.strip()
        return pairs


class InSyncBounds(BaseSettings):
    """When an engine counts as in sync: the engines decide it, the status and the health
    checks read the same bounds."""

    model_config = _ENV

    # An engine is in sync when it would reach the inbound head within this many seconds at
    # the rate its own batches measured: what a takeover would wait for. It leaves only
    # after in_sync_hold_s above it, or at twice it (twinstream.engine.readiness.InSync):
    # a level engine's lag swings by a batch between triggers.
    in_sync_s: float = Field(default=3.0, gt=0)
    in_sync_hold_s: float = Field(default=5.0, ge=0)
    # In records: the in-sync bound until an engine has measured its rate, and the margin
    # by which a winner hands its win to a more caught-up in-sync engine (a batch's worth).
    in_sync_lag: int = Field(default=5_000, ge=0)


class Housekeeping(BaseSettings):
    """The Airflow tasks' schedules and bounds: persist, retention, watch, audit."""

    model_config = _ENV

    dags_dir: Path = REPO_ROOT / "dags"
    # How often persist_standby_state runs: that DAG's schedule is built from this number,
    # and check_kafka_retention reads the schedule back rather than this setting.
    persist_interval_s: int = Field(default=900, ge=60)
    snapshots_keep: int = Field(default=3, ge=1)
    # An engine down or stopped this long makes watch_engines start restore_and_resync.
    watch_grace_s: int = Field(default=120, ge=0)
    # watch_engines restores one engine at most this many times in this many seconds,
    # whatever the cause: an engine a restore does not heal is never restored in a loop.
    watch_restore_cap: int = Field(default=2, ge=1)
    watch_restore_window_s: int = Field(default=3600, ge=60)
    # check_kafka_retention: inbound retention must exceed window retention + persist
    # interval + this margin (the time a restore may take to start and replay).
    restore_margin_s: int = Field(default=3600, ge=0)
    # audit_output_topic: its schedule, and, with its Param up_to=margin only, how far below
    # the inbound high watermark an audit stops (messages still in flight through the
    # engines are not gaps yet); by default an audit ends at what the engines committed.
    audit_interval_s: int = Field(default=600, ge=60)
    audit_inflight_msgs: int = Field(default=20_000, ge=0)
    # The niceness of the Spark jobs the DAGs start (the audit's), below the engines: on
    # two cores each audit's JVM took a third of a core for minutes, every
    # audit_interval_s, as the engines' equal (their batches then took 85 s at 300 events/s
    # and ZooKeeper sessions were lost). Airflow's own servers keep TWINSTREAM_AIRFLOW_NICENESS:
    # the page must answer at once. A job can wait; an output cannot.
    job_niceness: int = Field(default=10, ge=0, le=19)


class StackLayout(BaseSettings):
    """The local stack's own ports, heaps and folders: read only by the stack (`make up`,
    `twinstream.stack`), never by an engine, a task or an adapter."""

    model_config = _ENV

    plugins_dir: Path = REPO_ROOT / "plugins"
    zk_peer_port: Port = 2888
    zk_election_port: Port = 3888
    # ZooKeeper clamps session timeouts to [2, 20] x tickTime; 500 ms lets a dead engine's
    # session expire within about a second.
    zk_tick_ms: int = Field(default=500, ge=100, le=2000)
    kafka_controller_ports: PortList = [9192, 9193, 9194]
    # With Kafka security: the brokers' mutual-TLS listener, on which they replicate and the
    # stack itself (`up`, which holds the servers' key) makes the users and ACLs. Empty: each
    # of kafka_ports + 200 (9292, 9293, 9294).
    kafka_broker_ports: PortList = []
    airflow_port: Port = 8080
    # The niceness Airflow runs at, and with it every DAG task and Spark job it starts
    # (`setpriority`, inherited), so that the engines keep the cores first: an audit or a
    # persist can wait a minute, an output cannot. 0 (as the engines) by default: all of
    # Airflow is niced, its API server too, and at 10 the operator page took 8.5 s to show
    # a new active after a kill -9 in make test (its bound: 5.3 s). Niceness for the tasks
    # alone is issue 52's to do.
    airflow_niceness: int = Field(default=0, ge=0, le=19)
    # Whether a DAG Airflow sees for the first time starts paused (Airflow's
    # dags_are_paused_at_creation). False: the housekeeping DAGs run on their schedules, as
    # the README's "What runs by itself" says. The tests' stack sets it: they trigger DAGs
    # themselves, and scheduled runs would disturb the engines under test. A DAG's state in
    # an existing Airflow database is kept (toggle it in the UI or `airflow dags unpause`).
    dags_paused: bool = False
    # The mutual-TLS listeners the same way (compose: kafka-1:19095,...).
    kafka_broker_bootstrap: str = ""
    # The ports of those adapters' GET /metrics (`twinstream publish --metrics-port`), given
    # in order to the stack's publisher programs, pipeline by pipeline, as the engines get
    # their admin ports; empty: no /metrics. Clear of the engines' 87xx and of 8800, the
    # port an HTTP source is usually given.
    publisher_metrics_ports: PortList = [8811, 8812, 8813, 8814, 8815, 8816, 8817, 8818]
    spark_worker_host: str = ""
    spark_master_ui_port: Port = 8090
    spark_worker_ui_port: Port = 8091
    # 0: as many as the stack's engines take (engines x spark_cores), whatever the machine
    # has: an application the worker has no core left for waits, and a standby without
    # executors computes nothing.
    spark_worker_cores: int = Field(default=0, ge=0)
    # Empty: 1g per engine (Spark's default executor memory); an application whose executor
    # the worker has no memory left for waits too.
    spark_worker_memory: str = Field(default="", pattern=r"^$|^\d+[kmg]$")
    zk_heap: str = Field(default="256m", pattern=r"^\d+[kmg]$")
    kafka_heap: str = Field(default="512m", pattern=r"^\d+[kmg]$")
    # How long `up` waits for every service to become healthy before it gives up.
    startup_timeout_s: float = Field(default=420.0, gt=0)

    @field_validator(
        "kafka_controller_ports", "kafka_broker_ports", "publisher_metrics_ports", mode="before"
    )
    @classmethod
    def _split_stack_lists(cls, value: Any) -> Any:
        return _split_commas(value)


class EngineSettings(CommonSettings, EngineTuning, InSyncBounds):
    """What an engine reads (spark_jobs/engine.py)."""

    @property
    def standalone_master_url(self) -> str:
        """The local stack's (or compose's) standalone master."""
        return f"spark://{self.spark_master_host or self.bind_host}:{self.spark_master_port}"

    @property
    def engine_spark_master(self) -> str:
        """The master the engines use: the local stack's standalone master when it runs one."""
        if self.spark_standalone:
            return self.standalone_master_url
        return self.spark_master

    @property
    def warm_spares(self) -> int:
        """The warm spares this machine keeps: `spares` where the engines' Spark runs in
        their own JVMs; none on a cluster, where a spare would be an application holding
        cores an engine needs (README, "On a Spark cluster")."""
        master = self.engine_spark_master
        return self.spares if master.startswith("local") else 0


class TaskSettings(CommonSettings, Housekeeping, InSyncBounds):
    """What an Airflow task or DAG file reads (dags/, spark_jobs/audit_output.py)."""


class AdapterSettings(CommonSettings):
    """What a publisher or subscriber adapter reads (twinstream.edge)."""


class Settings(EngineSettings, TaskSettings, AdapterSettings, StackLayout):
    """Every group: what the local stack and the operator's CLI read, which start and
    configure every other process (each child gets these as TWINSTREAM_* variables and
    reads its own groups of them)."""

    @model_validator(mode="after")
    def _check_stack(self) -> Settings:
        brokers = len(self.kafka_ports)
        if len(self.kafka_controller_ports) != brokers:
            raise ValueError(
                f"kafka_controller_ports has {len(self.kafka_controller_ports)} entries but "
                f"kafka_ports has {brokers}: every node runs one broker and one controller"
            )
        if self.kafka_broker_ports and len(self.kafka_broker_ports) != brokers:
            raise ValueError(
                f"kafka_broker_ports has {len(self.kafka_broker_ports)} entries but kafka_ports "
                f"has {brokers}: every broker has one mutual-TLS listener"
            )
        ports = self.ports
        clashes = sorted({p for p in ports if ports.count(p) > 1})
        if clashes:
            raise ValueError(f"ports are used twice: {clashes}")
        return self

    @property
    def ports(self) -> list[int]:
        """Every port the local stack listens on."""
        quorum = [*self.zk_peer_ports, *self.zk_election_ports] if self.zk_nodes > 1 else []
        spark = (
            [self.spark_master_port, self.spark_master_ui_port, self.spark_worker_ui_port]
            if self.spark_standalone
            else []
        )
        return [
            *self.zk_client_ports,
            *spark,
            *quorum,
            self.airflow_port,
            *self.kafka_ports,
            *self.kafka_controller_ports,
            *(self.broker_ports if self.kafka_security else []),
            *self.engine_admin_ports,
            *self.publisher_metrics_ports,
        ]

    @property
    def broker_listener_servers(self) -> str:
        """The brokers' mutual-TLS listeners (Kafka security only)."""
        if self.kafka_broker_bootstrap:
            return self.kafka_broker_bootstrap
        return ",".join(f"{self.bind_host}:{port}" for port in self.broker_ports)

    @property
    def broker_ports(self) -> list[int]:
        """The brokers' mutual-TLS listener ports (kafka_broker_ports)."""
        return self.kafka_broker_ports or [port + 200 for port in self.kafka_ports]

    @property
    def zk_peer_ports(self) -> list[int]:
        return [self.zk_peer_port + n for n in range(self.zk_nodes)]

    @property
    def zk_election_ports(self) -> list[int]:
        return [self.zk_election_port + n for n in range(self.zk_nodes)]

    @property
    def airflow_url(self) -> str:
        return f"http://{self.bind_host}:{self.airflow_port}"

    @property
    def spark_master_ui_url(self) -> str:
        """The local stack's standalone master's web UI (its status as JSON at /json/)."""
        return f"http://{self.bind_host}:{self.spark_master_ui_port}"


S = TypeVar("S", bound=BaseSettings)


def load(kind: type[S], **overrides: Any) -> S:
    """Read one process's settings (`kind`: EngineSettings, TaskSettings, AdapterSettings,
    Settings) from the environment; a bad value raises SettingsError naming it. Variables
    of groups `kind` does not hold are not read, so not validated."""
    try:
        return kind(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"TWINSTREAM_{'_'.join(str(p) for p in err['loc']).upper() or '*'}: {err['msg']}"
            for err in exc.errors()
        )
        raise SettingsError(f"invalid Twinstream configuration: {problems}") from exc


def load_settings(**overrides: Any) -> Settings:
    """Every group: the local stack's and the operator's CLI's settings."""
    return load(Settings, **overrides)
