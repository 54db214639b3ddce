#!/usr/bin/env bash
# One-shot topic setup for docker-compose.yaml (the `kafka-init` service, apache/kafka image).
#
# Idempotent: a topic that exists is left in place (--if-not-exists) and its configs are put
# back to the values below (kafka-configs --alter), so re-running after changing a retention
# in the environment converges instead of failing. Partitions and replication factor of an
# existing topic are never changed here: that needs a reassignment, decided by a human.
#
# Every value arrives from the compose file's environment; nothing has a default here, so the
# defaults live in exactly one place (docker-compose.yaml, mirroring twinstream.config).
set -euo pipefail

: "${TWINSTREAM_BOOTSTRAP:?}" "${TWINSTREAM_PARTITIONS:?}"
: "${TWINSTREAM_REPLICATION_FACTOR:?}" "${TWINSTREAM_MIN_INSYNC_REPLICAS:?}"
: "${TWINSTREAM_INBOUND_TOPIC:?}" "${TWINSTREAM_INBOUND_RETENTION_MS:?}"
: "${TWINSTREAM_OUTBOUND_TOPIC:?}" "${TWINSTREAM_OUTBOUND_RETENTION_MS:?}"
: "${TWINSTREAM_DLQ_TOPIC:?}" "${TWINSTREAM_DLQ_RETENTION_MS:?}"
: "${TWINSTREAM_PROGRESS_TOPIC:?}"

bin=/opt/kafka/bin

ensure_topic() {
  local topic=$1 retention_ms=$2
  local configs="min.insync.replicas=${TWINSTREAM_MIN_INSYNC_REPLICAS}"
  configs+=",unclean.leader.election.enable=false"
  configs+=",retention.ms=${retention_ms}"

  "$bin/kafka-topics.sh" --bootstrap-server "$TWINSTREAM_BOOTSTRAP" \
    --create --if-not-exists --topic "$topic" \
    --partitions "$TWINSTREAM_PARTITIONS" \
    --replication-factor "$TWINSTREAM_REPLICATION_FACTOR" \
    --config "min.insync.replicas=${TWINSTREAM_MIN_INSYNC_REPLICAS}" \
    --config unclean.leader.election.enable=false \
    --config "retention.ms=${retention_ms}"

  "$bin/kafka-configs.sh" --bootstrap-server "$TWINSTREAM_BOOTSTRAP" \
    --alter --entity-type topics --entity-name "$topic" --add-config "$configs"

  "$bin/kafka-topics.sh" --bootstrap-server "$TWINSTREAM_BOOTSTRAP" --describe --topic "$topic"
}

ensure_topic "$TWINSTREAM_INBOUND_TOPIC" "$TWINSTREAM_INBOUND_RETENTION_MS"
ensure_topic "$TWINSTREAM_OUTBOUND_TOPIC" "$TWINSTREAM_OUTBOUND_RETENTION_MS"
ensure_topic "$TWINSTREAM_DLQ_TOPIC" "$TWINSTREAM_DLQ_RETENTION_MS"
# Kept as long as the outputs whose coverage it records.
ensure_topic "$TWINSTREAM_PROGRESS_TOPIC" "$TWINSTREAM_OUTBOUND_RETENTION_MS"
# The pipelines file's other pipelines (comma-separated names): <name>.in, .out, .dlq, .progress.
IFS=',' read -ra others <<< "${TWINSTREAM_OTHER_PIPELINES:-}"
for name in "${others[@]}"; do
  ensure_topic "$name.in" "$TWINSTREAM_INBOUND_RETENTION_MS"
  ensure_topic "$name.out" "$TWINSTREAM_OUTBOUND_RETENTION_MS"
  ensure_topic "$name.dlq" "$TWINSTREAM_DLQ_RETENTION_MS"
  ensure_topic "$name.progress" "$TWINSTREAM_OUTBOUND_RETENTION_MS"
done
echo "kafka-init: topics ready"
