#!/usr/bin/env bash
# Scan's prediction against verify's training on the GPU machine (issues 15 and 17): for each
# loader, `feedbench scan --loader L --profile resnet50-h200` (the emulated H200 step) and
# `feedbench verify --loader ...` (real ResNet-50 training) on the same data and GPU count, then
# `feedbench compare scan-L.json verify.json` sets the predicted data wait (1 − AU) beside the
# measured one. The stock DataLoader is scanned as verify's own recipe:
# `--loader feedbench.verify.loaders:stock_loader` pairs with verify's `baseline`.
#
# Machine: run-tool kind nvidia-h200 (GPUS=1) or nvidia-h200-xN (GPUS="1,2,4,8"); after
# `. scripts/device_env.sh` (DALI and webdataset carried in parts). Two calls, each within the
# 10-minute limit:
#
#   scripts/bench_prediction.sh scan     # the four scans (warm pass, 3 repeats): ~5 min
#   scripts/bench_prediction.sh verify   # synthetic + baseline, torch, dali, wds: ~5 min
#   scripts/bench_prediction.sh compare  # the prediction checks (no GPU work)
#
# Environment: DATA (default /tmp/fb32k: IMAGES ImageNet-like JPEGs, tree and shards of 256,
# made on first use), IMAGES (default 32,768: 128 batches of 256 per pass, so a scan's window
# holds ≥ 5 batches per loader worker at 16 workers, the sizing rule; 8,192 did not),
# GPUS (default 1), STEPS (default 100), OUT (default $OUT or results/), PASSES (scan's passes,
# default warm), SCAN_REPEAT (default 3), SCAN_TIMEOUT (s per loader's scan, default 150),
# VERIFY_TIMEOUT (s, default 570).
# Warm pass on purpose: verify trains many epochs over data the page cache holds after the first.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-/tmp/fb32k}
IMAGES=${IMAGES:-32768}
GPUS=${GPUS:-1}
STEPS=${STEPS:-100}
OUT=${OUT:-results}
PASSES=${PASSES:-warm}
SCAN_REPEAT=${SCAN_REPEAT:-3}
SCAN_TIMEOUT=${SCAN_TIMEOUT:-150}
VERIFY_TIMEOUT=${VERIFY_TIMEOUT:-570}
mkdir -p "$OUT"
test -d "$DATA" || python3 -m feedbench sample "$DATA" --images "$IMAGES" --per-shard 256 --seed 0 \
  --jobs "$(nproc)" > /dev/null
LOADERS="torch wds dali feedbench.verify.loaders:stock_loader"

case "${1:-scan}" in
  scan)
    for L in $LOADERS; do
      name=${L##*:}
      src=$DATA/images; [ "$L" = wds ] && src=$DATA/shards
      timeout "$SCAN_TIMEOUT" python3 -m feedbench scan "$src" --loader "$L" --consumers "$GPUS" \
        --profile resnet50-h200 --passes "$PASSES" --repeat "$SCAN_REPEAT" --no-plots \
        --json "$OUT/scan-$name.json" > "$OUT/scan-$name.txt" 2>&1 || echo "$L: exit $?"
      grep -E "^verdict|fed|^error" "$OUT/scan-$name.txt" | head -3
    done ;;
  verify)
    timeout "$VERIFY_TIMEOUT" python3 -m feedbench verify "$DATA" --gpus "$GPUS" \
      --loader baseline,torch,dali,wds --device cuda --model resnet50 -b 256 --steps "$STEPS" \
      --warmup 20 --keep-going --run-timeout 150 --interleave 0 --no-plots --json "$OUT/verify.json" \
      > "$OUT/verify.txt" 2>&1 || echo "verify: exit $?"
    tail -25 "$OUT/verify.txt" ;;
  compare)
    for L in $LOADERS; do
      name=${L##*:}
      python3 -m feedbench compare "$OUT/scan-$name.json" "$OUT/verify.json" --passes warm \
        --json "$OUT/prediction-$name.json" | tail -3
    done ;;
  *) echo "usage: $0 scan|verify|compare" >&2; exit 2 ;;
esac
