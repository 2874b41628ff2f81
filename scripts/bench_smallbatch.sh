#!/usr/bin/env bash
# Small batches on one H200 (issue 29): does a loader slow the training step it feeds?
# ResNet-50 bf16, DDP defaults, 1 GPU, 8,192 ImageNet-like JPEGs (made here on first use).
#
# Machine: run-tool kind nvidia-h200, DALI and webdataset carried in parts and
# `. scripts/device_env.sh` sourced first (../shared/device/README.md). From the repository root:
#
#   scripts/bench_smallbatch.sh diag        # 64 per GPU: one thing varied at a time, 1 run each,
#                                           # and the defaults at 256; thread scheduling of the
#                                           # training process (FEEDBENCH_SCHEDSTAT) to RUNS/sched
#   VARIANTS="name|batch|loader|options;..." scripts/bench_smallbatch.sh list   # one run each
#   scripts/bench_smallbatch.sh check B     # the defaults a user gets at B per GPU (64, 256):
#                                           # REPEAT (default 3) verify runs of synthetic,
#                                           # torch, dali, wds, synthetic again (verify's
#                                           # --ceiling-twice on a GPU; ~40 s a run)
#   scripts/bench_smallbatch.sh scans B     # scan's predicted AU for each loader at B (after
#                                           # check B, with its results under OUT/runs/), and
#                                           # `feedbench compare` of the two
#   scripts/bench_smallbatch.sh step B      # scripts/diag_step.py at B: conditions interleaved
#                                           # in one training process (CONDITIONS, ROUNDS;
#                                           # MALLOPT=1: its --mallopt)
#   scripts/bench_smallbatch.sh gen         # only make DATA (IMAGES images), timed
#
# Environment: PY (default python3), DATA (default /tmp/fb8k), IMAGES (default 8192: the size of
# DATA when made here), OUT (default $OUT, else results/), STEPS (default 150), REPEAT (verify
# repeats; FIRST: the first repeat's number, to go on in another call), SCAN_REPEAT (default 3),
# EMULATES (scan's --emulate modes, default "auto", plus sleep at 64), LOADERS (the scans',
# default "torch dali wds"), TAG (names this data's
# results apart), INTERLEAVE (verify's paired blocks, default 25 as verify's on a GPU; runs 9-13
# had none: 0). Tables: scripts/verify_table.py OUT/runs/*.json.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
DATA=${DATA:-/tmp/fb8k}
OUT=${OUT:-results}
# the run tool returns only the first few files of a call, in name order: every result goes under
# OUT/runs/, and all of it, tarred after each run, to OUT/0-smallbatch.tar.gz (named to come first)
RUNS=${RUNS:-$OUT/runs}  # RUNS=/tmp/runs keeps them across calls of a warm machine
STEPS=${STEPS:-150}
MODE=${1:-diag}
mkdir -p "$RUNS" "$OUT"
TAG=${TAG:-}
case "$MODE" in  # these run DALI and wds: a missing install would cost minutes of device time
  check | scans | diag)
    "$PY" -c "import nvidia.dali, webdataset" 2>/dev/null || {
      echo "error: DALI or webdataset does not import here: . scripts/device_env.sh first" >&2
      exit 3
    }
    ;;
esac
if [ ! -f "$DATA/feedbench-sample.json" ]; then
  t0=$SECONDS
  "$PY" -m feedbench.cli sample "$DATA" --images "${IMAGES:-8192}" --seed 0 --per-shard 256 \
    --jobs "$(nproc)" >/dev/null
  echo "sample $DATA (${IMAGES:-8192} images): $((SECONDS - t0)) s, $(du -sh "$DATA" | cut -f1)"
fi
COMMON=(--gpus 1 --device cuda --model resnet50 --keep-going --run-timeout 150 --no-plots
  --warmup 30 --interleave "${INTERLEAVE:-25}")

one() {  # one() NAME BATCH LOADER [options...]: one verify run to OUT/NAME.json
  local name=$1 batch=$2 loader=$3
  shift 3
  local extra=(--no-synthetic)
  [ "$loader" = synthetic ] && extra=()
  local t0=$SECONDS rc
  set +e  # a failed run is reported at the end (exit status), the next runs go on
  "$PY" -m feedbench.cli verify "$DATA" "${COMMON[@]}" -b "$batch" --steps "$STEPS" \
    --loader "$loader" "${extra[@]}" "$@" --json "$RUNS/$name.json" \
    | grep -E "^($loader|error)" | sed "s/^/$name: /"
  rc=${PIPESTATUS[0]}  # verify's own exit status
  set -e
  [ "$rc" = 0 ] || failed=$rc
  echo "$name: $((SECONDS - t0)) s, verify exit $rc"
  # everything so far in one file (the run tool returns a few files per call; a call cut
  # short by its time limit still returns this)
  tar -czf "$OUT/0-smallbatch.tar.gz" -C "$RUNS" . 2>/dev/null || true
}

case "$MODE" in
  diag)
    nproc
    cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list || true
    export FEEDBENCH_SCHEDSTAT=$RUNS/sched
    one b64-synthetic 64 synthetic
    one b64-torch-r0 64 torch -o torch:reserve_cores=0
    one b64-torch-r2 64 torch -o torch:reserve_cores=2
    one b64-dali-r0 64 dali -o dali:reserve_cores=0
    one b64-dali-r2 64 dali -o dali:reserve_cores=2
    one b64-wds-r0 64 wds -o wds:reserve_cores=0
    one b64-wds-r2 64 wds -o wds:reserve_cores=2
    one b64-torch-r2-w8 64 torch --workers 8 -o torch:reserve_cores=2
    one b64-dali-r2-w4 64 dali --workers 4 -o dali:reserve_cores=2
    one b64-dali-r2-nolead 64 dali -o dali:reserve_cores=2 -o dali:pace_lead_ms=0
    one b64-dali-r2-pace0 64 dali -o dali:reserve_cores=2 -o dali:pace=0
    one b64-torch-r4 64 torch -o torch:reserve_cores=4
    one b64-synthetic-2 64 synthetic
    STEPS=100 one b256-synthetic 256 synthetic
    STEPS=100 one b256-torch-r2 256 torch -o torch:reserve_cores=2
    STEPS=100 one b256-dali-r2 256 dali -o dali:reserve_cores=2
    STEPS=100 one b256-wds-r2 256 wds -o wds:reserve_cores=2
    ;;
  list)  # VARIANTS="name|batch|loader|options;..." one run each, in order
    export FEEDBENCH_SCHEDSTAT=$RUNS/sched
    IFS=';' read -ra ROWS <<< "$VARIANTS"
    for row in "${ROWS[@]}"; do
      IFS='|' read -r name batch loader opts <<< "$row"
      # shellcheck disable=SC2086
      one "$name" "$batch" "$loader" $opts
    done
    ;;
  check)
    B=${2:-64}
    failed=0
    for r in $(seq "${FIRST:-1}" "${REPEAT:-3}"); do  # FIRST: a later call's first repeat
      t0=$SECONDS
      set +e  # a failed verify is reported at the end (exit status), the repeats go on
      "$PY" -m feedbench.cli verify "$DATA" "${COMMON[@]}" -b "$B" --steps "$STEPS" \
        --loader torch,dali,wds --json "$RUNS/check$TAG-b$B-r$r.json" | grep -E "^(synthetic|torch|dali|wds|error)"
      rc=${PIPESTATUS[0]}  # verify's own exit status, not grep's
      set -e
      echo "repeat $r: $((SECONDS - t0)) s, verify exit $rc"
      [ "$rc" = 0 ] || failed=$rc
      tar -czf "$OUT/0-smallbatch.tar.gz" -C "$RUNS" . 2>/dev/null || true
    done
    ;;
  scans)  # scan's prediction at B per GPU for each loader (1 consumer, --emulate auto: gpu
    # here), and at 64 the sleep it replaces; then `feedbench compare` against check B's verify
    B=${2:-64}
    for L in ${LOADERS:-torch dali wds}; do
      for E in ${EMULATES:-auto $([ "$B" = 64 ] && echo sleep)}; do
        t0=$SECONDS
        "$PY" -m feedbench.cli scan "$DATA" --loader "$L" --consumers 1 --profile resnet50-h200 \
          -b "$B" --passes warm --repeat "${SCAN_REPEAT:-3}" --emulate "$E" --no-plots $([ "$L" = wds ] && echo --format shards) \
          --json "$RUNS/scan$TAG-b$B-$L-$E.json" | grep -E "^(emulated|verdict|warning)|·" || true
        echo "scan $L b$B $E: $((SECONDS - t0)) s"
        tar -czf "$OUT/0-smallbatch.tar.gz" -C "$RUNS" . 2>/dev/null || true
      done
    done
    for E in auto sleep; do
      ls "$RUNS"/scan"$TAG"-b"$B"-*-"$E".json >/dev/null 2>&1 || continue
      ls "$RUNS"/check"$TAG"-b"$B"-r*.json >/dev/null 2>&1 || continue
      "$PY" -m feedbench.cli compare "$RUNS"/scan"$TAG"-b"$B"-*-"$E".json "$RUNS"/check"$TAG"-b"$B"-r*.json \
        --passes warm --json "$RUNS/compare$TAG-b$B-$E.json" --no-plots || true
    done
    tar -czf "$OUT/0-smallbatch.tar.gz" -C "$RUNS" . 2>/dev/null || true
    exit 0
    ;;
  step)  # where the step goes at B: scripts/diag_step.py, conditions interleaved in one process
    B=${2:-64}
    "$PY" scripts/diag_step.py --data "$DATA" --batch "$B" --rounds "${ROUNDS:-3}" \
      --steps "${STEPS:-120}" --skip "${SKIP:-15}" \
      --conditions "${CONDITIONS:-synthetic,torch,torch#slots=0,wds,wds#slots=0,dali}" \
      ${MALLOPT:+--mallopt} --out "$RUNS/step$TAG-b$B.json" 2>&1 | grep -v Warning || true
    tar -czf "$OUT/0-smallbatch.tar.gz" -C "$RUNS" . 2>/dev/null || true
    ;;
  gen) ;;  # DATA made above
  *)
    echo "usage: $0 diag|list|check B|scans B|step B|gen" >&2
    exit 2
    ;;
esac
ls "$RUNS"/check*.json "$RUNS"/b*.json >/dev/null 2>&1 &&
  { "$PY" scripts/verify_table.py "$RUNS"/check*.json "$RUNS"/b*.json 2>/dev/null || true; }
tar -czf "$OUT/0-smallbatch.tar.gz" -C "$RUNS" . 2>/dev/null || true
exit "${failed:-0}"  # check, list, diag: non-zero when a verify failed
