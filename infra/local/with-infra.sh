#!/usr/bin/env bash
# Run a command with the local infrastructure up, then stop only what this script started.
#
#   infra/local/with-infra.sh COMMAND [ARGS...]
#
# Components that were already running (a developer's `make up`) are left running. The exit status is
# the command's.
COMPONENT=with-infra
source "$(dirname "$0")/common.sh"
HERE=$(cd "$(dirname "$0")" && pwd)

started=()
cleanup() {
  local c
  for ((i=${#started[@]}-1; i>=0; i--)); do
    c=${started[$i]}
    bash "$HERE/$c.sh" stop || log "could not stop $c"
  done
}
trap cleanup EXIT

for c in kafka postgres redis; do
  if ! bash "$HERE/$c.sh" status >/dev/null 2>&1; then
    bash "$HERE/$c.sh" start || die "could not start $c"
    started+=("$c")
  fi
done
set +e
"$@"
rc=$?
set -e
exit $rc
