#!/usr/bin/env bash
# Apache Kafka 4.1 on this host as a side-by-side peer for the performance
# figures: fetches the broker and Kafka's own tools from Maven Central
# (scripts/kafka-peer/pom.xml), starts a single KRaft node (broker and
# controller in one process, no fsync per write: Kafka's default) on
# 127.0.0.1:29092, and drives it with ProducerPerformance (two producer
# processes, as the load generator has two workers), then
# ConsumerPerformance and EndToEndLatency at the 1m-500b workload: 500 B
# records, 16 partitions, acks=1, 64 KiB batches, 5 ms linger, no
# compression. Stops the node and deletes its data at the end.
#
# Environment: PEER_WORK (default target/kafka-peer), PEER_RATE (msgs/s
# offered in total, default 1000000), PEER_SECONDS (default 15).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

work="${PEER_WORK:-target/kafka-peer}"
rate="${PEER_RATE:-1000000}"
seconds="${PEER_SECONDS:-15}"
mkdir -p "$work"
work="$(cd "$work" && pwd)"
libs="$work/libs"
if [ ! -f "$libs/kafka_2.13-4.1.0.jar" ]; then
    mvn -q -B -f scripts/kafka-peer/pom.xml dependency:copy-dependencies \
        -DoutputDirectory="$libs" -DincludeScope=runtime
fi
cp="$libs/*"
stamp="$(date +%Y%m%d-%H%M%S)"
data="$work/data-$stamp"
out="$work/kafka-peer-$stamp.txt"

cat > "$work/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:29093
listeners=PLAINTEXT://127.0.0.1:29092,CONTROLLER://127.0.0.1:29093
advertised.listeners=PLAINTEXT://127.0.0.1:29092
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$data
num.partitions=16
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
PROPS
cat > "$work/log4j2.yaml" <<'YAML'
Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        Pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
YAML

# Kafka's tools print SLF4J notices on stderr; a tool that prints nothing
# else is not a failure (java's own exit status still counts).
tools() { java -Xmx1g -cp "$cp" "$@" 2>&1 | { grep -v SLF4J || true; }; }
kafka=""
trap '[ -n "$kafka" ] && { kill -TERM $kafka 2>/dev/null || true; wait $kafka 2>/dev/null || true; }; rm -rf "$data"' EXIT
cluster_id="$(tools kafka.tools.StorageTool random-uuid | tail -n 1)"
[ -n "$cluster_id" ] || { echo "kafka-peer: no cluster id from StorageTool" >&2; exit 1; }
tools kafka.tools.StorageTool format --ignore-formatted -t "$cluster_id" -c "$work/server.properties"
java -Xms2g -Xmx2g -Dlog4j2.configurationFile="$work/log4j2.yaml" -cp "$cp" kafka.Kafka \
    "$work/server.properties" > "$work/kafka-$stamp.log" 2>&1 &
kafka=$!
ready=""
for _ in $(seq 1 60); do
    if ! kill -0 "$kafka" 2>/dev/null; then
        tail -n 20 "$work/kafka-$stamp.log" >&2
        echo "kafka-peer: the Kafka node exited" >&2
        exit 1
    fi
    if tools org.apache.kafka.tools.TopicCommand --bootstrap-server 127.0.0.1:29092 --list >/dev/null; then
        ready=1
        break
    fi
    sleep 1
done
[ -n "$ready" ] || { echo "kafka-peer: the Kafka node did not answer in 60 s" >&2; exit 1; }
tools org.apache.kafka.tools.TopicCommand --bootstrap-server 127.0.0.1:29092 --create \
    --topic bench --partitions 16 --replication-factor 1

per_producer=$((rate / 2))
records=$((per_producer * seconds))
props="bootstrap.servers=127.0.0.1:29092 acks=1 batch.size=65536 linger.ms=5 compression.type=none buffer.memory=134217728"
{
    echo "# Apache Kafka 4.1.0, one KRaft node on 127.0.0.1, $(date -u +%FT%TZ)"
    echo "# two ProducerPerformance processes: --num-records $records --record-size 500 --throughput $per_producer --producer-props $props"
} | tee "$out"
pids=()
for i in 1 2; do
    # shellcheck disable=SC2086
    tools org.apache.kafka.tools.ProducerPerformance --topic bench --num-records "$records" \
        --record-size 500 --throughput "$per_producer" --producer-props $props \
        > "$work/producer-$i-$stamp.txt" &
    pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
for i in 1 2; do
    echo "producer $i: $(tail -n 1 "$work/producer-$i-$stamp.txt")" | tee -a "$out"
done
echo "# ConsumerPerformance: every record written above" | tee -a "$out"
tools org.apache.kafka.tools.ConsumerPerformance --bootstrap-server 127.0.0.1:29092 \
    --topic bench --messages $((records * 2)) --timeout 60000 | tee -a "$out"
echo "# EndToEndLatency: 10000 records of 500 B, acks=1, one at a time" | tee -a "$out"
tools org.apache.kafka.tools.EndToEndLatency 127.0.0.1:29092 bench 10000 1 500 | tail -n 3 | tee -a "$out"
echo "results: $out"
