"""Pure renderers for every configuration file of the local stack.

Nothing here touches the disk or the network, so the whole configuration is unit-tested and
`up` can tell whether anything changed by comparing text.
"""

from __future__ import annotations

import base64
import json
import shlex
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from pydantic_settings import BaseSettings

from twinstream.platform import registry
from twinstream.platform.connections import MECHANISM
from twinstream.platform.kafka_auth import ADMIN_USER
from twinstream.platform.settings import (
    REPO_ROOT,
    Connections,
    PipelineSettings,
    Settings,
    SettingsError,
)
from twinstream.stack.layout import Layout
from twinstream.stack.tls import SERVER_CN, TlsFiles

ZOOKEEPER_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
KAFKA_MAIN = "kafka.Kafka"
KAFKA_STORAGE_TOOL = "kafka.tools.StorageTool"
SPARK_MASTER_MAIN = "org.apache.spark.deploy.master.Master"
SPARK_WORKER_MAIN = "org.apache.spark.deploy.worker.Worker"


# Engines reach Kafka as their pipeline's engine user: the one allowed to write its outputs
# and use its transactional id (twinstream.platform.kafka_auth).
ENGINE_KAFKA_ROLE = {"TWINSTREAM_KAFKA_ROLE": "engine"}


@dataclass(frozen=True)
class Program:
    """One supervisord program: a long-running process of the stack."""

    name: str
    command: Sequence[str]
    priority: int
    environment: Mapping[str, str] = field(default_factory=dict)
    # Seconds a process must stay up to count as started; a crash before that is a failed
    # start, which supervisord retries `startretries` times before giving up (FATAL).
    startsecs: int = 5
    stopwaitsecs: int = 30
    # False: supervisord starts it only when asked (`up` starts the engines once Kafka
    # serves their topics), but still restarts it whenever it exits.
    autostart: bool = True


# The keeper of this machine's warm spares (twinstream.engine.spare_keeper).
SPARES_PROGRAM = "spares"
# Airflow (`airflow standalone`: its scheduler, DAG processor, triggerer and API server).
AIRFLOW_PROGRAM = "airflow"


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (22 chars), not
    starting with "-": kafka-storage's argument parser takes "--cluster-id -Vap..." for a
    missing value and an option, and one random id in 64 starts with "-". Kafka's own
    Uuid.randomUuid() skips such ids for the same reason."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def node_ids(settings: Connections) -> list[int]:
    return list(range(1, len(settings.kafka_ports) + 1))


def zookeeper_names(settings: Connections) -> list[str]:
    """The stack's ZooKeeper programs: `zookeeper` alone, `zookeeper-1`... in an ensemble."""
    if settings.zk_nodes == 1:
        return ["zookeeper"]
    return [f"zookeeper-{n}" for n in range(1, settings.zk_nodes + 1)]


def zookeeper_dir(settings: Connections, layout: Layout, node: int) -> Path:
    """Node `node`'s folder (config, data); a single server keeps the folder it always had."""
    if settings.zk_nodes == 1:
        return layout.zookeeper_dir
    return layout.zookeeper_dir / f"node-{node}"


def zoo_cfg(settings: Settings, layout: Layout, node: int = 1) -> str:
    """zoo.cfg of server `node` (from 1): standalone, or a member of the ensemble."""
    folder = zookeeper_dir(settings, layout, node)
    host = settings.bind_host
    ensemble = [
        f"server.{n}={host}:{peer}:{election}"
        for n, (peer, election) in enumerate(
            zip(settings.zk_peer_ports, settings.zk_election_ports, strict=True), start=1
        )
    ]
    return "\n".join(
        [
            f"tickTime={settings.zk_tick_ms}",
            "initLimit=10",
            "syncLimit=5",
            f"dataDir={folder / 'data'}",
            f"clientPort={settings.zk_client_ports[node - 1]}",
            f"clientPortAddress={host}",
            # The Jetty admin server would claim port 8080, which is Airflow's.
            "admin.enableServer=false",
            # ruok/srvr are the health probes of `up` and `status`; conf shows tickTime.
            "4lw.commands.whitelist=ruok,srvr,mntr,conf",
            # Clients authenticate by SASL DIGEST-MD5 (the users in jaas.conf), and a session
            # that has not cannot read, create or delete anything, whatever a node's ACL.
            "authProvider.sasl=org.apache.zookeeper.server.auth.SASLAuthenticationProvider",
            "enforce.auth.enabled=true",
            "enforce.auth.schemes=sasl",
            # Keep snapshots and logs from filling a developer's disk.
            "autopurge.snapRetainCount=3",
            "autopurge.purgeInterval=1",
            # An ensemble's members; each also needs data/myid (its number).
            *(ensemble if settings.zk_nodes > 1 else []),
            "",
        ]
    )


def zookeeper_jaas(settings: Connections) -> str:
    """ZooKeeper's SASL users (DIGEST-MD5): Twinstream's. Holds the password: write 0600."""
    password = settings.secret("zk_password")
    if '"' in password or "\\" in password:
        raise ValueError(
            "the ZooKeeper password cannot hold a quote or a backslash (JAAS would misread "
            "it): set TWINSTREAM_ZK_PASSWORD to letters, digits, '-' and '_' only"
        )
    return (
        "Server {\n"
        "  org.apache.zookeeper.server.auth.DigestLoginModule required\n"
        f'  user_{settings.zk_user}="{password}";\n'
        "};\n"
    )


def zookeeper_jaas_path(layout: Layout) -> Path:
    return layout.zookeeper_dir / "jaas.conf"


def zookeeper_logback() -> str:
    # ZooKeeper logs through SLF4J; without a config logback would log DEBUG to stdout.
    return """<configuration>
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d{ISO8601} %-5level [%thread] %logger{36} - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="STDOUT"/></root>
</configuration>
"""


def kafka_server_properties(settings: Settings, layout: Layout, node_id: int) -> str:
    host = settings.bind_host
    voters = ",".join(
        f"{n}@{host}:{settings.kafka_controller_ports[n - 1]}" for n in node_ids(settings)
    )
    rf = settings.replication_factor
    min_isr = settings.min_insync_replicas
    lines = [
        # Every node is broker and controller: three JVMs instead of six on a 2-core machine.
        "process.roles=broker,controller",
        f"node.id={node_id}",
        f"controller.quorum.voters={voters}",
        *kafka_listeners(settings, node_id),
        f"log.dirs={layout.kafka_node_dir(node_id) / 'data'}",
        "num.partitions=1",
        f"default.replication.factor={rf}",
        f"min.insync.replicas={min_isr}",
        # Internal topics get the same durability as ours: transactions (the engines' fence)
        # and consumer offsets must survive the loss of one broker.
        f"offsets.topic.replication.factor={rf}",
        f"transaction.state.log.replication.factor={rf}",
        f"transaction.state.log.min.isr={min_isr}",
        "unclean.leader.election.enable=false",
        # Topics are created by `up` with explicit configs; a typo must not create one.
        "auto.create.topics.enable=false",
        # Consumers of a fresh group start at once instead of waiting 3 s for peers.
        "group.initial.rebalance.delay.ms=0",
        # A stopped broker is noticed in about 3 s rather than 9.
        "broker.session.timeout.ms=3000",
        "broker.heartbeat.interval.ms=500",
        "",
    ]
    return "\n".join(lines)


def kafka_listeners(settings: Settings, node_id: int) -> list[str]:
    """server.properties lines of the listeners: PLAINTEXT without Kafka security; else
    SASL/SCRAM over TLS for clients, mutual TLS among the brokers and the controllers, and
    ACLs (twinstream.platform.kafka_auth).

    Brokers and controllers prove who they are with the servers' certificate, not a SCRAM
    password: SCRAM users live in the metadata log, which the quorum must first agree on, and
    a storage formatted before Kafka security (an existing stack) has none. So the stack's
    own identity needs nothing from the metadata, and `up` makes every SCRAM user itself
    (twinstream.platform.kafka_auth.provision), over the brokers' mutual-TLS listener."""
    host = settings.bind_host
    port = settings.kafka_ports[node_id - 1]
    controller_port = settings.kafka_controller_ports[node_id - 1]
    if not settings.kafka_security:
        return [
            f"listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
            f"advertised.listeners=PLAINTEXT://{host}:{port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        ]
    tls = TlsFiles(settings.tls_dir)
    broker_port = settings.broker_ports[node_id - 1]
    return [
        f"listeners=SASL_SSL://{host}:{port},BROKER://{host}:{broker_port},"
        f"CONTROLLER://{host}:{controller_port}",
        f"advertised.listeners=SASL_SSL://{host}:{port},BROKER://{host}:{broker_port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=BROKER",
        "listener.security.protocol.map=SASL_SSL:SASL_SSL,BROKER:SSL,CONTROLLER:SSL",
        f"sasl.enabled.mechanisms={MECHANISM}",
        # A broker only checks SCRAM logins: it logs in to no one with a password.
        f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config="
        "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        # PEM files as they are: key and certificate in one, the CA alone. No passwords
        # (Kafka refuses one with PEM files; the key is unencrypted, the folder 0700).
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={tls.bundle}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={tls.ca}",
        # Only holders of a certificate the stack's CA signed: the brokers, and `up`.
        "listener.name.broker.ssl.client.auth=required",
        "listener.name.controller.ssl.client.auth=required",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        # What no ACL allows is denied.
        "allow.everyone.if.no.acl.found=false",
        f"super.users=User:{ADMIN_USER};User:CN={SERVER_CN}",
    ]


def kafka_log4j2() -> str:
    return "\n".join(
        [
            "status = warn",
            "appender.out.type = Console",
            "appender.out.name = STDOUT",
            "appender.out.layout.type = PatternLayout",
            "appender.out.layout.pattern = [%d] %p %m (%c)%n",
            "rootLogger.level = INFO",
            "rootLogger.appenderRef.out.ref = STDOUT",
            # Per-partition state changes drown everything else at INFO.
            "logger.state.name = state.change.logger",
            "logger.state.level = WARN",
            "",
        ]
    )


def java_command(
    main: str, classpath: Path, heap: str, args: Sequence[str], props: Mapping[str, str]
) -> list[str]:
    return [
        "java",
        f"-Xms{heap}",
        f"-Xmx{heap}",
        # Small heaps on a shared 2-core machine: keep GC threads from competing.
        "-XX:+UseG1GC",
        "-XX:ParallelGCThreads=1",
        "-XX:ConcGCThreads=1",
        "-Djava.awt.headless=true",
        *(f"-D{k}={v}" for k, v in props.items()),
        "-cp",
        f"{classpath}/*",
        main,
        *args,
    ]


def kafka_format_command(
    settings: Connections, layout: Layout, node_id: int, cluster_id: str
) -> list[str]:
    return java_command(
        KAFKA_STORAGE_TOOL,
        settings.jars_dir / "kafka",
        "256m",
        [
            "format",
            "-t",
            cluster_id,
            "-c",
            str(layout.kafka_node_dir(node_id) / "server.properties"),
        ],
        {"log4j2.configurationFile": str(layout.kafka_dir / "log4j2.properties")},
    )


def settings_environment(settings: BaseSettings) -> dict[str, str]:
    """Any process's settings as TWINSTREAM_* variables, so child processes see exactly
    these values (each child reads the groups it holds)."""
    env: dict[str, str] = {}
    for name, value in settings.model_dump().items():
        if value is None:  # unset optional: the child derives it the same way
            continue
        if isinstance(value, list):
            text = ",".join(str(v) for v in value)
        elif isinstance(value, dict):
            text = ";".join(f"{k}={v}" for k, v in value.items())
        else:
            text = str(value)
        env[f"TWINSTREAM_{name.upper()}"] = text
    return env


def programs(
    settings: Settings, layout: Layout, pipelines: Mapping[str, Settings] | None = None
) -> list[Program]:
    """Every program of the stack; the engines of every pipeline in `pipelines` (name ->
    its settings), by default the stack's (twinstream.platform.registry.stack)."""
    env = settings_environment(settings)
    result = [
        Program(
            name=name,
            command=java_command(
                ZOOKEEPER_MAIN,
                settings.jars_dir / "zookeeper",
                settings.zk_heap,
                [str(zookeeper_dir(settings, layout, node) / "zoo.cfg")],
                {
                    "logback.configurationFile": str(layout.zookeeper_dir / "logback.xml"),
                    "java.security.auth.login.config": str(zookeeper_jaas_path(layout)),
                },
            ),
            priority=10,
            environment=env,
        )
        for node, name in enumerate(zookeeper_names(settings), start=1)
    ]
    for node_id in node_ids(settings):
        result.append(
            Program(
                name=f"kafka-{node_id}",
                command=java_command(
                    KAFKA_MAIN,
                    settings.jars_dir / "kafka",
                    settings.kafka_heap,
                    [str(layout.kafka_node_dir(node_id) / "server.properties")],
                    {"log4j2.configurationFile": str(layout.kafka_dir / "log4j2.properties")},
                ),
                priority=20,
                environment=env,
                # A controller flushes and hands over leadership on SIGTERM; give it time.
                stopwaitsecs=60,
            )
        )
    if settings.spark_standalone:
        result += spark_standalone(settings, layout, env)
    stack = registry.stack(settings) if pipelines is None else pipelines
    # Every engine shares the stack's environment and finds its pipeline by its id
    # (registry.for_engine): one place, the pipelines file, says which engine runs what.
    engine_env = {**env, "PYSPARK_PYTHON": sys.executable, **ENGINE_KAFKA_ROLE}
    engines = [e for pipeline in stack.values() for e in pipeline.engine_ids]
    for engine_id in engines:
        result.append(
            Program(
                name=f"engine-{engine_id}",
                command=[
                    sys.executable,
                    str(REPO_ROOT / "spark_jobs" / "engine.py"),
                    "--engine-id",
                    engine_id,
                ],
                priority=40,
                # Spark's Python workers must run the virtualenv's interpreter.
                environment=engine_env,
                startsecs=10,
                # SIGTERM: leave the election (a standby takes over), then stop the query.
                stopwaitsecs=60,
                # Started by `up` once Kafka is healthy and their topics exist: started with
                # everything else, their JVMs would take the cores the starting brokers and
                # Airflow need, only to wait for them.
                autostart=False,
            )
        )
    # This machine's warm spares (twinstream.engine.spare_keeper), started by `up` with the
    # engines: a restarted engine asks one to become it. The keeper starts them niced: a
    # spare's JVM start and warm-up never take the cores from running engines.
    if engines and settings.warm_spares:
        result.append(
            Program(
                name=SPARES_PROGRAM,
                command=[
                    sys.executable,
                    str(REPO_ROOT / "spark_jobs" / "engine.py"),
                    "--keep-spares",
                    str(settings.warm_spares),
                ],
                priority=45,
                environment=engine_env,
                startsecs=2,
                stopwaitsecs=60,
                autostart=False,
            )
        )
    # Each pipeline's publisher adapters (its `publishers` entry): one elected active, the
    # others standby; started by `up` with the engines, once the topics and users exist.
    # Each serves its /metrics on a port of its own, as an engine its admin API.
    metrics_ports = publisher_metrics_ports(
        settings.publisher_metrics_ports, settings.pipelines_file, stack
    )
    for pipeline in stack.values():
        for name in publisher_programs(pipeline):
            metrics = ["--metrics-port", str(metrics_ports[name])] if metrics_ports else []
            result.append(
                Program(
                    name=name,
                    command=[
                        sys.executable,
                        "-m",
                        "twinstream.ops.cli",
                        "publish",
                        "--pipeline",
                        pipeline.pipeline,
                        "--source",
                        pipeline.publisher_source,
                        "--pattern",
                        pipeline.publisher_pattern,
                        "--id",
                        name.removeprefix("publisher-"),
                        *metrics,
                    ],
                    priority=45,
                    environment=env,
                    startsecs=5,
                    # SIGTERM: leave the election; the open transaction is aborted.
                    stopwaitsecs=30,
                    autostart=False,
                )
            )
    result.append(
        Program(
            name=AIRFLOW_PROGRAM,
            command=[sys.executable, "-m", "twinstream.stack.launch", "airflow"],
            priority=30,
            # The settings alone, nothing of the pipelines file: a pipeline added or removed
            # leaves Airflow running. Its engines' connections live in a file Airflow reads
            # at every lookup (airflow_connections), its DAGs and page read the pipelines file.
            environment=env,
            startsecs=10,
            stopwaitsecs=60,
            # `up` starts it once the engines run (core.up says why).
            autostart=False,
        )
    )
    return result


def publisher_programs(pipeline: PipelineSettings) -> list[str]:
    """The supervisord programs of a pipeline's publisher adapters (none without a source)."""
    if not pipeline.publisher_source:
        return []
    return [f"publisher-{pipeline.pipeline}-{n}" for n in range(1, pipeline.publisher_count + 1)]


def publisher_metrics_ports(
    ports: list[int], pipelines_file: Path, stack: Mapping[str, Settings]
) -> dict[str, int]:
    """Each publisher program of the stack -> the port of its /metrics: the settings'
    publisher_metrics_ports in order, pipeline by pipeline (none when that list is empty).
    Refuses too few ports, or one an engine of the stack uses, naming the fix."""
    names = [name for pipeline in stack.values() for name in publisher_programs(pipeline)]
    if not ports or not names:
        return {}
    if len(names) > len(ports):
        raise SettingsError(
            f"{len(names)} publisher adapters in {pipelines_file} but "
            f"TWINSTREAM_PUBLISHER_METRICS_PORTS has {len(ports)} ports: give one per adapter "
            "(or set it empty for no /metrics)"
        )
    admin = {p for pipeline in stack.values() for p in pipeline.engine_admin_ports}
    taken = sorted(admin & set(ports[: len(names)]))
    if taken:
        raise SettingsError(
            f"TWINSTREAM_PUBLISHER_METRICS_PORTS gives publisher adapters the ports {taken}, "
            "which engines of the stack use as admin ports: choose others"
        )
    return dict(zip(names, ports, strict=False))


def engine_connections(
    settings: Settings, pipelines: Mapping[str, Settings] | None = None
) -> dict[str, dict[str, object]]:
    """conn_id -> Airflow connection (as JSON fields) of every engine of every pipeline in
    `pipelines` (by default the stack's): its admin API, the token as password, and for https
    with a private CA the CA's file as "ca" in the extra (twinstream.ops.operate reads them)."""
    token = settings.secret("admin_token")
    stack = registry.stack(settings) if pipelines is None else pipelines
    # https with a private CA: the client verifies the engines against it.
    ca = {"extra": {"ca": settings.admin_tls_cafile}} if settings.admin_tls_cafile else {}
    conns: dict[str, dict[str, object]] = {}
    for pipeline in stack.values():
        for engine_id in pipeline.engine_ids:
            url = urlsplit(pipeline.engine_admin_url(engine_id))
            conns[settings.engine_conn_id(engine_id)] = {
                "conn_type": "http",
                "host": url.hostname,
                "port": url.port,
                "schema": url.scheme,
                "password": token,
                **ca,
            }
    return conns


def airflow_connections(settings: Settings, pipelines: Mapping[str, Settings] | None = None) -> str:
    """The stack Airflow's connections file (JSON, conn_id -> fields): every engine's.
    Airflow's LocalFilesystemBackend (launch.airflow_environment) parses it again at every
    lookup, in the API server and in each task, so `up` rewriting it for a new pipeline
    reaches Airflow without a restart. Holds the admin token: write it 0600."""
    return json.dumps(engine_connections(settings, pipelines), indent=2, sort_keys=True) + "\n"


def spark_home() -> Path:
    """The Spark distribution pyspark installs (its jars/ folder): a standalone worker
    builds its executors' command from it (SPARK_HOME)."""
    import pyspark

    return Path(pyspark.__file__).parent


def worker_cores(settings: Settings) -> int:
    """The standalone worker's cores: the setting, or every stack engine's share."""
    if settings.spark_worker_cores:
        return settings.spark_worker_cores
    return settings.spark_cores * len(registry.engines(settings))


def spark_standalone(settings: Settings, layout: Layout, env: Mapping[str, str]) -> list[Program]:
    """A Spark standalone master and one worker from pyspark's own distribution, for the
    engines to run on as on a cluster (TWINSTREAM_SPARK_STANDALONE)."""
    home = spark_home()
    host = settings.spark_master_host or settings.bind_host
    worker_host = settings.spark_worker_host or settings.bind_host
    # The worker's launcher asks for the Scala version before it looks for SPARK_HOME/jars
    # ("Cannot find any build directories" without it): the one spark-core was built for.
    (core,) = (home / "jars").glob("spark-core_*.jar")
    scala = core.name.removeprefix("spark-core_").split("-", 1)[0]
    spark_env = {
        **env,
        "SPARK_HOME": str(home),
        "SPARK_SCALA_VERSION": scala,
    }
    props = {"spark.ui.showConsoleProgress": "false"}
    return [
        Program(
            name="spark-master",
            command=java_command(
                SPARK_MASTER_MAIN,
                home / "jars",
                "512m",
                [
                    "--host",
                    host,
                    "--port",
                    str(settings.spark_master_port),
                    "--webui-port",
                    str(settings.spark_master_ui_port),
                ],
                props,
            ),
            priority=15,
            environment={**spark_env, "SPARK_LOCAL_IP": host},
        ),
        Program(
            name="spark-worker",
            command=java_command(
                SPARK_WORKER_MAIN,
                home / "jars",
                "512m",
                [
                    settings.standalone_master_url,
                    "--host",
                    worker_host,
                    "--cores",
                    str(worker_cores(settings)),
                    "--memory",
                    settings.spark_worker_memory or f"{len(registry.engines(settings))}g",
                    "--webui-port",
                    str(settings.spark_worker_ui_port),
                    "--work-dir",
                    str(layout.root / "spark" / "work"),
                ],
                props,
            ),
            priority=16,
            # The executors it starts bind where it does (not the host's first interface).
            environment={**spark_env, "SPARK_LOCAL_IP": worker_host},
        ),
    ]


def _env_line(environment: Mapping[str, str]) -> str:
    def quote(value: str) -> str:
        if any(c in value for c in "\"'\n"):
            raise ValueError(f"cannot pass {value!r} through supervisord's environment=")
        return f'"{value}"'

    return ",".join(f"{k}={quote(v)}" for k, v in sorted(environment.items()))


def supervisord_conf(settings: Settings, layout: Layout, path: str) -> str:
    """supervisord.conf for every program; `path` is the PATH the programs run with."""
    sections = [
        "; Generated by `twinstream-stack up` from the TWINSTREAM_* settings. Do not edit:",
        "; the next `up` overwrites it.",
        "[unix_http_server]",
        f"file={layout.supervisor_socket}",
        "chmod=0700",
        "",
        "[supervisord]",
        f"logfile={layout.log_file('supervisord')}",
        f"pidfile={layout.supervisor_pidfile}",
        f"childlogdir={layout.logs}",
        f"directory={layout.root}",
        "logfile_maxbytes=20MB",
        "logfile_backups=3",
        "loglevel=info",
        f'environment=PATH="{path}"',
        "",
        "[rpcinterface:supervisor]",
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
        "",
        "[supervisorctl]",
        f"serverurl=unix://{layout.supervisor_socket}",
        "",
    ]
    for program in programs(settings, layout):
        sections += [
            f"[program:{program.name}]",
            f"command={shlex.join(program.command)}",
            f"priority={program.priority}",
            f"directory={layout.root}",
            f"autostart={'true' if program.autostart else 'false'}",
            # Restart like Kubernetes would: whatever the exit code.
            "autorestart=true",
            f"startsecs={program.startsecs}",
            "startretries=5",
            f"stopwaitsecs={program.stopwaitsecs}",
            # Signals go to the whole process group, so children (Airflow's scheduler,
            # api-server, ...) stop with their parent instead of being orphaned.
            "stopasgroup=true",
            "killasgroup=true",
            "redirect_stderr=true",
            f"stdout_logfile={layout.log_file(program.name)}",
            "stdout_logfile_maxbytes=50MB",
            "stdout_logfile_backups=2",
            f"environment={_env_line(program.environment)}",
            "",
        ]
    brokers = [p.name for p in programs(settings, layout) if p.name.startswith("kafka-")]
    sections += [
        # One group, so that shutdown stops the brokers together: stopped one after another,
        # the last broker has no controller quorum left to confirm its controlled shutdown
        # and hangs until SIGKILL.
        "[group:kafka]",
        f"programs={','.join(brokers)}",
        "priority=20",
        "",
    ]
    text = "\n".join(sections)
    if "%" in text:
        # supervisord expands %(name)s in values, program values twice over, so no escaping
        # survives reliably: refuse instead of starting a process with a mangled path.
        raise ValueError(
            "a path or setting contains '%', which supervisord would expand; "
            "choose a TWINSTREAM_STATE_DIR (and repository path) without '%'"
        )
    return text
