#!/usr/bin/env bash
# feedbench plan on a real curve (issue 28): scan 1, 2, 4, 8, 16 consumers of a local sample with
# every read slowed by LATENCY seconds, then fit and check that the fit on 1-8 predicts 16 (the
# held-out check every plan prints). A few minutes on a 2-core VM, most of it the 1-consumer
# repeats waiting on the added latency. From the repository root:
#
#   scripts/bench_plan.sh              # LATENCY=0.01
#   LATENCY=0.002 scripts/bench_plan.sh
#   S3=1 LATENCY=0.02 scripts/bench_plan.sh   # the same tree as bucket "data" of a loopback
#                                             # `rclone serve s3` (rclone on PATH)
#
# Environment: PY (default python3), DATA (default /tmp/fb4k-tree), OUT (default results/),
# LATENCY, RATE (samples/s per accelerator, default 100), AT (default 32), COST (default 64000),
# S3 (1: scan it through S3).
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
TAG=lat$LATENCY
TARGET=$DATA
if [ "${S3:-0}" = 1 ]; then
  # the tree as bucket "data": a root folder holding only a link to it
  ROOT=$(mktemp -d); ln -s "$(cd "$DATA" && pwd)" "$ROOT/data"
  PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  rclone serve s3 "$ROOT" --addr "127.0.0.1:$PORT" --auth-key fbkey,fbsecret --copy-links --log-level ERROR &
  RCLONE=$!
  trap 'kill $RCLONE 2>/dev/null || true; rm -rf "$ROOT"' EXIT
  export AWS_ENDPOINT_URL=http://127.0.0.1:$PORT AWS_ACCESS_KEY_ID=fbkey AWS_SECRET_ACCESS_KEY=fbsecret \
    AWS_DEFAULT_REGION=us-east-1
  sleep 2
  TARGET=s3://data/images
  TAG=s3-lat$LATENCY
fi
SCAN=$OUT/plan-scan-$TAG.json
"$PY" -m feedbench scan "$TARGET" --stages read --read-latency "$LATENCY" --consumers 1,2,4,8,16 \
  --workers 1 -b 8 --repeat 3 --no-plots --json "$SCAN"
"$PY" -m feedbench plan "$SCAN" --rate "${RATE:-100}" --at "${AT:-32}" --cost "${COST:-64000}" \
  --json "$OUT/plan-$TAG.json"
