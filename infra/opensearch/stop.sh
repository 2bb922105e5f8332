#!/usr/bin/env bash
# Stop a node started by start.sh:   infra/opensearch/stop.sh [BASE_DIR]
# BASE_DIR defaults like start.sh's ($OPENSEARCH_DIR or var/opensearch under the repository root).
# Sends SIGTERM (the node closes cleanly), waits up to 30 s, then SIGKILL. Exits 0 if nothing runs.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BASE="${1:-${OPENSEARCH_DIR:-$ROOT/var/opensearch}}"
PIDFILE="$BASE/opensearch.pid"

if [[ ! -f "$PIDFILE" ]]; then
    echo "stop.sh: no pid file at $PIDFILE; nothing to stop" >&2
    exit 0
fi
PID="$(cat "$PIDFILE")"
if ! kill -0 "$PID" 2>/dev/null; then
    rm -f "$PIDFILE"
    exit 0
fi
# make sure the pid is still our node, not a recycled pid
if ! tr '\0' ' ' <"/proc/$PID/cmdline" 2>/dev/null | grep -q 'dev.adaptiverag.LocalOpenSearch'; then
    echo "stop.sh: pid $PID is not a LocalOpenSearch node; removing stale $PIDFILE" >&2
    rm -f "$PIDFILE"
    exit 0
fi
kill -TERM "$PID"
for _ in $(seq 1 300); do
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
done
if kill -0 "$PID" 2>/dev/null; then
    echo "stop.sh: pid $PID still alive after 30 s; sending SIGKILL" >&2
    kill -KILL "$PID" 2>/dev/null || true
fi
rm -f "$PIDFILE"
echo "stop.sh: stopped OpenSearch (pid $PID)" >&2
