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

ensure_installed() {
  command -v prometheus >/dev/null && return 0
  [ "$(id -u)" = 0 ] || die "prometheus is missing; install Debian's prometheus package"
  log "installing Debian's prometheus"
  { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; } \
    >"$STATE_DIR/apt-prometheus.log" 2>&1 || die "apt-get install prometheus failed; see $STATE_DIR/apt-prometheus.log"
}

ready() { "$PYTHON" - "$1" <<'PY'
import sys, urllib.request
try:
    sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=1).status == 200 else 1)
except Exception:
    sys.exit(1)
PY
}

start() {
  if pid_alive "$PIDFILE"; then log "already running (pid $(cat "$PIDFILE")) on 127.0.0.1:$PORT"; return 0; fi
  ensure_installed
  [ -f "$CONFIG" ] || die "no config file $CONFIG"
  mkdir -p "$DIR/data"
  # the Debian package's own service is not used: this instance is private to the caller
  nohup prometheus --config.file="$CONFIG" --storage.tsdb.path="$DIR/data" \
      --web.listen-address="127.0.0.1:$PORT" --web.enable-lifecycle >"$DIR/prometheus.log" 2>&1 &
  echo $! >"$PIDFILE"
  for _ in $(seq 1 300); do
    if ready "http://127.0.0.1:$PORT/-/ready"; then log "ready (pid $(cat "$PIDFILE")) on 127.0.0.1:$PORT"; return 0; fi
    pid_alive "$PIDFILE" || die "prometheus exited; see $DIR/prometheus.log"
    sleep 0.1
  done
  die "prometheus was not ready within 30 s; see $DIR/prometheus.log"
}

status() {
  if pid_alive "$PIDFILE"; then echo "prometheus: running (pid $(cat "$PIDFILE")) on 127.0.0.1:$PORT"
  else echo "prometheus: stopped"; return 1; fi
}

case "${1:-}" in
  start) start ;;
  stop) stop_pidfile "$PIDFILE" ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
