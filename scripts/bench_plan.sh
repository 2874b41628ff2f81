#!/usr/bin/env bash
# feedbench plan on a real curve (issue 28): scan 1, 2, 4, 8, 16 consumers of a local sample with
# every read slowed by LATENCY seconds, then fit and check that the fit on 1-8 predicts 16 (the
# held-out check every plan prints). A few minutes on a 2-core VM, most of it the 1-consumer
# repeats waiting on the added latency. From the repository root:
#
#   scripts/bench_plan.sh              # LATENCY=0.01
#   LATENCY=0.002 scripts/bench_plan.sh
#
# Environment: PY (default python3), DATA (default /tmp/fb4k-tree), OUT (default results/),
# LATENCY, RATE (samples/s per accelerator, default 100), AT (default 32), COST (default 64000).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
DATA=${DATA:-/tmp/fb4k-tree}
OUT=${OUT:-results}
LATENCY=${LATENCY:-0.01}
mkdir -p "$OUT"
if [ ! -d "$DATA/images" ]; then
  "$PY" -m feedbench sample "$DATA" -n 4000 --format tree --jobs 1 >/dev/null
fi
SCAN=$OUT/plan-scan-lat$LATENCY.json
"$PY" -m feedbench scan "$DATA" --stages read --read-latency "$LATENCY" --consumers 1,2,4,8,16 \
  --workers 1 -b 8 --repeat 3 --no-plots --json "$SCAN"
"$PY" -m feedbench plan "$SCAN" --rate "${RATE:-100}" --at "${AT:-32}" --cost "${COST:-64000}" \
  --json "$OUT/plan-lat$LATENCY.json"
