"""Spark 4.3's real-time mode (RTM) on this machine: latency of a stateless JVM-only
query Kafka -> Kafka, the same query in micro-batch mode, and what Twinstream's engines
need that RTM refuses (issue 35, point 6).

    .venv/bin/python -m bench.realtime --rate 1000 --seconds 60

Needs no stack: it starts a private single-node KRaft broker (PLAINTEXT, no security) on
free ports of its own, from the jars `make install` fetched (.twinstream/jars/kafka), in a
temporary folder, and stops it by pid at the end. Spark runs in this process, `local[2]`,
with the project's Kafka connector jars.

1. Latency, RTM and micro-batch one after the other, each on topics of its own (one
   partition): a producer sends `--rate` JSON events a second for `--seconds`, each
   carrying its send time (wall clock, ms); the query parses them with `from_json`,
   projects and writes them as JSON to the output topic; a consumer (read_committed,
   fetch.wait.max.ms 5) notes when each becomes visible. Latency = visible - sent, same
   machine and clock. The first `--skip` seconds of each run are left out (JIT, first
   batch). RTM: `trigger(realTime="5 seconds")` (the minimum batch; Spark's
   `spark.sql.streaming.realTimeMode.minBatchDuration`, 5,000 ms); micro-batch:
   `trigger(processingTime=...)` at the engines' default trigger interval (250 ms).
   When java/rtm-gate's jar is built (`mvn -B -s java/settings.xml -f java/rtm-gate/pom.xml
   package -Dtwinstream.jars=$PWD/.twinstream/jars`), a third query: RTM into GateWriter,
   the gate as a JVM ForeachWriter (a transaction per inbound partition committed every
   50 ms, read_committed output), then its guarantees tried: a stop mid-batch and a restart
   with its JVM state forgotten (every input exactly once in the output?), and the epoch
   moved (the query must fail, nothing after the move visible).
2. What the engines need, each tried in RTM on a fresh checkpoint while a probe load runs:
   a pandas UDF, an Arrow-optimised Python UDF, a plain Python UDF, `foreachBatch`, a
   Python `ForeachWriter`, `transformWithStateInPandas`, a union of the source with itself,
   the Kafka sink with `kafka.transactional.id` (Spark's Kafka sink has no transactions),
   and `dropDuplicates` (JVM state, in RTM's allowlist). For each: the exact error Spark
   gives, or that it ran (rows out, and for the Python ForeachWriter when Spark opened and
   closed it and with which epoch ids: when a transactional writer could commit).

Prints the figures, writes docs/bench/realtime.json (the write-up: docs/profile.md, "The
real-time tier (issue 35, point 6), measured").
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import psutil
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bench.plots import write_figures
from devkit.harness import free_ports, machine, percentile, wait_for
from devkit.services import LocalServices
from twinstream.engine.spark import kafka_jars, session, stop_session
from twinstream.platform.settings import REPO_ROOT, Settings, load_settings
from twinstream.stack.render import KAFKA_MAIN, KAFKA_STORAGE_TOOL, java_command

BROKER_PIDS: set[int] = set()
RTM_BATCH = "5 seconds"  # spark.sql.streaming.realTimeMode.minBatchDuration: 5000 ms
ALLOWLIST_CHECK = "spark.sql.streaming.realTimeMode.allowlistCheck"
SCHEMA = "msg_id BIGINT, host STRING, cpu_user DOUBLE, sent_ms DOUBLE"


class PrivateKafka(LocalServices):
    """One KRaft node (broker and controller), PLAINTEXT on free ports, in `folder`."""

    def __init__(self, settings: Settings, folder: Path) -> None:
        super().__init__()
        self.settings = settings
        self.folder = folder
        self.port, self.controller_port = free_ports(2)
        self._admin: AdminClient | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        properties = self.folder / "server.properties"
        log4j = self.folder / "log4j2.properties"
        properties.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port},"
                    f"CONTROLLER://127.0.0.1:{self.controller_port}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    "controller.listener.names=CONTROLLER",
                    "inter.broker.listener.name=PLAINTEXT",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                    f"log.dirs={self.folder / 'data'}",
                    "num.partitions=1",
                    "offsets.topic.replication.factor=1",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "auto.create.topics.enable=false",
                    "group.initial.rebalance.delay.ms=0",
                    "",
                ]
            )
        )
        log4j.write_text(
            "status = warn\nappender.out.type = Console\nappender.out.name = STDOUT\n"
            "appender.out.layout.type = PatternLayout\n"
            "appender.out.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = WARN\nrootLogger.appenderRef.out.ref = STDOUT\n"
        )
        classpath = self.settings.jars_dir / "kafka"
        props = {"log4j2.configurationFile": str(log4j)}
        subprocess.run(
            java_command(
                KAFKA_STORAGE_TOOL,
                classpath,
                "256m",
                ["format", "-t", uuid.uuid4().hex[:22], "-c", str(properties)],
                props,
            ),
            check=True,
            capture_output=True,
        )
        broker = self.spawn(
            java_command(KAFKA_MAIN, classpath, "512m", [str(properties)], props),
            self.folder / "kafka.log",
        )
        BROKER_PIDS.add(broker.pid)
        admin = self.admin()

        def answers() -> bool:
            try:
                return bool(admin.list_topics(timeout=2).brokers)
            except Exception:  # not up yet: any client error
                return False

        wait_for(answers, 90, f"the private broker on {self.bootstrap}", every_s=0.5)

    def admin(self) -> AdminClient:
        """One client for the run (a client dropped before its futures end aborts them);
        quiet while the broker starts (its refused connections are expected)."""
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 2})
        return self._admin

    def create_topics(self, *names: str) -> None:
        futures = self.admin().create_topics(
            [NewTopic(n, num_partitions=1, replication_factor=1) for n in names]
        )
        for future in futures.values():
            future.result(30)


class Load(threading.Thread):
    """`rate` JSON events a second into `topic` until stopped (or `count` sent), each with
    its wall-clock send time in ms (`sent_ms`)."""

    def __init__(
        self, bootstrap: str, topic: str, rate: float, count: int | None = None, first: int = 0
    ) -> None:
        super().__init__(daemon=True)
        self.first = first
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
        self.topic, self.rate, self.count = topic, rate, count
        self.sent = 0
        self._halt = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        while not self._halt.is_set() and (self.count is None or self.sent < self.count):
            due = int((time.monotonic() - started) * self.rate) + 1
            while self.sent < due and (self.count is None or self.sent < self.count):
                i = self.sent
                doc = {
                    "msg_id": self.first + i,
                    "host": f"host-{i % 100}",
                    "cpu_user": (i % 1000) / 10,
                    "sent_ms": time.time() * 1000,
                }
                self.producer.produce(self.topic, json.dumps(doc).encode())
                self.sent += 1
            self.producer.poll(0)
            time.sleep(0.002)
        self.producer.flush(30)

    def stop(self) -> None:
        self._halt.set()
        self.join(60)


class Visible(threading.Thread):
    """Follows `topic` from its start: msg_id -> (sent_ms, visible_ms)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"realtime-bench-{uuid.uuid4()}",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                # Kafka answers a fetch at once when data is there; with none it waits up
                # to this long: the default (500 ms) would add to the latency measured.
                "fetch.wait.max.ms": 5,
            }
        )
        self.consumer.subscribe([topic])
        self.seen: dict[int, tuple[float, float]] = {}
        # msg_id -> the output record's timestamp: when Spark's Kafka producer created it.
        self.written: dict[int, float] = {}
        self.records = 0  # every record read, duplicates included
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            for message in self.consumer.consume(500, timeout=0.1):
                now = time.time() * 1000
                if message.error() is not None:
                    continue
                doc = json.loads(message.value() or b"{}")
                self.records += 1
                self.seen.setdefault(int(doc["msg_id"]), (float(doc["sent_ms"]), now))
                self.written.setdefault(int(doc["msg_id"]), float(message.timestamp()[1]))
        self.consumer.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(30)


def spark_cpu_s() -> float:
    """CPU seconds (user + system) of this process's children: Spark's JVM, its Python
    workers. The broker is not a child of this process's (LocalServices spawns it too,
    so it is left out by pid)."""
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        if child.pid in BROKER_PIDS:
            continue
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def figures_of(visible: Visible, since_ms: float, sent: int) -> dict[str, Any]:
    seen = visible.seen
    latencies = [v - s for s, v in seen.values() if s >= since_ms]
    if not latencies:
        return {"measured": 0, "sent": sent, "visible": len(seen)}
    # Where the time goes: send -> Spark's producer writes the output record (its Kafka
    # timestamp, CreateTime), then -> visible to the consumer.
    to_sink = [visible.written[m] - s for m, (s, _) in seen.items() if s >= since_ms]
    # Latency over the run, per 10 s of send time: a query falling behind shows as a rise.
    slices: dict[int, list[float]] = {}
    for s, v in seen.values():
        if s >= since_ms:
            slices.setdefault(int((s - since_ms) // 10_000), []).append(v - s)
    # Does Spark write the outputs as they come, or in bursts? The longest pauses between
    # consecutive output records' creation times, while the input arrived every ms.
    written = sorted(visible.written[m] for m, (s, _) in seen.items() if s >= since_ms)
    gaps = sorted((b - a for a, b in itertools.pairwise(written)), reverse=True)
    return {
        "p50_ms_per_10s": [round(percentile(v, 0.5)) for _, v in sorted(slices.items())],
        "p99_ms_per_10s": [round(percentile(v, 0.99)) for _, v in sorted(slices.items())],
        "longest_write_pauses_ms": [round(g) for g in gaps[:5]],
        "send_to_sink_p50_ms": round(percentile(to_sink, 0.50), 1),
        "send_to_sink_p99_ms": round(percentile(to_sink, 0.99), 1),
        "p50_ms": round(percentile(latencies, 0.50), 1),
        "p90_ms": round(percentile(latencies, 0.90), 1),
        "p99_ms": round(percentile(latencies, 0.99), 1),
        "max_ms": round(max(latencies), 1),
        "measured": len(latencies),
        "sent": sent,
        "visible": len(seen),
    }


def parsed(spark: Any, bootstrap: str, topic: str) -> Any:
    """The inbound topic's JSON, parsed in the JVM (from_json), from its start."""
    from pyspark.sql import functions as F

    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("e"))
        .select("e.*")
        .where(F.col("msg_id").isNotNull())
    )


def as_kafka(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.select(
        F.col("host").alias("key"),
        F.to_json(F.struct("msg_id", "host", "cpu_user", "sent_ms")).alias("value"),
    )


def to_kafka(df: Any, bootstrap: str, topic: str, checkpoint: Path, **options: str) -> Any:
    writer = (
        as_kafka(df)
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
        .option("checkpointLocation", str(checkpoint))
    )
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer


def rtm(writer: Any) -> Any:
    return writer.outputMode("update").trigger(realTime=RTM_BATCH)


def measure(
    kafka: PrivateKafka,
    name: str,
    start: Callable[[str, str], Any],
    rate: float,
    seconds: float,
    skip_s: float,
) -> dict[str, Any]:
    """Start the query (`start(inbound, outbound)`), then `rate` events/s for `seconds`;
    latency of those sent after the first `skip_s` seconds."""
    inbound, outbound = f"{name}.in", f"{name}.out"
    kafka.create_topics(inbound, outbound)
    query = start(inbound, outbound)
    visible = Visible(kafka.bootstrap, outbound)
    visible.start()
    # A first record through, so that the start-up (first batch, codegen) is not measured.
    Load(kafka.bootstrap, inbound, 10, count=1, first=-1).run()
    wait_for(lambda: len(visible.seen) >= 1, 180, f"{name}: the query's first output")
    print(f"{name}: {rate:,.0f} events/s for {seconds:.0f} s", flush=True)
    load = Load(kafka.bootstrap, inbound, rate, count=int(rate * seconds))
    since_ms = time.time() * 1000 + 1000 * skip_s
    load_before = os.getloadavg()[0]
    cpu_before = spark_cpu_s()
    started = time.monotonic()
    load.start()
    load.join(seconds + 120)
    sent_s = time.monotonic() - started
    cores = (spark_cpu_s() - cpu_before) / sent_s
    try:
        wait_for(lambda: len(visible.seen) > load.sent, 60, f"{name}: every record visible")
    except Exception as exc:  # reported in the figures
        print(f"{name}: {exc}", flush=True)
    visible.stop()
    error = query.exception()
    query.stop()
    figures = {
        **figures_of(visible, since_ms, load.sent + 1),
        "rate_achieved": round(load.sent / sent_s),
        # CPU of Spark's JVM (and its Python workers) while the load ran, in cores: what
        # the mode costs whatever else the shared machine runs.
        "spark_cores": round(cores, 2),
        # The machine is shared: its 1-minute load average before and after the run.
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "query_error": None if error is None else str(error)[:500],
    }
    print(f"{name}: {json.dumps(figures)}", flush=True)
    return figures


class PyWriter:
    """A Python ForeachWriter: notes its open/close calls (epoch ids, times) and each row's
    latency in a file per partition and epoch (it runs in Spark's Python worker)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.lines: list[str] = []
        self.name = ""

    def open(self, partition_id: int, epoch_id: int) -> bool:
        self.name = f"{self.folder}/p{partition_id}-e{epoch_id}-{uuid.uuid4().hex[:6]}"
        self.lines = [json.dumps({"open": time.time() * 1000, "epoch": epoch_id})]
        return True

    def process(self, row: Any) -> None:
        self.lines.append(json.dumps({"sent": row.sent_ms, "seen": time.time() * 1000}))

    def close(self, error: BaseException | None) -> None:
        self.lines.append(json.dumps({"close": time.time() * 1000, "error": repr(error)}))
        Path(self.name).write_text("\n".join(self.lines) + "\n")


def writer_report(folder: Path) -> dict[str, Any]:
    """What the Python ForeachWriter noted: its epochs (open -> close), rows per epoch and
    the rows' latency from send to process()."""
    epochs: list[dict[str, Any]] = []
    latencies: list[float] = []
    for path in sorted(folder.glob("p*")):
        docs = [json.loads(line) for line in path.read_text().splitlines()]
        rows = [d for d in docs if "sent" in d]
        latencies.extend(d["seen"] - d["sent"] for d in rows)
        opened = docs[0]["open"]
        closed = next((d["close"] for d in docs if "close" in d), None)
        epochs.append(
            {
                "epoch": docs[0]["epoch"],
                "open_to_close_ms": None if closed is None else round(closed - opened),
                "rows": len(rows),
            }
        )
    epochs.sort(key=lambda e: int(e["epoch"]))
    report: dict[str, Any] = {"epochs": epochs}
    if latencies:
        report["send_to_process_p50_ms"] = round(percentile(latencies, 0.5), 1)
        report["send_to_process_p99_ms"] = round(percentile(latencies, 0.99), 1)
    return report


def attempts(
    spark: Any, bootstrap: str, inbound: str, folder: Path
) -> dict[str, Callable[[int], Any]]:
    """Each thing an engine needs, as a function starting it in RTM (n: a fresh suffix)."""
    from pyspark.sql import functions as F
    from pyspark.sql.functions import udf
    from pyspark.sql.pandas.functions import pandas_udf
    from pyspark.sql.streaming.stateful_processor import (
        StatefulProcessor,
        StatefulProcessorHandle,
    )

    def out(n: int) -> tuple[str, Path]:
        return f"probe-out-{n}", folder / f"cp-{n}"

    def times_two(s: pd.Series) -> pd.Series:
        return s * 2

    make_pandas_udf: Any = pandas_udf  # its overloads do not take a plain Series function
    doubled = make_pandas_udf(times_two, "double")

    arrow_doubled = udf(lambda x: x * 2, "double", useArrow=True)
    python_doubled = udf(lambda x: x * 2, "double")

    def with_column(column: Any) -> Callable[[int], Any]:
        def start(n: int) -> Any:
            topic, cp = out(n)
            df = parsed(spark, bootstrap, inbound).withColumn("cpu_user", column)
            return rtm(to_kafka(df, bootstrap, topic, cp)).start()

        return start

    def foreach_batch(n: int) -> Any:
        _, cp = out(n)
        df = parsed(spark, bootstrap, inbound)
        return (
            df.writeStream.option("checkpointLocation", str(cp))
            .foreachBatch(lambda batch, batch_id: None)
            .outputMode("update")
            .trigger(realTime=RTM_BATCH)
            .start()
        )

    def foreach_writer(n: int) -> Any:
        _, cp = out(n)
        rows = folder / "writer"
        rows.mkdir()
        df = parsed(spark, bootstrap, inbound)
        return (
            df.writeStream.option("checkpointLocation", str(cp))
            .foreach(PyWriter(str(rows)))
            .outputMode("update")
            .trigger(realTime=RTM_BATCH)
            .start()
        )

    class Count(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.count = handle.getValueState("count", "n BIGINT")

        def handleInputRows(
            self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
        ) -> Iterator[pd.DataFrame]:
            held = self.count.get() if self.count.exists() else None
            n = int(held[0]) if held else 0
            for frame in rows:
                n += len(frame)
            self.count.update((n,))
            yield pd.DataFrame({"host": [key[0]], "n": [n]})

        def close(self) -> None:
            pass

    def transform_with_state(n: int, realtime: bool = True) -> Any:
        topic, cp = out(n)
        df = (
            parsed(spark, bootstrap, inbound)
            .groupBy("host")
            .transformWithStateInPandas(
                statefulProcessor=Count(),
                outputStructType="host STRING, n BIGINT",
                outputMode="Update",
                timeMode="None",
            )
            .select(F.col("host").alias("key"), F.col("n").cast("string").alias("value"))
        )
        writer = (
            df.writeStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", topic)
            .option("checkpointLocation", str(cp))
            .outputMode("update")
        )
        if realtime:
            return writer.trigger(realTime=RTM_BATCH).start()
        return writer.trigger(processingTime="250 milliseconds").start()

    def transform_with_state_micro_batch(n: int) -> Any:
        # The control: the same query in micro-batch mode.
        return transform_with_state(n, realtime=False)

    def allowlist_off(start: Callable[[int], Any]) -> Callable[[int], Any]:
        """`start` with Spark's escape hatch: spark.sql.streaming.realTimeMode.allowlistCheck
        false ("you agree to run the query at your own risk")."""

        def started(n: int) -> Any:
            # Read while the query plans its batches, not at start(): try_all unsets it
            # once the attempt is over.
            spark.conf.set(ALLOWLIST_CHECK, "false")
            return start(n)

        return started

    def union_self(n: int) -> Any:
        topic, cp = out(n)
        df = parsed(spark, bootstrap, inbound)
        return rtm(to_kafka(df.union(df), bootstrap, topic, cp)).start()

    def transactional(n: int) -> Any:
        topic, cp = out(n)
        df = parsed(spark, bootstrap, inbound)
        options = {"kafka.transactional.id": f"realtime-bench-{n}"}
        return rtm(to_kafka(df, bootstrap, topic, cp, **options)).start()

    def drop_duplicates(n: int) -> Any:
        topic, cp = out(n)
        df = parsed(spark, bootstrap, inbound).dropDuplicates(["msg_id"])
        return rtm(to_kafka(df, bootstrap, topic, cp)).start()

    return {
        "pandas_udf": with_column(doubled(F.col("cpu_user"))),
        "arrow_python_udf": with_column(arrow_doubled(F.col("cpu_user"))),
        "python_udf": with_column(python_doubled(F.col("cpu_user"))),
        "foreachBatch": foreach_batch,
        "python_foreach_writer": foreach_writer,
        "transformWithStateInPandas": transform_with_state,
        "transformWithStateInPandas_in_micro_batch_control": transform_with_state_micro_batch,
        "transformWithStateInPandas_allowlist_check_off": allowlist_off(transform_with_state),
        "pandas_udf_allowlist_check_off": allowlist_off(with_column(doubled(F.col("cpu_user")))),
        "foreachBatch_allowlist_check_off": allowlist_off(foreach_batch),
        "union_with_itself": union_self,
        "kafka_sink_transactional_id": transactional,
        "dropDuplicates_jvm": drop_duplicates,
    }


def first_lines(text: str, lines: int = 6) -> str:
    return "\n".join(text.strip().splitlines()[:lines])[:1500]


def output_count(bootstrap: str, topic: str) -> int:
    from confluent_kafka import TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"count-{uuid.uuid4()}"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        return int(high - low)
    finally:
        consumer.close()


def try_all(
    spark: Any, kafka: PrivateKafka, folder: Path, wait_s: float
) -> dict[str, dict[str, Any]]:
    """Each attempt in RTM while a probe load runs: Spark's error, or that it ran."""
    inbound = "probe.in"
    kafka.create_topics(inbound)
    load = Load(kafka.bootstrap, inbound, 200)
    load.start()
    results: dict[str, dict[str, Any]] = {}
    try:
        for n, (name, start) in enumerate(
            attempts(spark, kafka.bootstrap, inbound, folder).items()
        ):
            kafka.create_topics(f"probe-out-{n}")
            print(f"trying in RTM: {name}", flush=True)
            result: dict[str, Any]
            try:
                query = start(n)
            except Exception as exc:  # the error is the finding
                result = {"outcome": "refused at start()", "error": first_lines(str(exc))}
                results[name] = {**result, "exception": type(exc).__name__}
                print(json.dumps(results[name]), flush=True)
                spark.conf.unset(ALLOWLIST_CHECK)
                continue
            try:
                ended = query.awaitTermination(wait_s)
                error = query.exception()
                if error is not None:
                    result = {"outcome": "query failed", "error": first_lines(str(error), 12)}
                elif ended:
                    result = {"outcome": "query ended without error"}
                else:
                    result = {
                        "outcome": f"ran for {wait_s:.0f} s",
                        "rows_out": output_count(kafka.bootstrap, f"probe-out-{n}"),
                    }
            except Exception as exc:  # the error is the finding
                result = {"outcome": "query failed", "error": first_lines(str(exc), 12)}
            finally:
                try:
                    query.stop()
                except Exception:  # stopping a failed query
                    traceback.print_exc()
            spark.conf.unset(ALLOWLIST_CHECK)
            if name == "python_foreach_writer" and (folder / "writer").is_dir():
                result["writer"] = writer_report(folder / "writer")
            results[name] = result
            print(json.dumps(result), flush=True)
    finally:
        load.stop()
    return results


@contextmanager
def private_kafka(settings: Settings) -> Iterator[tuple[PrivateKafka, Path]]:
    folder = Path(tempfile.mkdtemp(prefix="twinstream-realtime-"))
    try:
        with PrivateKafka(settings, folder) as kafka:
            yield kafka, folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


GATE_JAR = "rtm-gate/twinstream-rtm-gate.jar"  # under settings.jars_dir (java/rtm-gate)
GATE_COMMIT_MS = 50  # the prototype gate commits a transaction once it is this old


def gate_input(spark: Any, bootstrap: str, topic: str) -> Any:
    """The gate's input: the Kafka source's partition, offset and key, and the same
    transformed value as the Kafka-sink query's (from_json, project, to_json)."""
    from pyspark.sql import functions as F

    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    e = F.from_json(F.col("value").cast("string"), SCHEMA)
    return (
        source.select("partition", "offset", "key", e.alias("e"))
        .where(F.col("e.msg_id").isNotNull())
        .select(
            "partition",
            "offset",
            "key",
            F.to_json(F.struct("e.msg_id", "e.host", "e.cpu_user", "e.sent_ms"))
            .cast("binary")
            .alias("value"),
        )
    )


def start_gate(
    spark: Any, bootstrap: str, inbound: str, outbound: str, checkpoint: Path, epoch_file: Path
) -> Any:
    """java/rtm-gate's GateWriter as the ForeachWriter of an RTM query, through py4j
    (pyspark's foreach() takes only a Python writer): epoch 1, transactional ids
    <outbound>-gate-p<partition> (a pipeline's own, as its engines share one today)."""
    from pyspark.sql.streaming.query import StreamingQuery

    jvm = spark._jvm
    writer = jvm.io.twinstream.rtm.GateWriter(
        bootstrap, outbound, f"{outbound}-gate", str(epoch_file), 1, GATE_COMMIT_MS
    )
    jquery = (
        gate_input(spark, bootstrap, inbound)
        ._jdf.writeStream()
        .foreach(writer)
        .outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .trigger(jvm.org.apache.spark.sql.streaming.Trigger.RealTime(RTM_BATCH))
        .start()
    )
    return StreamingQuery(jquery)


def ranges(ids: list[int]) -> list[list[int]]:
    """[first, last] of each run of consecutive ids."""
    out: list[list[int]] = []
    for i in ids:
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


def gate_guarantees(spark: Any, kafka: PrivateKafka, folder: Path, rate: float) -> dict[str, Any]:
    """The prototype gate's guarantees, tried: (1) a query stopped mid-batch and restarted
    on its checkpoint in a fresh JVM-side gate (its lanes forgotten, so the last published
    msg_id comes from the output's tail): Spark re-executes the unfinished batch; every
    input must be in the output exactly once. (2) The epoch moves: the next commit must
    fail the query, and nothing after it may be visible."""
    inbound, outbound = "gate-eo.in", "gate-eo.out"
    kafka.create_topics(inbound, outbound)
    spark._jvm.io.twinstream.rtm.GateWriter.forget()  # the latency run's lanes
    epoch_file = folder / "epoch-eo"
    epoch_file.write_text("1")
    checkpoint = folder / "cp-gate-eo"
    visible = Visible(kafka.bootstrap, outbound)
    visible.start()
    count = int(rate * 8)
    first = Load(kafka.bootstrap, inbound, rate, count=count)
    query = start_gate(spark, kafka.bootstrap, inbound, outbound, checkpoint, epoch_file)
    first.start()
    first.join(120)
    time.sleep(2.0)  # stopped in the middle of a 5 s batch: its offsets are not committed
    query.stop()
    spark._jvm.io.twinstream.rtm.GateWriter.forget()
    second = Load(kafka.bootstrap, inbound, rate, count=count, first=count)
    query = start_gate(spark, kafka.bootstrap, inbound, outbound, checkpoint, epoch_file)
    second.start()
    second.join(120)
    try:
        wait_for(lambda: len(visible.seen) >= 2 * count, 240, "the gate's output complete")
    except Exception as exc:
        print(f"gate: {exc}", flush=True)
    missing_ranges = ranges(sorted(set(range(2 * count)) - set(visible.seen)))
    published = output_count(kafka.bootstrap, outbound)
    # Moving the epoch: the next commit must fail the query.
    before = len(visible.seen)
    epoch_file.write_text("2")
    third = Load(kafka.bootstrap, inbound, rate, count=int(rate * 3), first=2 * count)
    third.start()
    third.join(60)
    ended = query.awaitTermination(30) if query.isActive else True
    error = query.exception()
    if query.isActive:
        query.stop()
    time.sleep(2.0)
    visible.stop()
    ids = sorted(visible.seen)
    return {
        "restart_mid_batch": {
            "inputs": 2 * count,
            "distinct_msg_ids_out": len(set(ids[: 2 * count])),
            "missing": 2 * count - len([i for i in ids if i < 2 * count]),
            # Records in the output partition (transaction markers take offsets too, so
            # the log's offsets over-count; this counts the records a consumer reads).
            "records_read": visible.records,
            "log_offsets_incl_markers": published,
            "missing_ranges": missing_ranges[:10],
            "restarted_at_msg_id": count,
        },
        "epoch_moved": {
            "query_failed": bool(ended and error is not None),
            "error": None if error is None else first_lines(str(error), 3),
            "visible_after_the_move": len(visible.seen) - before,
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--skip", type=float, default=10.0, help="seconds left out, each run")
    parser.add_argument("--wait", type=float, default=25.0, help="seconds per RTM attempt")
    parser.add_argument("--no-attempts", action="store_true", help="latency only")
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "bench")
    args = parser.parse_args()

    settings = load_settings()
    trigger_ms = settings.trigger_interval_ms
    os.environ.setdefault("PYSPARK_PYTHON", str(REPO_ROOT / ".venv" / "bin" / "python"))
    figures: dict[str, Any] = {}
    gate_jar = settings.jars_dir / GATE_JAR
    with private_kafka(settings) as (kafka, folder):
        print(f"private broker on {kafka.bootstrap}, {folder}", flush=True)
        spark = session(
            settings,
            "twinstream-bench-realtime",
            master="local[2]",
            conf={
                "spark.sql.shuffle.partitions": "1",
                "spark.ui.showConsoleProgress": "false",
                "spark.sql.streaming.stateStore.providerClass": "org.apache.spark.sql."
                "execution.streaming.state.RocksDBStateStoreProvider",
                "spark.sql.streaming.stateStore.checkpointFormatVersion": "2",
                "spark.jars": ",".join(
                    [*kafka_jars(settings), *([str(gate_jar)] if gate_jar.is_file() else [])]
                ),
            },
        )
        spark.sparkContext.setLogLevel("ERROR")
        try:
            bootstrap = kafka.bootstrap

            def realtime(inbound: str, outbound: str) -> Any:
                df = parsed(spark, bootstrap, inbound)
                return rtm(to_kafka(df, bootstrap, outbound, folder / "cp-rtm")).start()

            def micro_batch(inbound: str, outbound: str) -> Any:
                df = parsed(spark, bootstrap, inbound)
                return (
                    to_kafka(df, bootstrap, outbound, folder / "cp-mb")
                    .outputMode("append")
                    .trigger(processingTime=f"{trigger_ms} milliseconds")
                    .start()
                )

            figures["realtime"] = {
                "trigger": f"realTime={RTM_BATCH!r}",
                **measure(kafka, "rtm", realtime, args.rate, args.seconds, args.skip),
            }
            figures["micro_batch"] = {
                "trigger": f"processingTime={trigger_ms} ms",
                **measure(kafka, "mb", micro_batch, args.rate, args.seconds, args.skip),
            }
            if gate_jar.is_file():

                def gate(inbound: str, outbound: str) -> Any:
                    epoch = folder / "epoch"
                    epoch.write_text("1")
                    return start_gate(
                        spark, bootstrap, inbound, outbound, folder / "cp-gate", epoch
                    )

                figures["realtime_jvm_gate"] = {
                    "trigger": f"realTime={RTM_BATCH!r}, java/rtm-gate's GateWriter, a "
                    f"transaction committed once {GATE_COMMIT_MS} ms old",
                    **measure(kafka, "gate", gate, args.rate, args.seconds, args.skip),
                    "guarantees": gate_guarantees(spark, kafka, folder, args.rate),
                }
            else:
                print(f"no {gate_jar}: the JVM gate is not measured (java/rtm-gate/pom.xml)")
            if not args.no_attempts:
                figures["rtm_attempts"] = try_all(spark, kafka, folder, args.wait)
        finally:
            stop_session(spark)
    figures["setup"] = (
        "private single-node KRaft broker (PLAINTEXT, acks=all producer, linger 0), one "
        "partition; Spark local[2] in the benchmark's process; query: from_json, project, "
        "to_json -> Kafka sink (at-least-once); consumer read_committed, fetch.wait.max.ms 5; "
        f"latency = visible - send time, first {args.skip:.0f} s of each run left out"
    )
    figures["command"] = (
        f".venv/bin/python -m bench.realtime --rate {args.rate:.0f} --seconds {args.seconds:.0f}"
    )
    figures["machine"] = machine()
    write_figures(args.output, "realtime", figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
