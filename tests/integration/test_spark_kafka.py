"""pyspark 4.3.0 reads and writes the stack's Kafka through the connector Maven fetched
(4.2.0 with token provider 4.0.0: Central serves no newer ones)."""

from __future__ import annotations

import uuid

import psutil
import pytest
from confluent_kafka.admin import AdminClient

from twinstream.engine.spark import (
    DRIVER_JAVA_OPTIONS,
    class_archive,
    kafka_jars,
    session,
    stop_session,
)
from twinstream.platform.kafka import TopicSpec, admin_config, connection, ensure_topics

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def spark(stack, settings):
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    # A session this test process kept (a reference run's) would be returned as it is:
    # this module's must be a JVM of its own, started with the options below.
    existing = SparkSession.getActiveSession()
    if existing is not None:
        stop_session(existing)
    # -Xshare:on: a JVM that cannot map the class archive make install wrote fails to start,
    # rather than run without it (a stale archive: `make install` writes it again).
    spark = session(settings, "twinstream-connector-test", conf={DRIVER_JAVA_OPTIONS: "-Xshare:on"})
    jvm_pid = SparkContext._gateway.proc.pid  # type: ignore[union-attr]
    yield spark
    stop_session(spark)
    # Otherwise the JVM outlives the module and its Kafka clients log against the stack
    # after teardown, as they once did at the end of a CI run.
    assert not psutil.pid_exists(jvm_pid), f"Spark's JVM (pid {jvm_pid}) outlived the test"


def test_the_driver_jvm_maps_the_class_archive(spark, settings):
    from pyspark import SparkContext

    jvm = psutil.Process(SparkContext._gateway.proc.pid)  # type: ignore[union-attr]
    options = jvm.cmdline()
    assert f"-XX:SharedArchiveFile={class_archive(settings)}" in options, options
    assert "-Xshare:on" in options  # and it started: the archive fits this JVM


def test_connector_jars_are_the_fetched_ones(settings):
    names = [j.rsplit("/", 1)[1] for j in kafka_jars(settings)]
    assert any(n.startswith("spark-sql-kafka-0-10_2.13-") for n in names)
    assert any(n.startswith("spark-token-provider-kafka-0-10_2.13-") for n in names)
    assert any(n.startswith("kafka-clients-") for n in names)


def test_structured_streaming_reads_and_writes_kafka(spark, settings, tmp_path):
    source, sink = f"spark-src-{uuid.uuid4().hex[:8]}", f"spark-sink-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(admin_config(settings))
    ensure_topics(admin, [TopicSpec(source, 1, 3), TopicSpec(sink, 1, 3)])
    rows = spark.createDataFrame([(str(i), f"value-{i}") for i in range(500)], ["key", "value"])
    # The stack's Kafka login (its admin), as every client of a secure stack needs.
    login = connection(settings).spark_options()
    bootstrap = settings.bootstrap_servers
    writer = rows.write.format("kafka").option("kafka.bootstrap.servers", bootstrap)
    writer.options(**login).option("topic", source).save()

    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", settings.bootstrap_servers)
        .options(**login)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("CAST(offset AS STRING) AS key", "value")
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", settings.bootstrap_servers)
        .options(**login)
        .option("topic", sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .queryName("connector_test")
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180), "the availableNow query did not finish in 180 s"
    assert query.exception() is None

    back = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", settings.bootstrap_servers)
        .options(**login)
        .option("subscribe", sink)
        .load()
        .selectExpr("CAST(key AS STRING) AS offset", "CAST(value AS STRING) AS value")
        .collect()
    )
    assert sorted(int(r.offset) for r in back) == list(range(500))
    assert {r.value for r in back} == {f"value-{i}" for i in range(500)}


def test_a_keyed_pipeline_scans_kafka_once_per_batch_a_transform_twice(spark, settings, tmp_path):
    """Issue 34: a Keyed pipeline's plan (`twinstream.engine.pipeline.keyed_plan`) sends every
    record, valid or not, through one stateful operator, so a micro-batch reads its Kafka
    offsets once: one MicroBatchScan in the started query's physical plan. A transform
    pipeline's plan unions the transform's branch with the coverage branch, each reading the
    source: two. Both on the same few records of a topic of their own."""
    from pipelines.hostmetrics.generate import synthetic
    from pipelines.hostmetrics.pipeline import pipeline as hostmetrics
    from pipelines.orders import pipeline as orders
    from twinstream.engine.pipeline import plan, read_inbound, spark_conf, validated

    topic = f"spark-plan-{uuid.uuid4().hex[:8]}"
    ensure_topics(AdminClient(admin_config(settings)), [TopicSpec(topic, 1, 3)])
    records = spark.createDataFrame([(r,) for r in synthetic(5, seed=3)], "value BINARY")
    login = connection(settings).spark_options()
    records.write.format("kafka").options(**login).option(
        "kafka.bootstrap.servers", settings.bootstrap_servers
    ).option("topic", topic).save()
    own = settings.model_copy(update={"inbound_topic": topic})

    def physical_plan(pipeline, name: str) -> str:
        # The runtime settings the engines run the plan with (RocksDB: transformWithState
        # needs it), this session's own restored after.
        conf = spark_conf(pipeline)
        saved = {k: spark.conf.get(k, None) for k in conf}
        for key, value in conf.items():
            if not key.startswith("spark.ui."):
                spark.conf.set(key, value)
        try:
            query = (
                plan(validated(read_inbound(spark, own), pipeline, own), pipeline)
                # Run whole (Spark refuses a batch whose state store did not commit).
                .writeStream.format("noop")
                .option("checkpointLocation", str(tmp_path / name))
                .trigger(availableNow=True)
                .start()
            )
            assert query.awaitTermination(120), f"{name}: one batch did not run in 120 s"
            assert query.exception() is None, query.exception()
            # The last batch's executed plan (physical only: the logical ones name the scan
            # as a relation).
            text: str = query._jsq.explainInternal(False)
        finally:
            for key, value in saved.items():
                if value is None:
                    spark.conf.unset(key)
                elif not key.startswith("spark.ui."):
                    spark.conf.set(key, value)
        # The plan is the one asked for: the keyed one has its stateful operator.
        assert ("transformwithstate" in text.lower()) == (pipeline.keyed is not None), text
        return text

    keyed_text = physical_plan(hostmetrics, "keyed")
    assert keyed_text.count("MicroBatchScan") == 1, keyed_text
    transform_text = physical_plan(orders, "transform")
    assert transform_text.count("MicroBatchScan") == 2, transform_text
