#!/usr/bin/env bash
# Prometheus (Debian's `prometheus` package) on a loopback port, for integration tests and demos.
#
#   infra/local/prometheus.sh start|stop|status
#
#   CLUSTERMEDIC_PROMETHEUS_PORT    listen port on 127.0.0.1 (default 19090)
#   CLUSTERMEDIC_PROMETHEUS_CONFIG  prometheus.yml to load (default infra/prometheus/prometheus.yml)
#
# Data, log and PID file live under $STATE_DIR/prometheus-<port>, so several instances (one per test
# session) can run side by side. Installs the Debian package when the binary is missing and we are root.
COMPONENT=prometheus
source "$(dirname "$0")/common.sh"

PORT=${CLUSTERMEDIC_PROMETHEUS_PORT:-19090}
CONFIG=${CLUSTERMEDIC_PROMETHEUS_CONFIG:-$REPO_ROOT/infra/prometheus/prometheus.yml}
DIR=$STATE_DIR/prometheus-$PORT
PIDFILE=$DIR/prometheus.pid

start() {
  if pid_alive "$PIDFILE"; then log "already running (pid $(cat "$PIDFILE")) on 127.0.0.1:$PORT"; return 0; fi
  apt_install prometheus prometheus
  [ -f "$CONFIG" ] || die "no config file $CONFIG"
  mkdir -p "$DIR/data"
  # the Debian package's own service is not used: this instance is private to the caller
  nohup prometheus --config.file="$CONFIG" --storage.tsdb.path="$DIR/data" \
      --web.listen-address="127.0.0.1:$PORT" --web.enable-lifecycle >"$DIR/prometheus.log" 2>&1 &
  echo $! >"$PIDFILE"
  wait_http_ready "http://127.0.0.1:$PORT/-/ready" "$DIR/prometheus.log"
}

case "${1:-}" in
  start) start ;;
  stop) stop_pidfile "$PIDFILE" ;;
  status) print_status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
