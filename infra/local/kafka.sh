#!/usr/bin/env bash
# Single-node Apache Kafka 4.x broker in KRaft mode on 127.0.0.1.
#
#   infra/local/kafka.sh start|stop|status
#
# The broker jars are resolved once from Maven Central with `mvn` into
# $CLUSTERMEDIC_CACHE_DIR/kafka-<version>/libs and reused by every clone and run.
# Data, logs and the PID file live under $CLUSTERMEDIC_STATE_DIR/kafka.
COMPONENT=kafka
source "$(dirname "$0")/common.sh"

VERSION=${CLUSTERMEDIC_KAFKA_VERSION:-4.1.1}
PORT=${CLUSTERMEDIC_KAFKA_PORT:-19092}
CONTROLLER_PORT=${CLUSTERMEDIC_KAFKA_CONTROLLER_PORT:-19093}
PARTITIONS=${CLUSTERMEDIC_KAFKA_PARTITIONS:-4}
HOME_DIR=$CACHE_DIR/kafka-$VERSION
LIBS=$HOME_DIR/libs
DIR=$STATE_DIR/kafka
PIDFILE=$DIR/kafka.pid

resolve_jars() {
  [ -f "$LIBS/.complete" ] && return 0
  command -v mvn >/dev/null || die "mvn is not installed (apt-get install maven)"
  command -v java >/dev/null || die "java is not installed (Kafka 4 needs Java 17+)"
  log "resolving org.apache.kafka:kafka_2.13:$VERSION and its runtime dependencies into $LIBS"
  mkdir -p "$HOME_DIR"
  cat > "$HOME_DIR/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.clustermedic</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$VERSION</version></dependency>
    <!-- the broker logs through slf4j 1.7; bind it to log4j2, which Kafka already ships -->
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>2.24.3</version></dependency>
  </dependencies>
</project>
POM
  rm -rf "$LIBS"
  mvn -q -B -Dstyle.color=never -f "$HOME_DIR/pom.xml" dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$LIBS" >&2 || die "mvn could not resolve the Kafka jars"
  touch "$LIBS/.complete"
}

write_config() {
  mkdir -p "$DIR/data"
  cat > "$DIR/server.properties" <<CONF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$DIR/data
num.partitions=$PARTITIONS
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=$PARTITIONS
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# single broker: start consumer groups at once instead of waiting for more members
group.initial.rebalance.delay.ms=0
log.retention.hours=24
CONF
  cat > "$DIR/log4j2.properties" <<CONF
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = $DIR/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
CONF
}

java_opts() {
  JAVA_OPTS=(-Xms256m "-Xmx${CLUSTERMEDIC_KAFKA_HEAP:-768m}" -XX:+UseG1GC
             "-Dlog4j2.configurationFile=$DIR/log4j2.properties" -cp "$LIBS/*")
}

wait_ready() {
  # Ready means a metadata request answers and a consumer group has a coordinator, not merely that
  # the port is open: a fresh broker creates __consumer_offsets on the first group lookup, which on a
  # busy machine took longer than the first test's consumer was willing to wait.
  "$PYTHON" - "127.0.0.1:$PORT" <<'PY' || return 1
import sys, time
from kafka import KafkaAdminClient
deadline = time.monotonic() + 120
last = None
while time.monotonic() < deadline:
    try:
        admin = KafkaAdminClient(bootstrap_servers=sys.argv[1], request_timeout_ms=3000)
        admin.list_topics()
        # answered (even "no such group") only once the group coordinator is up; raises before
        admin.describe_groups(["clustermedic-ready-check"])
        admin.close()
        sys.exit(0)
    except Exception as exc:  # the broker is still starting
        last = exc
    time.sleep(0.5)
print(f"no metadata and group coordinator answer within 120 s: {last}", file=sys.stderr)
sys.exit(1)
PY
}

start() {
  if pid_alive "$PIDFILE"; then log "already running (pid $(cat "$PIDFILE")) on 127.0.0.1:$PORT"; return 0; fi
  for p in "$PORT" "$CONTROLLER_PORT"; do
    port_busy "$p" && die "127.0.0.1:$p is already in use by another process (set CLUSTERMEDIC_KAFKA_PORT / _CONTROLLER_PORT)"
  done
  resolve_jars
  write_config
  java_opts
  if [ ! -f "$DIR/data/meta.properties" ]; then
    local cluster_id
    cluster_id=$(java "${JAVA_OPTS[@]}" kafka.tools.StorageTool random-uuid)
    log "formatting storage (cluster id $cluster_id)"
    java "${JAVA_OPTS[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$DIR/server.properties" >/dev/null
  fi
  log "starting broker on 127.0.0.1:$PORT"
  nohup java "${JAVA_OPTS[@]}" kafka.Kafka "$DIR/server.properties" >"$DIR/stdout.log" 2>&1 &
  echo $! > "$PIDFILE"
  # a broker that died at once (a port taken meanwhile) must not pass for ready
  if ! wait_ready || ! pid_alive "$PIDFILE"; then
    tail -n 30 "$DIR/server.log" "$DIR/stdout.log" >&2 || true
    stop_pidfile "$PIDFILE"
    die "broker did not answer a metadata request"
  fi
  log "ready (pid $(cat "$PIDFILE"))"
}

status() {
  if pid_alive "$PIDFILE"; then echo "kafka: running (pid $(cat "$PIDFILE")) on 127.0.0.1:$PORT"
  else echo "kafka: stopped"; return 1; fi
}

case "${1:-}" in
  start) start ;;
  stop) stop_pidfile "$PIDFILE" ;;
  status) status ;;
  resolve) resolve_jars ;;
  *) echo "usage: $0 start|stop|status|resolve" >&2; exit 2 ;;
esac
