package io.twinstream.baseline;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Comparator;
import java.util.Optional;
import java.util.stream.Stream;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.tuple.Tuple3;
import org.apache.flink.configuration.CheckpointingOptions;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.ExternalizedCheckpointRetention;
import org.apache.flink.configuration.StateRecoveryOptions;
import org.apache.flink.connector.base.DeliveryGuarantee;
import org.apache.flink.connector.kafka.sink.KafkaRecordSerializationSchema;
import org.apache.flink.connector.kafka.sink.KafkaSink;
import org.apache.flink.connector.kafka.source.KafkaSource;
import org.apache.flink.connector.kafka.source.enumerator.initializer.OffsetsInitializer;
import org.apache.flink.connector.kafka.source.reader.deserializer.KafkaRecordDeserializationSchema;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.util.Collector;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.internals.RecordHeaders;

/**
 * The Flink alternative to a Twinstream pair, for bench/flink.py: a stateful pipeline (a
 * running count per record key in keyed state) with an exactly-once Kafka sink, checkpointed
 * every INTERVAL_MS, run in this one JVM. Killed, it is restarted by a supervisor and resumes
 * from its latest retained checkpoint: Flink's recovery without a standby. Each output carries
 * the same headers as a Twinstream engine's: msg_id (the inbound offset) and engine_id (this
 * process), so the same read_committed audit finds gaps and duplicates in either.
 *
 * <p>TRANSFORM is {@code count} (the default) or {@code hostmetrics}: the hostmetrics example's
 * per-host window (HostWindow), the work a Twinstream pair does per record, for bench/drain.py.
 *
 * <p>Usage: CheckpointedPipeline BOOTSTRAP APPLICATION_ID IN_TOPIC OUT_TOPIC INSTANCE_ID
 * CHECKPOINT_DIR INTERVAL_MS [TRANSFORM]
 */
public final class CheckpointedPipeline {
  // The Twinstream pipeline's default window retention (TWINSTREAM_WINDOW_RETENTION_MS).
  static final long RETENTION_MS = 60L * 60 * 1000;

  private CheckpointedPipeline() {}

  /**
   * (key, inbound offset, value): the record's key for a count, its host for the window.
   * Flink's tuple serializer refuses null fields: "" for no key or no value.
   */
  static final class Input
      implements KafkaRecordDeserializationSchema<Tuple3<String, Long, String>> {
    private final boolean byHost;

    Input(boolean byHost) {
      this.byHost = byHost;
    }

    @Override
    public void deserialize(
        ConsumerRecord<byte[], byte[]> record, Collector<Tuple3<String, Long, String>> out) {
      String value =
          record.value() == null ? "" : new String(record.value(), StandardCharsets.UTF_8);
      String key;
      if (byHost) {
        key = HostWindow.host(value);
      } else {
        key = record.key() == null ? "" : new String(record.key(), StandardCharsets.UTF_8);
      }
      out.collect(Tuple3.of(key, record.offset(), value));
    }

    @Override
    public TypeInformation<Tuple3<String, Long, String>> getProducedType() {
      return Types.TUPLE(Types.STRING, Types.LONG, Types.STRING);
    }
  }

  /** A running count per key: (key, offset, its output value). */
  static final class Count
      extends KeyedProcessFunction<
          String, Tuple3<String, Long, String>, Tuple3<String, Long, String>> {
    private transient ValueState<Long> count;

    @Override
    public void open(org.apache.flink.api.common.functions.OpenContext context) {
      count = getRuntimeContext().getState(new ValueStateDescriptor<>("count", Types.LONG));
    }

    @Override
    public void processElement(
        Tuple3<String, Long, String> event,
        Context context,
        Collector<Tuple3<String, Long, String>> out)
        throws IOException {
      Long before = count.value();
      long now = before == null ? 1 : before + 1;
      count.update(now);
      out.collect(Tuple3.of(event.f0, event.f1, "{\"msg_id\":" + event.f1 + ",\"count\":" + now + "}"));
    }
  }

  /** The hostmetrics window per host: (host, offset, its output value or dead letter). */
  static final class Window
      extends KeyedProcessFunction<
          String, Tuple3<String, Long, String>, Tuple3<String, Long, String>> {
    private transient ValueState<String> window;

    @Override
    public void open(org.apache.flink.api.common.functions.OpenContext context) {
      window = getRuntimeContext().getState(new ValueStateDescriptor<>("window", Types.STRING));
    }

    @Override
    public void processElement(
        Tuple3<String, Long, String> event,
        Context context,
        Collector<Tuple3<String, Long, String>> out)
        throws IOException {
      String before = window.value();
      HostWindow.Step step = HostWindow.step(before, event.f1, event.f2, RETENTION_MS);
      if (step.state() != null && !step.state().equals(before)) {
        window.update(step.state());
      }
      out.collect(Tuple3.of(step.key() == null ? "" : step.key(), event.f1, step.value()));
    }
  }

  static final class Output
      implements KafkaRecordSerializationSchema<Tuple3<String, Long, String>> {
    private final String topic;
    private final String instance;

    Output(String topic, String instance) {
      this.topic = topic;
      this.instance = instance;
    }

    @Override
    public ProducerRecord<byte[], byte[]> serialize(
        Tuple3<String, Long, String> element, KafkaSinkContext context, Long timestamp) {
      RecordHeaders headers = new RecordHeaders();
      headers.add("msg_id", Long.toString(element.f1).getBytes(StandardCharsets.UTF_8));
      headers.add("engine_id", instance.getBytes(StandardCharsets.UTF_8));
      return new ProducerRecord<>(
          topic,
          null,
          null,
          element.f0.getBytes(StandardCharsets.UTF_8),
          element.f2.getBytes(StandardCharsets.UTF_8),
          headers);
    }
  }

  /** The newest completed checkpoint under `root` (a chk-N folder with its _metadata). */
  static Optional<Path> latestCheckpoint(Path root) throws IOException {
    if (!Files.isDirectory(root)) {
      return Optional.empty();
    }
    try (Stream<Path> files = Files.walk(root)) {
      return files
          .filter(p -> p.getFileName().toString().equals("_metadata"))
          .filter(p -> p.getParent().getFileName().toString().startsWith("chk-"))
          .max(Comparator.comparingLong(p -> p.toFile().lastModified()))
          .map(Path::getParent);
    }
  }

  public static void main(String[] args) throws Exception {
    String transform = args.length == 8 ? args[7] : "count";
    if ((args.length != 7 && args.length != 8)
        || !(transform.equals("count") || transform.equals("hostmetrics"))) {
      System.err.println(
          "usage: CheckpointedPipeline BOOTSTRAP APPLICATION_ID IN_TOPIC OUT_TOPIC INSTANCE_ID"
              + " CHECKPOINT_DIR INTERVAL_MS [count|hostmetrics]");
      System.exit(2);
    }
    boolean hostmetrics = transform.equals("hostmetrics");
    String bootstrap = args[0];
    Path checkpoints = Paths.get(args[5]).toAbsolutePath();
    Configuration conf = new Configuration();
    conf.set(CheckpointingOptions.CHECKPOINT_STORAGE, "filesystem");
    conf.set(CheckpointingOptions.CHECKPOINTS_DIRECTORY, checkpoints.toUri().toString());
    // A killed JVM cleans nothing up anyway; this also keeps a cancelled job's last one.
    conf.set(
        CheckpointingOptions.EXTERNALIZED_CHECKPOINT_RETENTION,
        ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION);
    Optional<Path> latest = latestCheckpoint(checkpoints);
    if (latest.isPresent()) {
      conf.set(StateRecoveryOptions.SAVEPOINT_PATH, latest.get().toUri().toString());
    }
    System.out.println("status restoring-from=" + latest.map(Path::toString).orElse("-"));
    System.out.flush();

    StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);
    // One inbound partition, as the Twinstream pipeline has.
    env.setParallelism(1);
    // Flink checkpoints nothing by default; the interval is also when the exactly-once sink
    // commits, so it bounds both the output's latency and how much a restart replays.
    env.enableCheckpointing(Long.parseLong(args[6]));

    KafkaSource<Tuple3<String, Long, String>> source =
        KafkaSource.<Tuple3<String, Long, String>>builder()
            .setBootstrapServers(bootstrap)
            // Twinstream's Kafka login, when the stack has Kafka security.
            .setProperties(ClientConfig.fromEnvironment())
            .setTopics(args[2])
            .setGroupId(args[1])
            // A first start reads the topic from its beginning; a restart, from the checkpoint.
            .setStartingOffsets(OffsetsInitializer.earliest())
            .setDeserializer(new Input(hostmetrics))
            .build();
    KafkaSink<Tuple3<String, Long, String>> sink =
        KafkaSink.<Tuple3<String, Long, String>>builder()
            .setBootstrapServers(bootstrap)
            .setKafkaProducerConfig(ClientConfig.fromEnvironment())
            .setRecordSerializer(new Output(args[3], args[4]))
            .setDeliveryGuarantee(DeliveryGuarantee.EXACTLY_ONCE)
            // The same prefix across restarts: the restored job aborts the killed one's open
            // transaction, which would otherwise hold back read_committed readers.
            .setTransactionalIdPrefix(args[1])
            // Flink's default (1 h) is over the brokers' transaction.max.timeout.ms (15 min).
            .setProperty("transaction.timeout.ms", "900000")
            .build();
    env.fromSource(source, WatermarkStrategy.noWatermarks(), "inbound")
        .keyBy(t -> t.f0, Types.STRING)
        .process(hostmetrics ? new Window() : new Count())
        .returns(Types.TUPLE(Types.STRING, Types.LONG, Types.STRING))
        .sinkTo(sink);
    System.out.println("status running");
    System.out.flush();
    env.execute(args[1]);
  }
}
