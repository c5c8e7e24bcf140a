#!/usr/bin/env bash
# Headless Chromium (Debian's `chromium` package): what `medic report --format pdf` prints with, and what
# the report tests open the HTML report in.
#
#   infra/local/chromium.sh install|status
#
# Installs the Debian package when the binary is missing and we are root (as prometheus.sh does).
COMPONENT=chromium
source "$(dirname "$0")/common.sh"

case "${1:-}" in
  install) apt_install chromium chromium; command -v chromium >/dev/null && log "$(chromium --version 2>/dev/null)" ;;
  status) command -v chromium >/dev/null && echo "chromium: $(command -v chromium)" || { echo "chromium: missing"; exit 1; } ;;
  *) echo "usage: $0 install|status" >&2; exit 2 ;;
esac
