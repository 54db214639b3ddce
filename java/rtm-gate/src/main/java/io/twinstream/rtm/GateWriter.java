package io.twinstream.rtm;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.spark.sql.ForeachWriter;
import org.apache.spark.sql.Row;

/**
 * A prototype of Twinstream's gate as the JVM {@link ForeachWriter} of a real-time-mode query
 * (issue 35, point 6): what the engines' Python gate does per micro-batch, done per record.
 *
 * <ul>
 *   <li>A transactional id per inbound partition ({@code <prefix>-p<partition>}): the first use
 *       in this JVM calls {@code initTransactions}, which fences any earlier holder of the id.
 *   <li>Dedup below the last published msg_id: the first use reads the tail of the output
 *       partition (read_committed) for the highest {@code msg_id} header; a record at or below
 *       it (a batch Spark re-executes after a failure) is dropped.
 *   <li>The epoch checked before each commit: the gate commits only while the epoch source
 *       (here a file the election would write; a ZooKeeper read in the real thing) still holds
 *       the epoch it was started with, and aborts and fails the task otherwise.
 * </ul>
 *
 * <p>Spark calls {@code open(partitionId, epochId)} when a task starts a batch and {@code
 * close} when it ends it ({@code ForeachDataWriter}): in real-time mode once per batch of at
 * least 5 s. Committing only in {@code close} would make every output wait for its batch's
 * end, so a transaction is committed in {@code process} once it is {@code commitIntervalMs}
 * old, and in {@code close}. There is no timer: after the last record of a burst its
 * transaction waits for the next record or the batch's end.
 *
 * <p>Input rows: {@code partition INT, offset BIGINT, key BINARY, value BINARY} (the Kafka
 * source's own columns, the value already transformed). The output goes to the same
 * partition number of the output topic with header {@code msg_id} = the inbound offset.
 */
public final class GateWriter extends ForeachWriter<Row> {
  private static final long serialVersionUID = 1L;

  /** Per inbound partition, for the life of the executor's JVM: its producer and position. */
  private static final Map<String, Lane> LANES = new ConcurrentHashMap<>();

  private final String bootstrap;
  private final String outputTopic;
  private final String transactionalPrefix;
  private final String epochFile;
  private final long epoch;
  private final long commitIntervalMs;

  /** The lanes this task touched in its current batch (closed in close()). */
  private transient Map<Integer, Lane> touched;

  public GateWriter(
      String bootstrap,
      String outputTopic,
      String transactionalPrefix,
      String epochFile,
      long epoch,
      long commitIntervalMs) {
    this.bootstrap = bootstrap;
    this.outputTopic = outputTopic;
    this.transactionalPrefix = transactionalPrefix;
    this.epochFile = epochFile;
    this.epoch = epoch;
    this.commitIntervalMs = commitIntervalMs;
  }

  @Override
  public boolean open(long partitionId, long epochId) {
    touched = new HashMap<>();
    return true;
  }

  @Override
  public void process(Row row) {
    int partition = row.getInt(0);
    long offset = row.getLong(1);
    Lane lane = touched.get(partition);
    if (lane == null) {
      lane =
          LANES.computeIfAbsent(
              transactionalPrefix + "-p" + partition, id -> new Lane(this, id, partition));
      touched.put(partition, lane);
    }
    lane.write(this, offset, (byte[]) row.get(2), (byte[]) row.get(3));
  }

  @Override
  public void close(Throwable error) {
    if (touched == null) {
      return;
    }
    for (Lane lane : touched.values()) {
      if (error == null) {
        lane.commit(this);
      } else {
        lane.abort();
      }
    }
    touched = null;
  }

  /**
   * Closes and forgets every lane of this JVM, as if the executor were new: the next record
   * of a partition fences its id again and reads the output's tail. bench/realtime.py calls it
   * between a stop and a restart.
   */
  public static void forget() {
    for (Lane lane : LANES.values()) {
      lane.close();
    }
    LANES.clear();
  }

  /** Throws unless the epoch source still says this gate's epoch. */
  void checkEpoch() {
    long now;
    try {
      now = Long.parseLong(Files.readString(Path.of(epochFile)).trim());
    } catch (IOException e) {
      throw new UncheckedIOException("cannot read the epoch", e);
    }
    if (now != epoch) {
      throw new IllegalStateException(
          "epoch moved from " + epoch + " to " + now + ": this gate may no longer commit");
    }
  }

  /** One inbound partition's producer, open transaction and last published msg_id. */
  static final class Lane {
    private final KafkaProducer<byte[], byte[]> producer;
    private final int partition;
    private long lastPublished;
    private long lastInTransaction = -1;
    private long transactionStartedMs = -1;

    Lane(GateWriter gate, String transactionalId, int partition) {
      this.partition = partition;
      Properties props = new Properties();
      props.put("bootstrap.servers", gate.bootstrap);
      props.put("transactional.id", transactionalId);
      props.put("enable.idempotence", "true");
      props.put("acks", "all");
      props.put("linger.ms", "0");
      producer =
          new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer());
      // Fences every earlier holder of the id: its open transaction is aborted and its later
      // commits fail. Then what it committed is final, and the tail can be read.
      producer.initTransactions();
      lastPublished = lastPublished(gate.bootstrap, gate.outputTopic, partition);
    }

    synchronized void write(GateWriter gate, long offset, byte[] key, byte[] value) {
      if (offset <= lastPublished || offset <= lastInTransaction) {
        return; // published already (a re-executed batch), or in this transaction
      }
      if (transactionStartedMs < 0) {
        producer.beginTransaction();
        transactionStartedMs = System.currentTimeMillis();
      }
      ProducerRecord<byte[], byte[]> record =
          new ProducerRecord<>(gate.outputTopic, partition, key, value);
      record.headers().add("msg_id", Long.toString(offset).getBytes(StandardCharsets.UTF_8));
      producer.send(record);
      lastInTransaction = offset;
      if (System.currentTimeMillis() - transactionStartedMs >= gate.commitIntervalMs) {
        commit(gate);
      }
    }

    synchronized void commit(GateWriter gate) {
      if (transactionStartedMs < 0) {
        return;
      }
      try {
        gate.checkEpoch();
      } catch (RuntimeException e) {
        abort();
        throw e;
      }
      producer.commitTransaction();
      lastPublished = lastInTransaction;
      transactionStartedMs = -1;
    }

    synchronized void abort() {
      if (transactionStartedMs >= 0) {
        producer.abortTransaction();
        lastInTransaction = lastPublished;
        transactionStartedMs = -1;
      }
    }

    synchronized void close() {
      producer.close(Duration.ofSeconds(5));
    }

    /** The highest msg_id header in the last 1,000 offsets of the output partition, as a
     * read_committed consumer sees it; -1 when there is none. */
    static long lastPublished(String bootstrap, String topic, int partition) {
      Properties props = new Properties();
      props.put("bootstrap.servers", bootstrap);
      props.put("isolation.level", "read_committed");
      props.put("enable.auto.commit", "false");
      TopicPartition tp = new TopicPartition(topic, partition);
      long last = -1;
      try (KafkaConsumer<byte[], byte[]> consumer =
          new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
        consumer.assign(List.of(tp));
        consumer.seekToEnd(List.of(tp));
        long end = consumer.position(tp);
        consumer.seek(tp, Math.max(0, end - 1000));
        while (consumer.position(tp) < end) {
          for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(500))) {
            Header h = r.headers().lastHeader("msg_id");
            if (h != null) {
              last = Math.max(last, Long.parseLong(new String(h.value(), StandardCharsets.UTF_8)));
            }
          }
        }
      }
      return last;
    }
  }
}
