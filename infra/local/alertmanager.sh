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

start() {
  if pid_alive "$PIDFILE"; then log "already running (pid $(cat "$PIDFILE")) on 127.0.0.1:$PORT"; return 0; fi
  apt_install "$BIN" prometheus-alertmanager
  [ -f "$CONFIG" ] || die "no config file $CONFIG"
  mkdir -p "$DIR/data"
  nohup $BIN --config.file="$CONFIG" --storage.path="$DIR/data" \
      --web.listen-address="127.0.0.1:$PORT" --cluster.listen-address= >"$DIR/alertmanager.log" 2>&1 &
  echo $! >"$PIDFILE"
  wait_http_ready "http://127.0.0.1:$PORT/-/ready" "$DIR/alertmanager.log"
}

case "${1:-}" in
  start) start ;;
  stop) stop_pidfile "$PIDFILE" ;;
  status) print_status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
