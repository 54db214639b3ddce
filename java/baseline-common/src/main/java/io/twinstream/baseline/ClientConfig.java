package io.twinstream.baseline;

import java.io.IOException;
import java.io.Reader;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.Properties;

/**
 * The Kafka client settings a baseline adds to its own: Twinstream's SASL/SCRAM-over-TLS login
 * (twinstream.platform.connections.KafkaConnection.java_security), from the properties file
 * the benchmark names in TWINSTREAM_KAFKA_CLIENT_PROPERTIES. None without it (a stack without Kafka security).
 */
public final class ClientConfig {
  public static final String ENV = "TWINSTREAM_KAFKA_CLIENT_PROPERTIES";

  private ClientConfig() {}

  public static Properties fromEnvironment() {
    Properties props = new Properties();
    String path = System.getenv(ENV);
    if (path == null || path.isEmpty()) {
      return props;
    }
    try (Reader in = Files.newBufferedReader(Paths.get(path))) {
      props.load(in);
    } catch (IOException e) {
      throw new IllegalStateException(ENV + "=" + path + " cannot be read: " + e, e);
    }
    return props;
  }
}
