#!/usr/bin/env bash
# verify --interleave on one GPU (issue 29): each loader's fraction of the synthetic ceiling
# paired block by block in one training process, beside its fraction against the ceiling's own
# runs (which the host's drift between runs blurs at a small batch). torch and wds only: no DALI
# parts are carried. ResNet-50 bf16, DDP of one rank, IMAGES ImageNet-like JPEGs made there.
#
# Machine: run-tool kind nvidia-h100-x1 or nvidia-h200. Call 1 carries .xfer/scipy.tar and copies
# it to /tmp (`cp .xfer/scipy.tar /tmp/`); call 2, on the still-warm machine, carries
# .xfer/extra.tar (scripts/device_extra.sh) and runs this from the repository root:
#
#   BATCHES="64" scripts/bench_paired.sh
#
# Environment: OUT (default $OUT, else results/), DATA (default /tmp/fb8k), IMAGES (8192),
# BATCHES ("64 256"), LOADERS (torch,wds), STEPS (200: the window's, and as many loader steps
# paired), BLOCK (25 steps a block).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results}
DATA=${DATA:-/tmp/fb8k}
IMAGES=${IMAGES:-8192}
BATCHES=${BATCHES:-"64 256"}
LOADERS=${LOADERS:-torch,wds}
STEPS=${STEPS:-200}
BLOCK=${BLOCK:-25}
mkdir -p "$OUT"
if [ ! -d /tmp/site/webdataset ]; then  # the carried wheels, once per machine
  mkdir -p /tmp/extra
  tar -xf .xfer/extra.tar -C /tmp/extra
  if [ -f /tmp/scipy.tar ]; then tar -xf /tmp/scipy.tar -C /tmp/extra; fi
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    /tmp/extra/wheels/*.whl
  rm -rf /tmp/site/typer /tmp/site/typer-*  # the carried typer needs pydantic; the machine's works
fi
export PYTHONPATH=/tmp/site:$PWD
if [ ! -f "$DATA/feedbench-sample.json" ]; then
  python3 -m feedbench.cli sample "$DATA" --images "$IMAGES" --seed 0 --per-shard 256 --jobs 16
fi
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for b in $BATCHES; do
  python3 -m feedbench.cli verify "$DATA" --consumers 1 --device cuda --model resnet50 -b "$b" \
    --steps "$STEPS" --warmup 30 --loader "$LOADERS" --interleave "$BLOCK" --no-plots \
    --json "$OUT/paired-b$b.json"
done
