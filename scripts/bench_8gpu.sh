#!/usr/bin/env bash
# Issue 17 on the run tool's nvidia-h200-x8 (8 H200s, 128 cores): scan's prediction beside
# verify's training at 1, 2, 4 and 8 GPUs, every loader, on 196,608 ImageNet-like JPEGs (tree
# and shards): 96 batches of 256 per consumer at 8, where scan's sizing rule asks for >= 80
# (5 per loader worker, 16 workers a GPU). One phase per call, each within the call's 10
# minutes, after `. scripts/device_env.sh` (the DALI parts copied first). The order puts the
# 8-GPU lines first, for a session short of device time:
#
#   scripts/bench_8gpu.sh data              # feedbench sample, 196,608 JPEGs, both layouts: ~3 min
#   scripts/bench_8gpu.sh verify 8 1        # verify --gpus 8, repeat 1: the synthetic ceiling,
#   scripts/bench_8gpu.sh verify 8 2        #   then baseline, torch, dali and wds: ~5 min a call
#   scripts/bench_8gpu.sh verify 8 3
#   scripts/bench_8gpu.sh scan 8            # every loader's scan at 8 consumers, cold and warm,
#                                           #   3 repeats: ~4 min
#   scripts/bench_8gpu.sh verify 1,2 1      # the smaller counts, one repeat: ~7 min
#   scripts/bench_8gpu.sh verify 4 1        # ~4 min
#   scripts/bench_8gpu.sh scan 1            # cold and warm, one repeat: a pass at 1 consumer is
#                                           #   196,608 / 4,700 img/s (the profile) = 42 s: ~7 min
#   scripts/bench_8gpu.sh scan 2,4          # ~5 min
#   scripts/bench_8gpu.sh stages            # scan's own pipeline, --stages up to transfer, 1, 2,
#                                           #   4 and 8 consumers, cold and warm, both layouts
#   scripts/bench_8gpu.sh table             # scan vs verify (feedbench compare), no GPU work
#
# The times are estimates from 1 and 2 H200s (verify ~40 s a run at 100 steps); together ~45
# minutes, more than one session's 30: the first session runs down to `scan 8`, which answers the
# 8-GPU lines; the next session makes the data again and runs the rest.
#
# Environment: DATA (default /tmp/fb196k), IMAGES (default 196,608), STEPS (verify's measured
# steps, default 100), OUT (default $OUT or results/; every phase writes under it, so one folder
# can gather the calls' files). The scans are bench_prediction.sh's (the stock DataLoader scanned
# as verify's own recipe); its verify is replaced here by one file per GPU count and repeat.
set -euo pipefail
cd "$(dirname "$0")/.."
export DATA=${DATA:-/tmp/fb196k} IMAGES=${IMAGES:-196608} STEPS=${STEPS:-100}
export OUT=${OUT:-results}
mkdir -p "$OUT"
phase=${1:-}
[ $# -gt 0 ] && shift

verify() { # verify GPUS REPEAT...: one results file per repeat, the call's 570 s shared out
  local gpus=$1
  shift
  for rep in "$@"; do
    local stem="$OUT/verify-g${gpus//,/-}-r$rep"
    timeout $((570 / $#)) python3 -m feedbench verify "$DATA" --gpus "$gpus" \
      --loader baseline,torch,dali,wds --device cuda --model resnet50 -b 256 --steps "$STEPS" \
      --warmup 20 --keep-going --run-timeout 120 --interleave 0 --no-plots --json "$stem.json" > "$stem.txt" 2>&1 ||
      echo "verify $gpus repeat $rep: exit $?"
    grep -E "ceiling|verdict|^error" "$stem.txt" | head -8 || true
  done
}

case "$phase" in
  data)
    nvidia-smi -L; nproc; df -h /tmp | tail -1
    test -d "$DATA" || time python3 -m feedbench sample "$DATA" --images "$IMAGES" \
      --per-shard 256 --seed 0 --jobs "$(nproc)" | tail -2
    du -sh "$DATA"/* ;;
  verify)
    [ $# -ge 2 ] || { echo "usage: $0 verify GPUS REPEAT..." >&2; exit 2; }
    verify "$@" ;;
  scan)
    [ $# -eq 1 ] || { echo "usage: $0 scan GPUS" >&2; exit 2; }
    reps=1
    [ "$1" = 8 ] && reps=3
    GPUS=$1 OUT="$OUT/scan-g${1//,/-}" PASSES=cold,warm SCAN_REPEAT=$reps SCAN_TIMEOUT=140 \
      bash scripts/bench_prediction.sh scan ;;
  stages)
    for src in images shards; do
      timeout 280 python3 -m feedbench scan "$DATA/$src" --consumers 1,2,4,8 \
        --profile resnet50-h200 --stages read,decode,augment,collate,transfer --passes cold,warm \
        --no-plots --json "$OUT/stages-$src.json" > "$OUT/stages-$src.txt" 2>&1 ||
        echo "stages $src: exit $?"
      grep -E "^verdict|fed|^error" "$OUT/stages-$src.txt" | head -3 || true
    done ;;
  table)
    shopt -s nullglob
    verifies=("$OUT"/verify-g*-r*.json)
    for name in torch wds dali stock_loader; do
      scans=("$OUT"/scan-g*/scan-"$name".json)
      if [ ${#scans[@]} -eq 0 ] || [ ${#verifies[@]} -eq 0 ]; then
        echo "$name: no scan or no verify results under $OUT"
        continue
      fi
      COLUMNS=120 python3 -m feedbench compare "${scans[@]}" "${verifies[@]}" --passes warm \
        --json "$OUT/prediction-$name.json" | tail -12
    done ;;
  *) echo "usage: $0 data|verify GPUS REPEAT...|scan GPUS|stages|table" >&2; exit 2 ;;
esac
