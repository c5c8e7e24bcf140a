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
