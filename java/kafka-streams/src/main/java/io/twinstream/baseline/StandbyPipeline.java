package io.twinstream.baseline;

import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.Properties;
import java.util.TreeSet;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.LagInfo;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.TaskMetadata;
import org.apache.kafka.streams.ThreadMetadata;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * The Kafka Streams alternative to a Twinstream pair, for bench/kafka_streams.py: a stateful
 * pipeline (a running count per record key in a persistent store) run as two instances of one
 * application with one standby replica of that store. Each output carries the same headers as
 * a Twinstream engine's: msg_id (the inbound offset) and engine_id (this instance), so the
 * same read_committed audit finds gaps and duplicates in either.
 *
 * <p>Only what the comparison needs is set; everything else is Kafka Streams' default, as its
 * users run it: notably session.timeout.ms (45 s), which bounds how soon the group notices a
 * killed instance, and commit.interval.ms (100 ms under exactly-once).
 *
 * <p>Prints a status line whenever its state, tasks or standby lag change, for the benchmark
 * to follow: {@code status state=RUNNING active=0_0 standby= lag=-}.
 *
 * <p>TRANSFORM is {@code count} (the default) or {@code hostmetrics}: the hostmetrics example's
 * per-host window (HostWindow), the work a Twinstream pair does per record, for bench/drain.py.
 *
 * <p>Usage: StandbyPipeline BOOTSTRAP APPLICATION_ID IN_TOPIC OUT_TOPIC INSTANCE_ID STATE_DIR
 * [TRANSFORM]
 */
public final class StandbyPipeline {
  static final String STORE = "counts";
  static final String WINDOWS = "windows";
  // The Twinstream pipeline's default window retention (TWINSTREAM_WINDOW_RETENTION_MS).
  static final long RETENTION_MS = 60L * 60 * 1000;

  private StandbyPipeline() {}

  /** A running count per key; forwards each record with its msg_id and this instance. */
  static final class Count implements Processor<byte[], byte[], String, String> {
    private final byte[] instance;
    private ProcessorContext<String, String> context;
    private KeyValueStore<String, Long> counts;

    Count(String instance) {
      this.instance = instance.getBytes(StandardCharsets.UTF_8);
    }

    @Override
    public void init(ProcessorContext<String, String> context) {
      this.context = context;
      this.counts = context.getStateStore(STORE);
    }

    @Override
    public void process(Record<byte[], byte[]> record) {
      long offset = context.recordMetadata().orElseThrow().offset();
      String key = record.key() == null ? "" : new String(record.key(), StandardCharsets.UTF_8);
      Long before = counts.get(key);
      long count = before == null ? 1 : before + 1;
      counts.put(key, count);
      RecordHeaders headers = new RecordHeaders();
      headers.add("msg_id", Long.toString(offset).getBytes(StandardCharsets.UTF_8));
      headers.add("engine_id", instance);
      String value = "{\"msg_id\":" + offset + ",\"count\":" + count + "}";
      context.forward(new Record<>(key, value, record.timestamp(), headers));
    }
  }

  /** The hostmetrics window per host; forwards each record's output (or dead letter). */
  static final class Window implements Processor<byte[], byte[], String, String> {
    private final byte[] instance;
    private ProcessorContext<String, String> context;
    private KeyValueStore<String, String> windows;

    Window(String instance) {
      this.instance = instance.getBytes(StandardCharsets.UTF_8);
    }

    @Override
    public void init(ProcessorContext<String, String> context) {
      this.context = context;
      this.windows = context.getStateStore(WINDOWS);
    }

    @Override
    public void process(Record<byte[], byte[]> record) {
      long offset = context.recordMetadata().orElseThrow().offset();
      String raw = record.value() == null ? "" : new String(record.value(), StandardCharsets.UTF_8);
      String host = HostWindow.host(raw);
      String before = windows.get(host);
      HostWindow.Step step = HostWindow.step(before, offset, raw, RETENTION_MS);
      if (step.state() != null && !step.state().equals(before)) {
        windows.put(host, step.state());
      }
      RecordHeaders headers = new RecordHeaders();
      headers.add("msg_id", Long.toString(offset).getBytes(StandardCharsets.UTF_8));
      headers.add("engine_id", instance);
      context.forward(new Record<>(step.key(), step.value(), record.timestamp(), headers));
    }
  }

  static String tasks(Iterable<TaskMetadata> tasks) {
    TreeSet<String> ids = new TreeSet<>();
    for (TaskMetadata task : tasks) {
      ids.add(task.taskId().toString());
    }
    return String.join(",", ids);
  }

  static String status(KafkaStreams streams) {
    StringBuilder active = new StringBuilder();
    StringBuilder standby = new StringBuilder();
    for (ThreadMetadata thread : streams.metadataForLocalThreads()) {
      active.append(tasks(thread.activeTasks()));
      standby.append(tasks(thread.standbyTasks()));
    }
    long lag = -1;
    try {
      for (Map<Integer, LagInfo> partitions : streams.allLocalStorePartitionLags().values()) {
        for (LagInfo info : partitions.values()) {
          lag = Math.max(lag, info.offsetLag());
        }
      }
    } catch (RuntimeException e) {
      // Not answerable while the instance is starting or rebalancing: no lag known.
    }
    return "status state=" + streams.state() + " active=" + active + " standby=" + standby
        + " lag=" + (lag < 0 ? "-" : Long.toString(lag));
  }

  public static void main(String[] args) throws InterruptedException {
    String transform = args.length == 7 ? args[6] : "count";
    if ((args.length != 6 && args.length != 7)
        || !(transform.equals("count") || transform.equals("hostmetrics"))) {
      System.err.println(
          "usage: StandbyPipeline BOOTSTRAP APPLICATION_ID IN_TOPIC OUT_TOPIC INSTANCE_ID STATE_DIR"
              + " [count|hostmetrics]");
      System.exit(2);
    }
    String instance = args[4];
    // Twinstream's Kafka login first (when the stack has Kafka security), then our settings.
    Properties props = ClientConfig.fromEnvironment();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[1]);
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
    // The same guarantee Twinstream gives; the default (at_least_once) repeats output on
    // failover, which would make a comparison of takeover times meaningless.
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    // The hot standby under comparison: a replica of the store kept warm on the other instance.
    props.put(StreamsConfig.NUM_STANDBY_REPLICAS_CONFIG, 1);
    // Two instances on one machine need a state directory each.
    props.put(StreamsConfig.STATE_DIR_CONFIG, args[5]);

    StreamsBuilder builder = new StreamsBuilder();
    if (transform.equals("hostmetrics")) {
      builder.addStateStore(
          Stores.keyValueStoreBuilder(
              Stores.persistentKeyValueStore(WINDOWS), Serdes.String(), Serdes.String()));
      builder.stream(args[2], Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
          .process(() -> new Window(instance), WINDOWS)
          .to(args[3], Produced.with(Serdes.String(), Serdes.String()));
    } else {
      builder.addStateStore(
          Stores.keyValueStoreBuilder(
              Stores.persistentKeyValueStore(STORE), Serdes.String(), Serdes.Long()));
      builder.stream(args[2], Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
          .process(() -> new Count(instance), STORE)
          .to(args[3], Produced.with(Serdes.String(), Serdes.String()));
    }

    KafkaStreams streams = new KafkaStreams(builder.build(), props);
    CountDownLatch done = new CountDownLatch(1);
    streams.setUncaughtExceptionHandler(
        e -> {
          e.printStackTrace();
          return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler
              .StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
    streams.setStateListener(
        (now, before) -> {
          if (now == KafkaStreams.State.NOT_RUNNING || now == KafkaStreams.State.ERROR) {
            done.countDown();
          }
        });
    ScheduledExecutorService reporter = Executors.newSingleThreadScheduledExecutor();
    String[] last = {""};
    reporter.scheduleAtFixedRate(
        () -> {
          String line = status(streams);
          if (!line.equals(last[0])) {
            last[0] = line;
            System.out.println(line);
            System.out.flush();
          }
        },
        0,
        200,
        TimeUnit.MILLISECONDS);
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  streams.close();
                  reporter.shutdownNow();
                }));
    streams.start();
    done.await();
    reporter.shutdownNow();
    System.exit(streams.state() == KafkaStreams.State.ERROR ? 1 : 0);
  }
}
