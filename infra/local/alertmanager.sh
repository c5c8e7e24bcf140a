#!/usr/bin/env bash
# Alertmanager (Debian's `prometheus-alertmanager` package) on a loopback port, for integration tests.
#
#   infra/local/alertmanager.sh start|stop|status
#
#   CLUSTERMEDIC_ALERTMANAGER_PORT    listen port on 127.0.0.1 (default 19094; 19093 is the Kafka controller)
#   CLUSTERMEDIC_ALERTMANAGER_CONFIG  alertmanager.yml to load (default infra/alertmanager/alertmanager.yml)
#
# Clustering (HA gossip) is turned off so nothing listens beyond the web port. Data, log and PID file
# live under $STATE_DIR/alertmanager-<port>. Installs the Debian package when missing and we are root.
COMPONENT=alertmanager
source "$(dirname "$0")/common.sh"

PORT=${CLUSTERMEDIC_ALERTMANAGER_PORT:-19094}
CONFIG=${CLUSTERMEDIC_ALERTMANAGER_CONFIG:-$REPO_ROOT/infra/alertmanager/alertmanager.yml}
DIR=$STATE_DIR/alertmanager-$PORT
PIDFILE=$DIR/alertmanager.pid
BIN=prometheus-alertmanager

ensure_installed() {
  command -v $BIN >/dev/null && return 0
  [ "$(id -u)" = 0 ] || die "$BIN is missing; install Debian's prometheus-alertmanager package"
  log "installing Debian's prometheus-alertmanager"
  { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus-alertmanager; } \
    >"$STATE_DIR/apt-alertmanager.log" 2>&1 ||
    die "apt-get install prometheus-alertmanager failed; see $STATE_DIR/apt-alertmanager.log"
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
  nohup $BIN --config.file="$CONFIG" --storage.path="$DIR/data" \
      --web.listen-address="127.0.0.1:$PORT" --cluster.listen-address= >"$DIR/alertmanager.log" 2>&1 &
  echo $! >"$PIDFILE"
  for _ in $(seq 1 300); do
    if ready "http://127.0.0.1:$PORT/-/ready"; then log "ready (pid $(cat "$PIDFILE")) on 127.0.0.1:$PORT"; return 0; fi
    pid_alive "$PIDFILE" || die "alertmanager exited; see $DIR/alertmanager.log"
    sleep 0.1
  done
  die "alertmanager was not ready within 30 s; see $DIR/alertmanager.log"
}

status() {
  if pid_alive "$PIDFILE"; then echo "alertmanager: running (pid $(cat "$PIDFILE")) on 127.0.0.1:$PORT"
  else echo "alertmanager: stopped"; return 1; fi
}

case "${1:-}" in
  start) start ;;
  stop) stop_pidfile "$PIDFILE" ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
