#!/usr/bin/env bash
# `make test` N times in a row (default 20), stopping at the first failure; one line per run
# with its duration and pytest's summary, and the log of a failing run kept. docs/testing.md
# records the result ("The suite, 20 times in a row").
#
#   tools/repeat_test.sh [N] [LOG_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
logs=${2:-/tmp/repeat-test}
mkdir -p "$logs"
echo "commit $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (with uncommitted changes)'), $(nproc) cores, $(date -u +%FT%TZ)"
for i in $(seq 1 "$runs"); do
    started=$(date +%s)
    make test >"$logs/run-$i.log" 2>&1
    status=$?
    took=$(( $(date +%s) - started ))
    summary=$(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed).* =+$' "$logs/run-$i.log" | tail -1)
    echo "run $i: exit $status in ${took} s: ${summary}"
    if [ "$status" -ne 0 ]; then
        echo "run $i failed; its log: $logs/run-$i.log"
        exit 1
    fi
    rm -f "$logs/run-$i.log"
done
echo "all $runs runs passed"
