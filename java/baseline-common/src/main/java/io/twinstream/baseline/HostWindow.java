package io.twinstream.baseline;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.time.format.DateTimeParseException;

/**
 * The hostmetrics example's window (pipelines/hostmetrics/logic.py) in Java: per host, the
 * last 20 events' cpu_user and mem_used_mb, their average and sum, and a fresh window after a
 * gap in the host's event time longer than the retention. The state is JSON text, as the
 * Twinstream pipeline keeps it. A record that is not a valid event gives a dead letter and
 * leaves the window as it was. The baselines run this where they ran a count, so that a drain
 * benchmark compares the same work per record.
 */
public final class HostWindow {
  public static final int SIZE = 20;
  private static final ObjectMapper JSON = new ObjectMapper();

  private HostWindow() {}

  /** One record through its host's window: the output's key and value, and the new state. */
  public record Step(String key, String value, String state) {}

  /** The record's host, the key of its window; "" when the record is no valid JSON object. */
  public static String host(String raw) {
    try {
      JsonNode doc = JSON.readTree(raw);
      JsonNode host = doc == null ? null : doc.get("host");
      return host != null && host.isTextual() ? host.asText() : "";
    } catch (JsonProcessingException e) {
      return "";
    }
  }

  /** `state` is the host's window (null: none yet); a rejected record keeps it. */
  public static Step step(String state, long msgId, String raw, long retentionMs) {
    try {
      JsonNode doc = JSON.readTree(raw);
      String host = doc.get("host").asText();
      String ts = doc.get("ts").asText();
      long tsMs = OffsetDateTime.parse(ts).withOffsetSameInstant(ZoneOffset.UTC).toInstant()
          .toEpochMilli();
      double cpuUser = doc.get("cpu_user").asDouble();
      long memUsed = doc.get("mem_used_mb").asLong();

      double[] cpu = new double[0];
      long[] mem = new long[0];
      long lastTs = tsMs;
      if (state != null) {
        JsonNode window = JSON.readTree(state);
        long previous = window.get("last").asLong();
        if (tsMs - previous <= retentionMs) {
          cpu = JSON.treeToValue(window.get("cpu"), double[].class);
          mem = JSON.treeToValue(window.get("mem"), long[].class);
          lastTs = Math.max(previous, tsMs);
        }
      }
      cpu = append(cpu, cpuUser);
      mem = append(mem, memUsed);
      double cpuSum = 0;
      long memSum = 0;
      for (int i = 0; i < cpu.length; i++) {
        cpuSum += cpu[i];
        memSum = Math.addExact(memSum, mem[i]);
      }

      ObjectNode out = JSON.createObjectNode();
      out.put("host", host);
      out.put("ts", ts);
      out.put("cpu_user", cpuUser);
      out.put("cpu_system", doc.get("cpu_system").asDouble());
      out.put("mem_used_mb", memUsed);
      out.put("mem_free_mb", doc.get("mem_free_mb").asLong());
      out.put("msg_id", msgId);
      out.put("window_count", cpu.length);
      out.put("cpu_user_avg20", cpuSum / cpu.length);
      out.put("mem_used_sum20", memSum);

      ObjectNode window = JSON.createObjectNode();
      ArrayNode cpuNode = window.putArray("cpu");
      for (double c : cpu) {
        cpuNode.add(c);
      }
      ArrayNode memNode = window.putArray("mem");
      for (long m : mem) {
        memNode.add(m);
      }
      window.put("last", lastTs);
      return new Step(host, JSON.writeValueAsString(out), JSON.writeValueAsString(window));
    } catch (JsonProcessingException
        | DateTimeParseException
        | NullPointerException
        | ArithmeticException e) {
      String letter = "{\"msg_id\":" + msgId + ",\"reason\":\"invalid: "
          + e.getClass().getSimpleName() + "\"}";
      return new Step(null, letter, state);
    }
  }

  private static double[] append(double[] window, double value) {
    int keep = Math.min(window.length, SIZE - 1);
    double[] next = new double[keep + 1];
    System.arraycopy(window, window.length - keep, next, 0, keep);
    next[keep] = value;
    return next;
  }

  private static long[] append(long[] window, long value) {
    int keep = Math.min(window.length, SIZE - 1);
    long[] next = new long[keep + 1];
    System.arraycopy(window, window.length - keep, next, 0, keep);
    next[keep] = value;
    return next;
  }
}
