#!/usr/bin/env bash
# After bench_headstart.sh on the same warm machine (or cold: carry .xfer/extra.tar): torch and
# wds at 256 and 64 per GPU with their CPU decode, 2 repeats at 256, and the scans of both at 256
# (wds from the shards) against verify. nvJPEG through torchvision lost at 256 (0.70 of the
# ceiling against the CPU decode's 0.97): this measures the CPU decode the default keeps.
set -u
if [ ! -d /tmp/site/webdataset ]; then
  mkdir -p /tmp/extra && tar -xf .xfer/extra.tar -C /tmp/extra
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/extra/wheels/*.whl 2>&1 | tail -1
  rm -rf /tmp/site/typer /tmp/site/typer-*
fi
export PYTHONPATH=/tmp/site:$PWD
D=${DATA:-/tmp/fb32k}
[ -f "$D/feedbench-sample.json" ] || python3 -m feedbench.cli sample "$D" --images 32768 --seed 0 --per-shard 256 --jobs 16 >/dev/null
CPU=(-o torch:decode=cpu -o wds:decode=cpu)
V=(--gpus 1 --device cuda --model resnet50 --keep-going --run-timeout 100 --no-plots --warmup 30
  --interleave 0)  # as recorded (run 14): no paired phase
for r in 1 2; do
  timeout 170 python3 -m feedbench.cli verify "$D" "${V[@]}" -b 256 --steps 200 --loader torch,wds \
    "${CPU[@]}" --json "$OUT/v256-r$r.json" | grep -E "^(synthetic|torch|wds|error)"
done
for L in wds torch; do
  F=$([ $L = wds ] && echo shards || echo tree)
  timeout 110 python3 -m feedbench.cli scan "$D" --loader $L --format $F --consumers 1 \
    --profile resnet50-h200 -b 256 --passes warm --repeat 2 --emulate auto --no-plots \
    --loader-option decode=cpu --json "$OUT/s256-$L.json" | grep -E "^(emulated|verdict|error)|·"
done
python3 -m feedbench.cli compare "$OUT"/s256-*.json "$OUT"/v256-r*.json --passes warm --no-plots | tail -12
timeout 150 python3 -m feedbench.cli verify "$D" "${V[@]}" -b 64 --steps 300 --loader torch,wds \
  "${CPU[@]}" --json "$OUT/v64.json" | grep -E "^(synthetic|torch|wds|error)"
