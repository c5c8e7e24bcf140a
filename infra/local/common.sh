# Shared helpers for the infra/local scripts (sourced, not run).
# Every setting comes from the same CLUSTERMEDIC_* variables the Python Settings object reads.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
STATE_DIR=${CLUSTERMEDIC_STATE_DIR:-$REPO_ROOT/.run}
case "$STATE_DIR" in /*) ;; *) STATE_DIR="$REPO_ROOT/$STATE_DIR" ;; esac
CACHE_DIR=${CLUSTERMEDIC_CACHE_DIR:-$HOME/.cache/clustermedic}
PYTHON=${PYTHON:-$REPO_ROOT/.venv/bin/python}
mkdir -p "$STATE_DIR" "$CACHE_DIR"

log() { printf '[%s] %s\n' "$COMPONENT" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# pid_alive FILE: true when FILE names a live process.
pid_alive() {
  [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

# stop_pidfile FILE: stop exactly the process recorded in FILE (TERM, then KILL after 20 s).
stop_pidfile() {
  local file=$1 pid
  if ! pid_alive "$file"; then
    rm -f "$file"
    log "not running"
    return 0
  fi
  pid=$(cat "$file")
  kill -TERM "$pid"
  for _ in $(seq 1 200); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$file"; log "stopped (pid $pid)"; return 0; }
    sleep 0.1
  done
  log "pid $pid ignored TERM for 20 s; sending KILL"
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$file"
}

# port_busy PORT: true when something already listens on 127.0.0.1:PORT.
port_busy() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# apt_install BINARY PACKAGE [HINT]: install Debian's PACKAGE when BINARY is missing (root only). The
# package's own service is never used: each script runs a private instance on a loopback port.
apt_install() {
  local binary=$1 package=$2 hint=${3:-}
  command -v "$binary" >/dev/null && return 0
  [ "$(id -u)" = 0 ] || die "$binary is missing; install Debian's $package package${hint}"
  log "installing Debian's $package"
  { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$package"; } \
    >"$STATE_DIR/apt-$package.log" 2>&1 || die "apt-get install $package failed; see $STATE_DIR/apt-$package.log"
}

# http_ok URL: true when URL answers 200 within a second.
http_ok() {
  "$PYTHON" - "$1" <<'PY'
import sys, urllib.request
try:
    sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=1).status == 200 else 1)
except Exception:
    sys.exit(1)
PY
}

# wait_http_ready URL LOGFILE: poll URL for 30 s while the process in $PIDFILE lives.
wait_http_ready() {
  local url=$1 logfile=$2
  for _ in $(seq 1 300); do
    if http_ok "$url"; then log "ready (pid $(cat "$PIDFILE")) on 127.0.0.1:$PORT"; return 0; fi
    pid_alive "$PIDFILE" || die "$COMPONENT exited; see $logfile"
    sleep 0.1
  done
  die "$COMPONENT was not ready within 30 s; see $logfile"
}

# print_status: one line on the instance recorded in $PIDFILE; non-zero when it is stopped.
print_status() {
  if pid_alive "$PIDFILE"; then echo "$COMPONENT: running (pid $(cat "$PIDFILE")) on 127.0.0.1:$PORT"
  else echo "$COMPONENT: stopped"; return 1; fi
}
