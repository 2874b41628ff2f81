set -u
mkdir -p /tmp/extra && tar -xf .xfer/extra.tar -C /tmp/extra
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site /tmp/extra/wheels/*.whl
rm -rf /tmp/site/typer /tmp/site/typer-*
export PYTHONPATH=/tmp/site:$PWD
. scripts/device_dlio_env.sh
nproc > $OUT/host.txt; free -g | head -2 >> $OUT/host.txt; git log -1 --format=%H >> $OUT/host.txt 2>/dev/null
test -d /tmp/u3d || timeout 150 python3 -m feedbench sample /tmp/u3d --workload unet3d --size 20 --seed 0 --jobs 16 > $OUT/sample.txt 2>&1
echo sample rc=$?; tail -3 $OUT/sample.txt; ls /tmp/u3d/data | wc -l
timeout 540 python3 scripts/bench_dlio.py --data /tmp/u3d/data --work /tmp/dlio-work3 --out $OUT/dlio3-copies4.json \
  --dlio-python /tmp/dlio-python --consumers 1,2 --caches warm --repeat 2 --copies 4 --tools dlio-lean,feedbench \
  --run-timeout 120 --quiet-load 2 --quiet-wait 5 > $OUT/bench3.txt 2>&1; echo bench rc=$?
tail -25 $OUT/bench3.txt
tar -czf $OUT/logs3.tgz --exclude='*.npz' -C /tmp/dlio-work3 runs 2>/dev/null; ls -la $OUT/logs3.tgz
