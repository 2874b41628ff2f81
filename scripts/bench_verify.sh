#!/usr/bin/env bash
# feedbench verify on the GPU machine: real DDP training, 1 → 2 GPUs, every loader, plus the
# synthetic ceiling (data already on the GPU). The issue's picture (2× H200, NVLink, 32 cores,
# ResNet-50 bf16, 256 per GPU, 8,192 JPEGs): synthetic 4,603 → 9,190 img/s; DALI as in its own
# example 4,478 → 7,481 (18% data wait at 2 GPUs); stock DataLoader 2,370 → 2,892 (49% → 65%).
#
# Machine: run-tool kind nvidia-h200-x2. From the repository root, one mode per call (each fits the
# 10-minute limit of one call):
#
#   scripts/bench_verify.sh test     # the gpu-marked test (resnet18, tiny data): ~3 min
#   scripts/bench_verify.sh smoke    # resnet18 at 128 px, 20 steps, every loader: ~3 min
#   scripts/bench_verify.sh weak     # THE run: resnet50, 256 per GPU, 200 steps: ~7 min
#   scripts/bench_verify.sh strong   # resnet50, global batch 512 (512 on 1 GPU, 256 each on 2)
#   scripts/bench_verify.sh tune     # our DALI loader (or the variant's --loader) at 2 GPUs
#                                    # (resnet50, 256 per GPU, 100 steps) under each tuning
#                                    # variant, beside the synthetic
#                                    # ceiling: ~35 s a run. Variants: VARIANTS="name|options;..."
#                                    # REPEAT=K interleaved repeats, STEPS, GPUS, SYNTHETIC=0,
#                                    # EXTRA="options for every run, the ceilings too"
#
# Environment: PY (python with torch, torchvision, nvidia-dali-cuda130; default python),
# DATA (default /tmp/feedbench-verify-data, made here on first use: 8,192 ImageNet-like JPEGs in
# 10 classes as a tree and as 32 tar shards, ~15 s on 32 cores), OUT (results folder; default
# $OUT when the run tool sets it, else results/). Each mode writes OUT/verify-MODE.json, its PNGs
# (-scaling, -breakdown) and its torchrun logs (OUT/verify-MODE-logs/).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
DATA=${DATA:-/tmp/feedbench-verify-data}
OUT=${OUT:-results}
MODE=${1:-weak}
mkdir -p "$OUT"

if [ "$MODE" = test ]; then
  exec "$PY" -m pytest -q -m gpu tests/verify/test_verify.py
fi

if [ ! -f "$DATA/feedbench-sample.json" ]; then
  "$PY" -m feedbench.cli sample "$DATA" --images 8192 --seed 0 --per-shard 256
fi
nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv || true
nproc

# every loader: baseline = stock DataLoader (PIL, pinned, cores/GPU − 2 workers: 30 and 14);
# dali-example = DALI wired as in its ResNet-50 example (4 threads); torch, dali, wds = ours.
LOADERS=baseline,dali-example,torch,dali,wds
COMMON=(--gpus 1,2 --loader "$LOADERS" --device cuda --keep-going --run-timeout 300
  --interleave "${INTERLEAVE:-0}")  # 0: as the recorded runs (no paired phase)

case "$MODE" in
  smoke)
    "$PY" -m feedbench.cli verify "$DATA" "${COMMON[@]}" --model resnet18 --image-size 128 \
      --batch-size 64 --steps 20 --warmup 5 --json "$OUT/verify-smoke.json"
    ;;
  weak)
    "$PY" -m feedbench.cli verify "$DATA" "${COMMON[@]}" --model resnet50 --batch-size 256 \
      --scaling weak --steps 200 --warmup 20 --json "$OUT/verify-weak.json"
    ;;
  tune)
    # one verify per variant (its own --json), 2 GPUs only: the issue's goal is at 2 GPUs.
    # REPEAT=K runs the synthetic ceiling and every variant K times, interleaved (files
    # tune-NAME-rK.json; verify_table.py then compares each run with its own repeat's ceiling
    # and prints mean ± std per variant). SYNTHETIC=0 skips the ceiling runs; SYNCED_CEILING=1
    # adds the synthetic run with the host waiting for the GPU after every batch (diagnostic).
    GPUS=${GPUS:-2}
    STEPS=${STEPS:-100}
    REPEAT=${REPEAT:-1}
    SYNTHETIC=${SYNTHETIC:-1}
    # default variants: the open questions of 2026-11-30 (BENCHMARKS.md, "Pacing the DALI
    # loader"): the explicit pace against no pace, and CPU affinity with the pace
    VARIANTS=${VARIANTS:-"high-t6|--stream-priority high --workers 6;\
high-t6-pace2|--stream-priority high --workers 6 -o dali:pace=2;\
high-t6-nopace|--stream-priority high --workers 6 -o dali:pace=0;\
high-t6-split|--stream-priority high --workers 6 --cpu-affinity split"}
    TUNE=(--gpus "$GPUS" --device cuda --keep-going --run-timeout 300 --interleave 0 --model resnet50
      --batch-size 256 --scaling weak --steps "$STEPS" --warmup 20 --no-plots)
    # EXTRA: options for every run of this call, the ceilings too (e.g. "--ddp-option
    # broadcast_buffers=false"), so each variant is compared with a ceiling trained the same way
    # shellcheck disable=SC2206
    TUNE+=(${EXTRA:-})
    IFS=';' read -ra ROWS <<< "$VARIANTS"
    for r in $(seq 1 "$REPEAT"); do
      suffix=$([ "$REPEAT" -gt 1 ] && echo "-r$r" || true)
      if [ "$SYNTHETIC" != 0 ]; then
        "$PY" -m feedbench.cli verify "$DATA" "${TUNE[@]}" --loader synthetic \
          --json "$OUT/tune-synthetic$suffix.json" | grep -E "^(synthetic|summary)" || true
      fi
      if [ "${SYNCED_CEILING:-0}" != 0 ]; then  # what waiting for the GPU every step costs
        "$PY" -m feedbench.cli verify "$DATA" "${TUNE[@]}" --loader synthetic --sync-each-step \
          --stream-priority high --json "$OUT/tune-synthetic-synced$suffix.json" \
          | grep -E "^synthetic" | sed "s/^/synced$suffix: /" || true
      fi
      for row in "${ROWS[@]}"; do
        name=${row%%|*}
        opts=${row#*|}
        loader=dali  # a variant may name another: "name|--loader torch -o torch:..."
        if [[ $opts =~ --loader\ ([a-z]+) ]]; then
          loader=${BASH_REMATCH[1]}
          opts=${opts/--loader $loader/}
        fi
        # shellcheck disable=SC2086
        "$PY" -m feedbench.cli verify "$DATA" "${TUNE[@]}" --loader "$loader" --no-synthetic $opts \
          --json "$OUT/tune-$name$suffix.json" | grep -E "^$loader" | sed "s/^/$name$suffix: /" || true
      done
    done
    "$PY" scripts/verify_table.py "$OUT"/tune-*.json
    ;;
  strong)
    "$PY" -m feedbench.cli verify "$DATA" "${COMMON[@]}" --model resnet50 --batch-size 512 \
      --scaling strong --steps 200 --warmup 20 --json "$OUT/verify-strong.json"
    ;;
  *)
    echo "usage: $0 test|smoke|weak|strong|tune" >&2
    exit 2
    ;;
esac
