#!/usr/bin/env bash
# One device call (run 9b, BENCHMARKS): carry .xfer/extra.tar (feedbench's wheels + webdataset)
# and this script; scan torch and wds at 64 per GPU with --emulate gpu, then verify the same.
set -u
mkdir -p /tmp/extra && tar -xf .xfer/extra.tar -C /tmp/extra
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/extra/wheels/*.whl 2>&1 | tail -1
rm -rf /tmp/site/typer /tmp/site/typer-*
export PYTHONPATH=/tmp/site:$PWD
python3 -m feedbench.cli sample /tmp/fb8k --images 8192 --seed 0 --per-shard 256 >/dev/null 2>&1
for L in torch wds; do
  F=""; [ "$L" = wds ] && F="--format shards"
  timeout 60 python3 -m feedbench.cli scan /tmp/fb8k --loader $L --consumers 1 --profile resnet50-h200 -b 64 --passes warm --repeat 2 --emulate gpu $F --no-plots --json $OUT/scan-$L.json 2>&1 | grep -E "^(emulated step|verdict)"
done
timeout 150 python3 -m feedbench.cli verify /tmp/fb8k --gpus 1 --device cuda --model resnet50 --keep-going --run-timeout 100 --no-plots --warmup 20 --interleave 0 -b 64 --steps 100 --loader torch,wds --json $OUT/verify.json 2>&1 | grep -E "^(synthetic|torch|wds):"
