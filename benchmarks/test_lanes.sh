#!/usr/bin/env bash
# Wall time of each test lane (one process) and of the fast lane and the whole suite (one worker per core, up to 4),
# for docs/results/<date>-test-lanes.md. Run from the repository root in the project's environment:
#   bash benchmarks/test_lanes.sh [OUT.tsv]
set -uo pipefail
out=${1:-test-lanes.tsv}
printf 'what\tseconds\tresult\n' > "$out"
run() {  # run NAME ARGS...: time one pytest invocation, record its last summary line
  local name=$1; shift
  local start end
  start=$(date +%s)
  summary=$(python -m pytest -q -p no:cacheprovider "$@" 2>&1 | tail -1)
  end=$(date +%s)
  printf '%s\t%s\t%s\n' "$name" "$((end - start))" "$summary" | tee -a "$out"
}
run "fast lane (-m 'not slow', -n auto)" -m "not slow" -n auto --maxprocesses 4 --dist worksteal
for lane in tests/*/; do
  lane=${lane%/}
  case $(basename "$lane") in support|fixtures) continue ;; esac
  run "$lane" "$lane"
done
run "everything (-n auto)" -n auto --maxprocesses 4 --dist worksteal
