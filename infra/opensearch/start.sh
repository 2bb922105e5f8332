#!/usr/bin/env bash
# Start a local single-node OpenSearch 2.19 (built from Maven Central artifacts) in the background.
#
#   infra/opensearch/start.sh [PORT] [BASE_DIR]
#
#   PORT      HTTP port on 127.0.0.1 (default: 9200, or $OPENSEARCH_PORT)
#   BASE_DIR  holds data/, logs/, home/, opensearch.log and opensearch.pid
#             (default: var/opensearch under the repository root, or $OPENSEARCH_DIR)
#
# Environment: OPENSEARCH_HEAP (default 1g; -Xms is half of it), OPENSEARCH_START_TIMEOUT (s, default 120),
#              JAVA (default: java on PATH), MVN (default: mvn).
# Builds the launcher on first use (mvn compile + dependency:copy-dependencies into target/lib; the
# jars are cached in ~/.m2); later starts skip the build. Waits until the cluster is green/yellow and
# prints the URL on stdout. Starting again on a BASE_DIR whose node is already up is a no-op.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PORT="${1:-${OPENSEARCH_PORT:-9200}}"
BASE="${2:-${OPENSEARCH_DIR:-$ROOT/var/opensearch}}"
HEAP="${OPENSEARCH_HEAP:-1g}"
TIMEOUT="${OPENSEARCH_START_TIMEOUT:-120}"
JAVA="${JAVA:-java}"
MVN="${MVN:-mvn}"
URL="http://127.0.0.1:${PORT}"

mkdir -p "$BASE"
BASE="$(cd "$BASE" && pwd)"
PIDFILE="$BASE/opensearch.pid"
LOG="$BASE/opensearch.log"

health() {  # prints the health JSON, or fails
    curl -fsS --max-time 5 "$URL/_cluster/health?wait_for_status=yellow&timeout=1s" 2>/dev/null
}

# --- already running? ------------------------------------------------------------------------
if [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    if health >/dev/null; then
        echo "$URL"
        exit 0
    fi
    echo "start.sh: a node from $BASE is running (pid $(cat "$PIDFILE")) but $URL does not answer;" \
         "stop it first: $HERE/stop.sh $BASE" >&2
    exit 1
fi
if curl -fsS --max-time 2 "$URL" >/dev/null 2>&1; then
    echo "start.sh: something already answers on $URL (not started from $BASE)" >&2
    exit 1
fi

# --- build once ---------------------------------------------------------------------------------
STAMP="$HERE/target/.built"
CLASS="$HERE/target/classes/dev/adaptiverag/LocalOpenSearch.class"
needs_build=0
if [[ ! -f "$STAMP" || ! -f "$CLASS" ]]; then
    needs_build=1
elif [[ -n "$(find "$HERE/pom.xml" "$HERE/src" -newer "$STAMP" -print -quit)" ]]; then
    needs_build=1
fi
if [[ "$needs_build" == 1 ]]; then
    echo "start.sh: building the launcher (first run downloads ~60 MB of jars into ~/.m2)..." >&2
    rm -rf "$HERE/target/lib"
    (cd "$HERE" && "$MVN" -q -B -Dstyle.color=never compile dependency:copy-dependencies) >&2
    touch "$STAMP"
fi

# --- start ----------------------------------------------------------------------------------------
XMS="$HEAP"
case "$HEAP" in
    *g) XMS="$(( ${HEAP%g} * 512 ))m" ;;
    *m) XMS="$(( ${HEAP%m} / 2 ))m" ;;
esac
START=$(date +%s.%N)
# setsid: the node survives the caller's shell and terminal; stop.sh signals it by pid.
setsid nohup "$JAVA" \
    -Xms"$XMS" -Xmx"$HEAP" -XX:+UseG1GC -XX:+ExitOnOutOfMemoryError \
    -Djava.awt.headless=true -Dfile.encoding=UTF-8 \
    -Dlog4j.shutdownHookEnabled=false -Dlog4j2.disable.jmx=true \
    -cp "$HERE/target/classes:$HERE/target/lib/*" \
    dev.adaptiverag.LocalOpenSearch "$PORT" "$BASE" >"$LOG" 2>&1 </dev/null &
PID=$!
echo "$PID" >"$PIDFILE"

deadline=$(( $(date +%s) + TIMEOUT ))
while :; do
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "start.sh: OpenSearch exited during start-up; last lines of $LOG:" >&2
        tail -n 40 "$LOG" >&2
        rm -f "$PIDFILE"
        exit 1
    fi
    if health >/dev/null; then
        break
    fi
    if (( $(date +%s) >= deadline )); then
        echo "start.sh: OpenSearch did not come up on $URL within ${TIMEOUT}s; last lines of $LOG:" >&2
        tail -n 40 "$LOG" >&2
        kill "$PID" 2>/dev/null || true
        rm -f "$PIDFILE"
        exit 1
    fi
    sleep 0.5
done
ELAPSED=$(awk -v a="$START" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo "start.sh: OpenSearch up on $URL in ${ELAPSED}s (pid $PID, log $LOG)" >&2
echo "$URL"
