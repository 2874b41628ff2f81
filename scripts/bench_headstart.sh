#!/usr/bin/env bash
# One device call without DALI (no parts): do torch (nvJPEG at 256 since decode=auto) and wds keep
# ResNet-50 fed at 256
# per GPU on a 16-core H200 once verify gives them no head start (981e300), and do the scans,
# whose GPU step now runs ahead (9bcebf6), say the same? Carry .xfer/extra.tar
# (scripts/device_extra.sh) after a call that copied .xfer/scipy.tar (scipy's wheel) to /tmp.
# 200 steps, verify's default: a queue filled in a slow step drains inside it, where verify says so.
# Results under $OUT, the cheapest first: a call cut short keeps what it finished.
set -u
mkdir -p /tmp/extra && tar -xf .xfer/extra.tar -C /tmp/extra && tar -xf /tmp/scipy.tar -C /tmp/extra
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/extra/wheels/*.whl 2>&1 | tail -1
rm -rf /tmp/site/typer /tmp/site/typer-*  # the carried typer needs pydantic; the machine's works
export PYTHONPATH=/tmp/site:$PWD
# the DALI loader's per-batch labels.pin_memory() against a reused pinned buffer (torch only)
timeout 60 python3 scripts/bench_label_copy.py | tee "$OUT/label-copy.txt"
DATA=${DATA:-/tmp/fb32k}
python3 -m feedbench.cli sample "$DATA" --images 32768 --seed 0 --per-shard 256 --jobs 16 >/dev/null
# torchvision's nvjpeg: the GPU decode the torch and wds loaders lack, and its cost to the step
timeout 150 python3 scripts/bench_nvjpeg.py --data "$DATA" --json "$OUT/nvjpeg.json" 2>&1 | grep -v Warn
timeout 260 python3 -m feedbench.cli verify "$DATA" --gpus 1 --device cuda --model resnet50 \
  --keep-going --run-timeout 150 --no-plots --warmup 30 --interleave 0 -b 256 --steps 200 --loader torch,wds \
  --json "$OUT/verify-b256.json" | grep -E "^(synthetic|torch|wds|error)"
# torch decodes on the GPU at 256 on 16 cores (decode="auto"); its CPU decode beside it
timeout 120 python3 -m feedbench.cli verify "$DATA" --gpus 1 --device cuda --model resnet50 \
  --keep-going --run-timeout 100 --no-plots --warmup 30 --interleave 0 -b 256 --steps 200 --loader torch \
  --no-synthetic -o torch:decode=cpu --json "$OUT/verify-b256-torchcpu.json" | grep -E "^(torch|error)"
# the GPU tests of nvJPEG decode and of scan's queued GPU step
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/loaders/test_loaders_gpu.py \
  tests/scan/test_emulate.py -k "nvjpeg or slots or queued" 2>&1 | tail -4
for L in torch wds; do
  timeout 130 python3 -m feedbench.cli scan "$DATA" --loader $L --consumers 1 \
    --profile resnet50-h200 -b 256 --passes warm --repeat 2 --emulate auto --no-plots \
    --json "$OUT/scan-b256-$L.json" | grep -E "^(emulated|verdict|warning|error)|·"
done
python3 -m feedbench.cli compare "$OUT"/scan-b256-*.json "$OUT/verify-b256.json" \
  --passes warm --no-plots | tail -20
