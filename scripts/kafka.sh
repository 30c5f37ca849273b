#!/usr/bin/env bash
# Apache Kafka, single node in KRaft mode, on loopback, for tests and local use.
#   scripts/kafka.sh start|stop|status|restart
# The broker's jars are resolved from Maven Central with Maven (scripts/kafka-pom.xml) into
# .local/kafka/libs on first start; data and logs live in .local/kafka/. Idempotent: `start`
# returns at once when the broker already answers on the port.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
home="${RLWATCH_KAFKA_HOME:-$root/.local/kafka}"
port="${RLWATCH_KAFKA_PORT:-9092}"
ctl_port="${RLWATCH_KAFKA_CONTROLLER_PORT:-9093}"
libs="$home/libs"
data="$home/data"
pidfile="$home/kafka.pid"
log="$home/kafka.out"

die() { echo "kafka.sh: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "'$1' is not installed: $2"; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

resolve() {
  [ -f "$libs/.complete" ] && return 0
  need java "install a Java 17+ runtime (Debian: apt-get install openjdk-17-jre-headless)"
  need mvn "install Maven (Debian: apt-get install maven) to resolve Kafka from Maven Central"
  echo "kafka.sh: resolving Apache Kafka from Maven Central into $libs ..."
  rm -rf "$libs"; mkdir -p "$libs"
  mvn -q -B -f "$here/kafka-pom.xml" dependency:copy-dependencies \
      -DoutputDirectory="$libs" -DincludeScope=runtime \
    || die "Maven could not resolve org.apache.kafka:kafka_2.13 (see the output above)"
  touch "$libs/.complete"
}

write_config() {
  mkdir -p "$home" "$data"
  cat > "$home/server.properties" <<CONF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$ctl_port
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$ctl_port
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$data
num.partitions=4
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
log.retention.hours=24
CONF
  cat > "$home/log4j2.yaml" <<CONF
Configuration:
  Appenders:
    Console: {name: STDOUT, PatternLayout: {pattern: "[%d] %p %m (%c)%n"}}
  Loggers:
    Root: {level: WARN, AppenderRef: [{ref: STDOUT}]}
    Logger: [{name: kafka.server.KafkaRaftServer, level: INFO}, {name: kafka.server.BrokerServer, level: INFO}]
CONF
}

java_run() {
  java -Xms256m -Xmx768m -XX:+UseG1GC -Djava.awt.headless=true \
       -Dlog4j2.configurationFile="$home/log4j2.yaml" -cp "$libs/*" "$@"
}

start() {
  if port_open "$port"; then echo "kafka.sh: Kafka already up on 127.0.0.1:$port"; return 0; fi
  resolve
  write_config
  if [ ! -f "$data/meta.properties" ]; then
    java_run kafka.tools.StorageTool format --standalone -t "$(java_run kafka.tools.StorageTool random-uuid)" \
      -c "$home/server.properties" >/dev/null 2>"$home/format.err" \
      || java_run kafka.tools.StorageTool format -t "$(java_run kafka.tools.StorageTool random-uuid)" \
           -c "$home/server.properties" >/dev/null \
      || die "could not format the KRaft storage in $data ($(cat "$home/format.err"))"
  fi
  nohup java -Xms256m -Xmx768m -XX:+UseG1GC -Djava.awt.headless=true \
       -Dlog4j2.configurationFile="$home/log4j2.yaml" -cp "$libs/*" \
       kafka.Kafka "$home/server.properties" >"$log" 2>&1 &
  echo $! > "$pidfile"
  for _ in $(seq 1 120); do
    if port_open "$port"; then echo "kafka.sh: Kafka up on 127.0.0.1:$port (pid $(cat "$pidfile"))"; return 0; fi
    kill -0 "$(cat "$pidfile")" 2>/dev/null || { tail -30 "$log" >&2; die "the broker exited while starting (log: $log)"; }
    sleep 0.5
  done
  tail -30 "$log" >&2; die "the broker did not open port $port within 60 s (log: $log)"
}

stop() {
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    kill "$(cat "$pidfile")"
    for _ in $(seq 1 60); do kill -0 "$(cat "$pidfile")" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$(cat "$pidfile")" 2>/dev/null || true
    echo "kafka.sh: stopped"
  else
    echo "kafka.sh: not running"
  fi
  rm -f "$pidfile"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  restart) stop; start ;;
  status) if port_open "$port"; then echo "up on 127.0.0.1:$port"; else echo "down"; exit 1; fi ;;
  reset) stop; rm -rf "$data"; echo "kafka.sh: data wiped" ;;
  *) echo "usage: $0 start|stop|restart|status|reset" >&2; exit 2 ;;
esac
