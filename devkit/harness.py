"""Drive engines for tests, benchmarks and drills: a private pipeline (its own topics,
election path and transactional id) on a running stack, engine processes started and
stopped by pid, steady load, and the exactly-once audit of the outbound topics."""

from __future__ import annotations

import collections
import contextlib
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from devkit import spares
from twinstream.contract import Pipeline as Contract
from twinstream.core.rows import Output
from twinstream.edge.feed import publish
from twinstream.edge.reader import Record, read_committed
from twinstream.engine.client import EngineClient, EngineError
from twinstream.ops.audit import merge_ranges
from twinstream.platform import registry
from twinstream.platform.kafka import connection, consumer_config, ensure_topics, topic_specs
from twinstream.platform.kafka_auth import Credentials, provision, users
from twinstream.platform.settings import REPO_ROOT, Settings, load_settings
from twinstream.stack.render import ENGINE_KAFKA_ROLE
from twinstream.stack.tls import kafka_superuser_config
from twinstream.testing import reference


def example_pipeline() -> Settings:
    """The pipeline a benchmark or the test stack drives: TWINSTREAM_PIPELINE, else the
    example hostmetrics, as the stack runs it (the environment plus its pipelines-file
    entry). The product has no default pipeline; the developers' kits choose this one."""
    base = load_settings()
    return registry.chosen(base, base.pipeline or "hostmetrics")


def wait_for(
    condition: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.2
) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(every_s)


def wait_gone(pids: set[int], timeout_s: float = 60.0) -> None:
    """A killed engine's JVM exits when its stdin (the dead driver's pipe) closes."""

    def gone() -> bool:
        for pid in pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    return False
        return True

    wait_for(gone, timeout_s, f"processes {sorted(pids)} of a killed engine to exit")


def inbound_ends(settings: Settings, timeout_s: float = 60.0) -> dict[int, int]:
    """Each inbound partition's high watermark (the offset after its last record), asked
    again until `timeout_s` while Kafka does not answer (a partition whose leader was just
    killed has none until the controller moves it)."""
    from twinstream.engine.positions import InboundWatermarks

    deadline = time.monotonic() + timeout_s
    marks = InboundWatermarks(connection(settings), settings.topics(), "chaos")
    try:
        while (highs := marks.highs()) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"Kafka did not say where {settings.inbound_topic} ends within "
                    f"{timeout_s:.0f} s"
                )
            time.sleep(0.6)  # highs() asks at most every 0.5 s
        return highs
    finally:
        marks.close()


def free_port() -> int:
    (port,) = free_ports(1)
    return port


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports: each socket stays bound until all are, or the kernel may
    hand the port it just freed to the next ask (two engines then share an admin port)."""
    with contextlib.ExitStack() as bound:
        socks = [bound.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


@dataclass
class EngineProcess:
    engine_id: str
    url: str
    log_path: Path
    proc: subprocess.Popen[bytes]
    token: str
    tree: set[int] = field(default_factory=set)
    _client: EngineClient | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def dump_threads(self) -> None:
        """Have the engine write every Python thread's stack to its log (SIGUSR1,
        spark_jobs/engine.py), if it still runs: what a stalled engine was doing."""
        if self.proc.poll() is not None:
            return
        before = self.log_path.stat().st_size if self.log_path.exists() else 0
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGUSR1)
        # Written from the signal's handler at once; a moment for it to reach the file
        # before the test's teardown stops the engine (no failure if it does not).
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if self.log_path.exists() and self.log_path.stat().st_size > before:
                break
            time.sleep(0.1)
        self._dump_jvm_threads()

    def _dump_jvm_threads(self) -> None:
        """The engine's JVM's threads too (jcmd Thread.print, where the JDK has it): a
        batch stalled in Spark or its Kafka source shows only there."""
        jcmd = shutil.which("jcmd")
        if jcmd is None:
            return
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.pid).children(recursive=True):
                if child.name() != "java":
                    continue
                with (
                    self.log_path.open("ab") as out,
                    contextlib.suppress(OSError, subprocess.TimeoutExpired),
                ):
                    out.write(f"\n--- jcmd {child.pid} Thread.print ---\n".encode())
                    out.flush()
                    subprocess.run(
                        [jcmd, str(child.pid), "Thread.print"],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        timeout=30,
                        check=False,
                    )

    @property
    def client(self) -> EngineClient:
        """The admin API's one client (twinstream.engine.client), made on first use."""
        if self._client is None:
            self._client = EngineClient(self.engine_id, self.url, self.token, timeout_s=5.0)
        return self._client

    def get(self, path: str) -> dict[str, Any]:
        response = self.client.response("GET", path)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def post(
        self, path: str, body: dict[str, Any] | None = None, timeout_s: float = 120
    ) -> httpx.Response:
        """The raw response: tests look at refusals (409, 422) as much as at successes."""
        return self.client.response("POST", path, json=body, timeout_s=timeout_s)

    def get_text(self, path: str) -> str:
        response = self.client.response("GET", path)
        response.raise_for_status()
        return response.text

    def try_get(self, path: str) -> dict[str, Any] | None:
        try:
            return self.get(path)
        except (httpx.HTTPError, ValueError):
            return None

    def role(self) -> str | None:
        try:
            return self.client.server().role
        except EngineError:
            return None

    def may_commit(self) -> bool:
        """Active with a live ZooKeeper session. An active whose session is SUSPENDED holds
        its commits; if the session expired meanwhile, a successor may already be active,
        and this one steps down as soon as it reconnects and hears LOST."""
        try:
            server = self.client.server()
        except EngineError:
            return False
        return server.role == "active" and server.zk_state == "CONNECTED"

    def remember_tree(self) -> None:
        """Spark's JVM is a child: note it so that stop() can make sure it is gone."""
        with contextlib.suppress(psutil.NoSuchProcess):
            self.tree |= {p.pid for p in psutil.Process(self.pid).children(recursive=True)}
        self.tree.add(self.pid)

    def kill9(self) -> None:
        """SIGKILL, and back once Spark's JVM has exited too: a caller that then deletes the
        engine's folder, as when its disk is lost, raced the JVM still writing into it
        (`Directory not empty` in a persist/restore benchmark)."""
        kill9_at_once([self])

    def terminate(self) -> None:
        """Ask the engine to shut down (SIGTERM, thawed first), without waiting."""
        self.remember_tree()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()

    def stop(self) -> None:
        self.terminate()
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        for pid in self.tree:
            while psutil.pid_exists(pid) and time.monotonic() < deadline:
                try:
                    if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                        break
                except psutil.NoSuchProcess:
                    break
                time.sleep(0.2)
            if psutil.pid_exists(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.close_client()

    def close_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def reached(info: dict[str, Any], ends: dict[int, int], field: str = "processed") -> bool:
    """Whether an engine's GET /pipeline answer (`info`) has processed (or, field=
    "published", knows published) every record below each partition's `ends`. Processed
    counts a partition its query has read to the end (`read_up_to`) too: an engine restarted
    with its checkpoint at the topic's end processes no row again, and its `processed` stays
    empty (the three-engine agreement test waited for ever on such an engine)."""
    got = {int(p): v for p, v in (info.get(field) or {}).items()}
    read = {int(p): v for p, v in (info.get("read_up_to") or {}).items()}
    return all(
        got.get(p, -1) >= end - 1 or (field == "processed" and read.get(p, 0) >= end)
        for p, end in ends.items()
    )


class Load(threading.Thread):
    """`records` to the inbound topic at `rate`/s in the background, until they run out or
    `stop()` is called; `sent` counts the records handed to the producer (each one
    acknowledged, or the load fails and says so in `errors`)."""

    def __init__(
        self,
        settings: Settings,
        records: Iterable[bytes | None],
        rate: float,
        name: str,
        key_field: str | None = None,
        planned: int | None = None,
    ) -> None:
        """`planned`: how many records `records` yields, when known (Pipeline.load's
        count): it may then be a generator, never held in memory whole."""
        super().__init__(name=name, daemon=True)
        self.settings = settings
        self.key_field = key_field
        self.records = records
        self.planned = planned
        self.rate = rate
        self.sent = 0
        self.errors: list[BaseException] = []
        self._stopping = threading.Event()
        self.start()

    def stop(self) -> None:
        """Send nothing more; what was sent is still flushed and acknowledged."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        """Whether stop() was called."""
        return self._stopping.is_set()

    def _until_stopped(self) -> Iterator[bytes | None]:
        for record in self.records:
            if self._stopping.is_set():
                return
            self.sent += 1
            yield record

    def run(self) -> None:
        try:
            publish(self.settings, self._until_stopped(), rate=self.rate, key_field=self.key_field)
        except BaseException as exc:  # reported by Pipeline.join_load
            self.errors.append(exc)


# Enough for every engine's first micro-batch with data to have run (see warm_up).
WARM_UP_RECORDS = 200


T = TypeVar("T")


def _with_env(env: Mapping[str, str], make: Callable[[], T]) -> T:
    """make(), with `env` over the process's environment meanwhile."""
    saved = dict(os.environ)
    try:
        os.environ.update(env)
        return make()
    finally:
        os.environ.clear()
        os.environ.update(saved)


class Pipeline:
    """A pipeline of its own on the shared stack, with engines the test controls."""

    def __init__(
        self,
        base_env: dict[str, str],
        workdir: Path,
        engine_ids: tuple[str, ...] = ("a", "b"),
        module: str = "pipelines.hostmetrics.pipeline",
        partitions: int = 1,
        env: Mapping[str, str] | None = None,
        warm_spares: bool = True,
    ) -> None:
        """`module`: the contract pipeline the engines run (module[:attribute]), under a
        name of its own, so that its topics and znodes are this test's alone; its topics
        have `partitions` partitions (records keyed by the pipeline's `partition_by`).
        `env`: TWINSTREAM_* settings of this pipeline's own, over the rest. `warm_spares`:
        whether its engines may start from the session's warm spares (devkit/spares.py);
        False for a pipeline that reads what a spare's session keeps as its own (the Spark
        application's name)."""
        self.warm_spares = warm_spares
        self.name = f"t{uuid.uuid4().hex[:8]}"
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.ports = dict(zip(engine_ids, free_ports(len(engine_ids)), strict=True))
        # ZooKeeper knows one SASL user, the stack's (its jaas.conf): every pipeline's
        # engines log in as it, whatever their own state folder.
        stack = _with_env(base_env, load_settings)
        zk_password = base_env.get("TWINSTREAM_ZK_PASSWORD") or stack.secret("zk_password")
        self.env = {
            **base_env,
            "TWINSTREAM_PIPELINE": self.name,
            "TWINSTREAM_PIPELINE_MODULE": module,
            "TWINSTREAM_ENGINE_IDS": ",".join(engine_ids),
            "TWINSTREAM_ENGINE_ADMIN_PORTS": ",".join(str(self.ports[e]) for e in engine_ids),
            "TWINSTREAM_STATE_DIR": str(workdir),
            # A token of this pipeline's engines only.
            "TWINSTREAM_ADMIN_TOKEN": secrets.token_urlsafe(16),
            "TWINSTREAM_ZK_PASSWORD": zk_password,
            "TWINSTREAM_MAX_RECORD_BYTES": "4096",
            "TWINSTREAM_PARTITIONS": str(partitions),
            # The stack's Kafka CA and credentials (its state folder, not this pipeline's),
            # where `up` and this harness keep every pipeline's users.
            "TWINSTREAM_KAFKA_CREDENTIALS_FILE": str(stack.kafka_credentials_path),
            "TWINSTREAM_KAFKA_TLS_CAFILE": str(stack.kafka_ca_path),
            "PYSPARK_PYTHON": sys.executable,
            **(env or {}),
        }
        self.settings = self._settings()
        self.contract: Contract = registry.load(self.settings)
        # As `up` provisions the stack's own pipelines: the stack's identity over the brokers'
        # mutual-TLS listeners (kafka_superuser_config), no SCRAM login. In full runs the
        # broker the chaos tests had killed refused the admin's SCRAM login for minutes
        # after its restart, and this setup failed ("invalid credentials", then "Failed
        # while waiting for controller").
        admin = AdminClient(kafka_superuser_config(stack))
        ensure_topics(admin, topic_specs(self.settings))
        if self.settings.kafka_security:
            # This pipeline's users and ACLs, as `up` makes them for the stack's.
            creds, _ = Credentials.ensure(self.settings.kafka_credentials_path, users([self.name]))
            provision(admin, [self.settings], creds)
        self.engines: dict[str, EngineProcess] = {}
        self.produced = 0  # records sent to the inbound topic so far
        self.started = 0  # engine processes started so far

    def _settings(self, **extra: str) -> Settings:
        return _with_env({**self.env, **extra}, load_settings)

    def start(self, engine_id: str, **env: str) -> EngineProcess:
        earlier = self.engines.get(engine_id)
        if earlier is not None and earlier.proc.poll() is None:
            # Two processes under one engine id share a checkpoint and an admin port: the
            # second fails in ways that look like the engine's fault, the first is orphaned.
            raise AssertionError(
                f"engine {engine_id} is still running (pid {earlier.pid}): stop() or kill9() "
                "it before starting it again"
            )
        self.started += 1  # a restarted engine writes a new log, next to its earlier ones
        log_path = self.workdir / f"engine-{engine_id}-{self.started}.log"
        # As the pipeline's engine user, as the stack runs its engines.
        environment = {**os.environ, **self.env, **ENGINE_KAFKA_ROLE, **env}
        url = f"http://127.0.0.1:{self.ports[engine_id]}"
        token = self.env["TWINSTREAM_ADMIN_TOKEN"]
        warm = (
            spares.POOL.take(engine_id, environment)
            if spares.POOL is not None and self.warm_spares
            else None
        )
        if warm is not None:
            # The spare's own log, found where the engine's would be.
            log_path.symlink_to(warm.log_path)
            engine = EngineProcess(engine_id, url, log_path, warm.proc, token)
            self.engines[engine_id] = engine
            return engine
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    str(REPO_ROOT / "spark_jobs" / "engine.py"),
                    "--engine-id",
                    engine_id,
                ],
                env=environment,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        engine = EngineProcess(engine_id, url, log_path, proc, token)
        self.engines[engine_id] = engine
        return engine

    def wait_running(self, *engines: EngineProcess, timeout_s: float = 120) -> None:
        for engine in engines:

            def ready(e: EngineProcess = engine) -> bool:
                if e.proc.poll() is not None:
                    raise AssertionError(f"engine {e.engine_id} exited; see {e.log_path}")
                info = e.try_get("/pipeline")
                return bool(
                    info and info["state"] == "running" and e.role() in ("active", "standby")
                )

            wait_for(ready, timeout_s, f"engine {engine.engine_id} running")
            engine.remember_tree()

    def active(self) -> EngineProcess | None:
        actives = [e for e in self.engines.values() if e.proc.poll() is None and e.may_commit()]
        assert len(actives) <= 1, f"two actives: {[e.engine_id for e in actives]}"
        return actives[0] if actives else None

    def start_pair(
        self, active_env: dict[str, str] | None = None, standby_env: dict[str, str] | None = None
    ) -> tuple[EngineProcess, EngineProcess]:
        """(active, standby), both warmed up. With one environment for both, `a` and `b`
        start at once and either may win: the second JVM's start no longer waits for the
        first's. With two, `a` starts first and wins, then `b` starts as its standby; `a`
        computes its warm-up records meanwhile (on two cores a new engine's first batch
        and a JVM's start take several seconds each)."""
        if (active_env or {}) == (standby_env or {}):
            engines = [self.start(e, **(active_env or {})) for e in ("a", "b")]
            self.wait_running(*engines)
            # Both JVMs' first batches share two cores: up to a minute with three partitions
            # over TLS.
            active: EngineProcess = wait_for(self.active, 90, "one engine active")
            (standby,) = [e for e in engines if e is not active]
            assert standby.role() == "standby", standby.role()
            self.warm_up(active, standby)
            return active, standby
        a = self.start("a", **(active_env or {}))
        self.wait_running(a)
        wait_for(lambda: a.role() == "active", 30, "engine a active")
        self.join_load(self.load(WARM_UP_RECORDS, rate=0))
        b = self.start("b", **(standby_env or {}))
        self.wait_running(b)
        assert b.role() == "standby", b.role()
        self.wait_processed(self.produced - 1, a, b)
        return a, b

    def stop_all(self) -> None:
        # Every engine told at once, then each awaited: a shutdown (the batch in flight,
        # ZooKeeper, Spark) takes seconds, and one after the other added them up.
        for engine in self.engines.values():
            engine.terminate()
        for engine in self.engines.values():
            engine.stop()

    def discard(self) -> None:
        """The end of a test whose scenario is over: every engine killed at once (SIGKILL),
        and back once each JVM has gone. A graceful stop waits for the batch in flight, the
        election and Spark's shutdown, 2-17 s a test, and asserts nothing there: a clean
        stop is tested where it is the point (the stack's `down` in tests/integration/test_stack.py,
        an engine's close in tests/unit/engine/test_app.py)."""
        engines = [e for e in self.engines.values() if e.proc.poll() is None]
        for engine in engines:
            engine.remember_tree()
            with contextlib.suppress(ProcessLookupError):
                os.kill(engine.pid, signal.SIGKILL)
        for engine in self.engines.values():
            engine.proc.wait(timeout=30)
            wait_gone(engine.tree)
            engine.close_client()

    def load(self, count: int, rate: float, **kwargs: Any) -> Load:
        """Publish `count` example records at `rate`/s in the background: the hostmetrics
        generator's (kwargs: hosts, seed, start, broken_every), or the pipeline's sample."""
        if self.contract.name == "hostmetrics":
            from pipelines.hostmetrics.generate import synthetic

            records: Iterable[bytes] = synthetic(
                count, max_record_bytes=self.settings.max_record_bytes, **kwargs
            )
        elif self.contract.sample is not None:
            records = self.contract.sample(
                count, int(kwargs.get("seed", 1)), int(kwargs.get("broken_every", 0))
            )
        else:
            raise AssertionError(f"pipeline {self.contract.name} declares no sample: use send()")
        # Generated as they are sent: a load "longer than the scenario" (10**6 records,
        # stopped with stop_load) cost 11 s of a core to build as a list first.
        return self._publish(records, count, rate)

    def send(self, records: list[bytes | None], rate: float) -> Load:
        """Publish these records at `rate`/s in the background (None: a tombstone); with
        several partitions, keyed by the pipeline's `partition_by`."""
        return self._publish(records, len(records), rate)

    def _publish(self, records: Iterable[bytes | None], count: int, rate: float) -> Load:
        self.produced += count
        key = self.contract.partition_by if self.settings.partitions > 1 else None
        return Load(self.settings, records, rate, f"load-{self.name}", key, planned=count)

    def stop_load(self, load: Load, timeout_s: float = 120) -> None:
        """End a load early, once the scenario no longer needs input: `produced` counts
        only what it sent. A test waits for what it needs, not for a fixed amount."""
        load.stop()
        self.join_load(load, timeout_s)
        assert load.planned is not None, "stop_load ends a load this pipeline started"
        self.produced -= load.planned - load.sent

    def warm_up(
        self, *engines: EngineProcess, count: int = WARM_UP_RECORDS, timeout_s: float = 180
    ) -> None:
        """Send a few records and wait until every engine has processed them: a new query's
        first micro-batch with data (JIT, Python workers, RocksDB) takes many seconds on two
        cores, and a test must not mistake that for the behaviour it measures."""
        self.join_load(self.load(count, rate=0))
        if self.settings.partitions > 1:
            self.wait_caught_up(*engines, timeout_s=timeout_s)
        else:
            self.wait_processed(self.produced - 1, *engines, timeout_s=timeout_s)

    def inbound_ends(self) -> dict[int, int]:
        """Each inbound partition's high watermark (the offset after its last record)."""
        return inbound_ends(self.settings)

    def wait_caught_up(
        self, *engines: EngineProcess, field: str = "processed", timeout_s: float = 180
    ) -> None:
        """Wait until each engine has processed (or, field="published", knows published)
        every record the inbound partitions hold now (`reached`)."""
        ends = {p: end for p, end in self.inbound_ends().items() if end > 0}
        for engine in engines:

            def caught_up(e: EngineProcess = engine) -> bool:
                return reached(e.try_get("/pipeline") or {}, ends, field)

            try:
                wait_for(caught_up, timeout_s, f"engine {engine.engine_id}: {field} {ends}", 0.5)
            except AssertionError as exc:
                for each in engines:
                    each.dump_threads()
                raise AssertionError(
                    f"{exc} (each engine's Python threads are at the end of its log: "
                    f"{', '.join(str(e.log_path) for e in engines)})"
                ) from None

    @staticmethod
    def wait_processed(last: int, *engines: EngineProcess, timeout_s: float = 180) -> None:
        for engine in engines:

            def caught_up(e: EngineProcess = engine) -> bool:
                info = e.try_get("/pipeline") or {}
                return (info.get("last_msg_id_processed") or -1) >= last

            wait_for(caught_up, timeout_s, f"engine {engine.engine_id} warmed up", every_s=0.5)

    @staticmethod
    def join_load(load: Load, timeout_s: float = 300) -> None:
        load.join(timeout_s)
        if load.is_alive():
            raise AssertionError("load did not finish")
        if load.errors:
            raise AssertionError(f"load failed: {load.errors}")
        # A load that ran out on its own sent all it planned (`produced` counts them).
        if load.planned is not None and not load.stopping and load.sent != load.planned:
            raise AssertionError(f"load sent {load.sent} records of the {load.planned} planned")

    def outputs(self) -> list[Record]:
        """The outbound and dead-letter topics, every partition."""
        s = self.settings
        return [
            *read_committed(s, s.outbound_topic, partition=None),
            *read_committed(s, s.dlq_topic, partition=None),
        ]

    def progress(self) -> list[Record]:
        return list(read_committed(self.settings, self.settings.progress_topic, partition=None))

    def inbound(self) -> list[Record]:
        return list(read_committed(self.settings, self.settings.inbound_topic, partition=None))

    def wait_published(self, last_msg_id: int, timeout_s: float = 120) -> None:
        def done() -> bool:
            active = self.active()
            if active is None:
                return False
            published = active.get("/pipeline")["last_msg_id_published"]
            return published is not None and published >= last_msg_id

        wait_for(done, timeout_s, f"msg_id {last_msg_id} published", every_s=0.5)

    def reference(self) -> dict[int, list[Output]]:
        """msg_id -> the rows a reference run of the same pipeline gives it (none: the
        record had no output), over what the inbound topic holds now."""
        return {offset: rows for (_, offset), rows in self.reference_by_position().items()}

    def reference_by_position(
        self, exclude: Collection[tuple[int, int]] = ()
    ) -> dict[tuple[int, int], list[Output]]:
        """(partition, msg_id) -> the rows a reference run gives the record, over what
        every partition of the inbound topic holds now but the (partition, offset)s
        `exclude` names (quarantined records: they reach no transform)."""
        inbound = [r for r in self.inbound() if (r.partition, r.offset) not in exclude]
        records = [(r.offset, None if r.tombstone else r.raw) for r in inbound]
        expected: dict[tuple[int, int], list[Output]] = {
            (r.partition, r.offset): [] for r in inbound
        }
        # One batch: the engines batched the same records their own ways, so a match is
        # still a match across batch boundaries, and a reference batch costs about a
        # second of Spark each (tests/integration/test_contract.py runs several).
        partitions = [r.partition for r in inbound] if self.settings.partitions > 1 else None
        for row in reference.run(
            self.contract, records, self.settings, batches=1, partitions=partitions
        ):
            if row.kind != "none":
                expected[row.position].append(row)
        return expected


def coverage(progress: Iterable[Record], end: int) -> tuple[list[int], list[int]]:
    """(missing, duplicated) msg_ids below `end` by the progress records' ranges: every
    inbound offset must be in exactly one published transaction's range."""
    import json

    counts: collections.Counter[int] = collections.Counter()
    for record in progress:
        span = json.loads(record.value)
        counts.update(range(int(span["first"]), int(span["last"]) + 1))
    missing = [i for i in range(end) if counts[i] == 0]
    return missing, sorted(i for i, c in counts.items() if c > 1)


@dataclass
class Audit:
    counts: collections.Counter[int]
    expected: int

    @property
    def missing(self) -> list[int]:
        return [i for i in range(self.expected) if self.counts[i] == 0]

    @property
    def duplicated(self) -> list[int]:
        return sorted(i for i, c in self.counts.items() if c > 1)


def audit(records: list[Record], expected: int) -> Audit:
    return Audit(collections.Counter(r.msg_id for r in records if r.msg_id is not None), expected)


# The tests' and benchmarks' name for the audit's range merging.
ranges = merge_ranges


def stack_env() -> dict[str, str]:
    """The stack's own TWINSTREAM_* settings: the base of every benchmark's pipeline. Not a
    pipeline's env: its TWINSTREAM_STATE_DIR is that pipeline's folder, where Pipeline would
    look for the stack's Kafka CA and fail."""
    return {k: v for k, v in os.environ.items() if k.startswith("TWINSTREAM_")}


@contextlib.contextmanager
def bench_pipeline(prefix: str, pause_stack: bool = True) -> Iterator[Pipeline]:
    """A pipeline of its own on the running local stack (`make up`), for a benchmark. With
    `pause_stack` the stack's own engines are stopped meanwhile, so that the two cores go to
    the engines measured, and started again afterwards; without it they keep running idle
    beside them, as a user's other pipelines would (~0.2 of a core on `make up`)."""
    from twinstream.stack.layout import Layout
    from twinstream.stack.supervisor import Supervisor

    settings = load_settings()
    supervisor = Supervisor(Layout.of(settings))
    if not supervisor.is_running():
        raise SystemExit("the local stack is not running: start it with `make up`")
    # Every pipeline's engines: the others' idle JVMs would take the measured ones' cores.
    paused = [f"engine-{e}" for e in registry.engines(settings)] if pause_stack else []
    for name in paused:
        supervisor.stop(name)
    pipeline = Pipeline(stack_env(), Path(tempfile.mkdtemp(prefix=prefix)))
    try:
        yield pipeline
    finally:
        pipeline.stop_all()
        for name in paused:
            supervisor.start(name)


class OutputSampler(threading.Thread):
    """Records committed to the outbound and dead-letter topics over time, from their
    high watermarks every `every_s` (a transactional batch adds one marker offset; the
    benchmarks' batches are thousands of records, so the count is within a fraction of a
    percent)."""

    def __init__(self, settings: Settings, topics: Iterable[str], every_s: float = 0.5) -> None:
        super().__init__(daemon=True, name="output-sampler")
        self.settings = settings
        self.topics = list(topics)
        self.every_s = every_s
        self._consumer = Consumer(consumer_config(settings, f"twinstream-sampler-{uuid.uuid4()}"))
        # Every partition of each topic.
        self._partitions = [
            TopicPartition(t, p)
            for t in self.topics
            for p in sorted(self._consumer.list_topics(t, timeout=15).topics[t].partitions)
        ]
        self.base = self._count()
        self.samples: list[tuple[float, int]] = []  # (monotonic time, records since start)
        self._stop_event = threading.Event()
        self.start()

    def _count(self) -> int:
        return sum(
            self._consumer.get_watermark_offsets(tp, timeout=15)[1] for tp in self._partitions
        )

    def run(self) -> None:
        try:
            while not self._stop_event.is_set():
                # A partition's leader moving (a starved broker) is a missed sample, not the
                # end of sampling: bench.seconds' plot lost its last half hour to one.
                with contextlib.suppress(KafkaException):
                    self.samples.append((time.monotonic(), self._count() - self.base))
                self._stop_event.wait(self.every_s)
        finally:
            self._consumer.close()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(30)

    @property
    def latest(self) -> int:
        return self.samples[-1][1] if self.samples else 0

    def drain_rate(self, total: int) -> tuple[float, float]:
        return drain_rate(self.samples, total)


def drain_rate(samples: Iterable[tuple[float, int]], total: int) -> tuple[float, float]:
    """(events/s, seconds) from the first sample with output to the first with `total`:
    what draining a backlog costs once the query runs, without its start-up."""
    samples = list(samples)
    first = next(((t, n) for t, n in samples if n > 0), None)
    end = next((t for t, n in samples if n >= total), None)
    if first is None or end is None or end <= first[0]:
        raise ValueError(f"the samples do not cover a drain of {total} outputs: {samples[-3:]}")
    return (total - first[1]) / (end - first[0]), end - first[0]


def machine() -> str:
    """The machine a benchmark ran on, for its figures."""
    import platform

    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = psutil.virtual_memory().total / 2**30
    return (
        f"{os.cpu_count()} cores ({model or platform.machine()}), {memory:.0f} GiB, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}"
    )


class VisibleTimes:
    """(partition, msg_id) -> wall-clock time its output became visible to a
    read_committed consumer of the outbound and dead-letter topics (from their ends when
    created). Output partition = inbound partition, so the pair names the inbound record."""

    def __init__(self, settings: Settings) -> None:
        from twinstream.platform.kafka import partition_ends

        self.settings = settings
        self.seen: dict[tuple[int, int], float] = {}
        self._done = threading.Event()
        self._starts = {
            t: partition_ends(settings, t) for t in (settings.outbound_topic, settings.dlq_topic)
        }
        self._threads = [
            threading.Thread(target=self._follow, args=(t,), daemon=True) for t in self._starts
        ]
        for thread in self._threads:
            thread.start()

    def _follow(self, topic: str) -> None:
        offsets = dict(self._starts[topic])
        while not self._done.is_set():
            # Short idle timeouts: the loop notices stop() even while no output arrives.
            for record in read_committed(self.settings, topic, offsets, 2.0, follow=True):
                if record.msg_id is not None:
                    self.seen.setdefault((record.partition, record.msg_id), time.time())
                offsets[record.partition] = record.offset + 1

    def stop(self) -> None:
        self._done.set()
        for thread in self._threads:
            thread.join(10)

    def has(self, ends: Mapping[int, int]) -> bool:
        """Whether the output of each partition's last record before `ends` is visible
        (partitions with nothing yet, end 0, need none)."""
        return all((p, end - 1) in self.seen for p, end in ends.items() if end > 0)

    def latencies(
        self, firsts: Mapping[int, int], ends: Mapping[int, int], since_ms: int = 0
    ) -> dict[tuple[int, int], float]:
        """(partition, msg_id) -> seconds from the inbound record's timestamp (set by the
        producer) to its output being visible, for each partition's records from `firsts`
        to `ends` that were seen, leaving out those produced before `since_ms`."""
        inbound = read_committed(
            self.settings,
            self.settings.inbound_topic,
            {p: firsts.get(p, 0) for p in ends},
            max_records=sum(end - firsts.get(p, 0) for p, end in ends.items()),
            partition=None,
        )
        return {
            (r.partition, r.offset): self.seen[(r.partition, r.offset)] - r.timestamp_ms / 1000
            for r in inbound
            if r.offset < ends[r.partition]
            and r.timestamp_ms >= since_ms
            and (r.partition, r.offset) in self.seen
        }


def summary(values: list[float]) -> dict[str, Any]:
    """A benchmark figure over rounds: count, median, p99 (the worst below 100 rounds),
    worst, and every value in round order."""
    ordered = sorted(values)
    return {
        "n": len(values),
        "median": round(statistics.median(ordered), 3),
        "p99": round(percentile(ordered, 0.99), 3),
        "worst": round(ordered[-1], 3),
        "all": [round(v, 3) for v in values],
    }


def percentile(values: Iterable[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def kill9_at_once(engines: Sequence[EngineProcess]) -> None:
    """SIGKILL to every one of `engines` before waiting for any, then back once each and its
    JVM have exited. Killed one after the other, the second could take over in between: the
    first one's wait for its JVM's exit took long enough on two busy cores for the second's
    election to see the first one's session end, and a double kill became two kills."""
    for engine in engines:
        engine.remember_tree()
    for engine in engines:
        os.kill(engine.pid, signal.SIGKILL)
    for engine in engines:
        engine.proc.wait(timeout=30)
        wait_gone(engine.tree)
