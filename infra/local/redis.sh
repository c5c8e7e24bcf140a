#!/usr/bin/env bash
# Redis for Celery (broker and results): Debian's redis-server on 127.0.0.1.
#
#   infra/local/redis.sh start|stop|status
#
# Skipped when CLUSTERMEDIC_REDIS_URL points at a Redis of your own. Installs the Debian package
# when redis-server is missing and we are root.
COMPONENT=redis
source "$(dirname "$0")/common.sh"

PORT=${CLUSTERMEDIC_REDIS_PORT:-16379}
DIR=$STATE_DIR/redis
PIDFILE=$DIR/redis.pid

start() {
  if [ -n "${CLUSTERMEDIC_REDIS_URL:-}" ]; then log "using $CLUSTERMEDIC_REDIS_URL (not started here)"; return 0; fi
  if pid_alive "$PIDFILE"; then log "already running (pid $(cat "$PIDFILE")) on 127.0.0.1:$PORT"; return 0; fi
  port_busy "$PORT" && die "127.0.0.1:$PORT is already in use by another process (set CLUSTERMEDIC_REDIS_PORT)"
  apt_install redis-server redis-server " or set CLUSTERMEDIC_REDIS_URL"
  mkdir -p "$DIR"
  redis-server --bind 127.0.0.1 --port "$PORT" --dir "$DIR" --daemonize yes \
      --pidfile "$PIDFILE" --logfile "$DIR/redis.log" --save "" --appendonly no >&2
  for _ in $(seq 1 100); do
    if redis-cli -p "$PORT" ping 2>/dev/null | grep -q PONG; then
      log "ready (pid $(cat "$PIDFILE")) on 127.0.0.1:$PORT"; return 0
    fi
    sleep 0.1
  done
  die "redis-server did not answer PING within 10 s; see $DIR/redis.log"
}

status() {
  if [ -n "${CLUSTERMEDIC_REDIS_URL:-}" ]; then echo "redis: external $CLUSTERMEDIC_REDIS_URL"; return 0; fi
  print_status
}

case "${1:-}" in
  start) start ;;
  stop) [ -n "${CLUSTERMEDIC_REDIS_URL:-}" ] && exit 0; stop_pidfile "$PIDFILE" ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
