#!/usr/bin/env bash
# The training thread's next() at a small batch, before and after a change to the loaders, on one
# GPU host in one call: scripts/probe_next.py runs against the code of commit BASE (exported to
# prev/, with today's probe) and against the working tree, alternately, ROUNDS times each.
#
#   git archive BASE loaders feedbench scripts | tar -x -C prev   # here, before the device call
#   cp scripts/probe_next.py scripts/diag_step.py prev/scripts/
#   . scripts/device_env.sh && bash scripts/bench_next_ab.sh      # on the GPU machine
#
# Environment: DATA (default /tmp/fb32k), BATCH (64), STEPS (120), ROUNDS (1), OUT ($OUT).
# prev/ is an untracked copy for the device call only: delete it after.
set -uo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-/tmp/fb32k} BATCH=${BATCH:-64} STEPS=${STEPS:-120} ROUNDS=${ROUNDS:-1}
OUT=${OUT:-results}
[ -f prev/scripts/probe_next.py ] || { echo "error: no prev/ (see the header)" >&2; exit 2; }
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  for code in prev new; do
    script=scripts/probe_next.py
    [ "$code" = prev ] && script=prev/scripts/probe_next.py
    python3 "$script" --data "$DATA" --batch "$BATCH" --steps "$STEPS" \
      --out "$OUT/probe-b$BATCH-$code-r$r.json" > "$OUT/probe-b$BATCH-$code-r$r.log" 2>&1
    echo "== $code, round $r (exit $?)"
    grep -E "^(torch|wds|dali):|ms/step" "$OUT/probe-b$BATCH-$code-r$r.log"
  done
done
