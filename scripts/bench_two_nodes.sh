#!/usr/bin/env bash
# A 2-node torchrun scan on loopback (issue 28): two torchrun agents on this machine as two nodes
# (--nnodes 2, --node-rank 0 and 1, rendezvous on 127.0.0.1), RANKS consumers each, then plan's
# split of what one client pulls from what the storage serves to all. From the repository root:
#
#   scripts/bench_two_nodes.sh
#
# Environment: PY (default python3), DATA (default /tmp/fb400-tree), OUT (default results/),
# IMAGES (default 400), RANKS (per node, default 1), STAGES (default read,decode), RATE
# (samples/s per accelerator, default 100), AT (accelerators, default 64), PORT (default 29561).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
DATA=${DATA:-/tmp/fb400-tree}
OUT=${OUT:-results}
PORT=${PORT:-29561}
mkdir -p "$OUT"
if [ ! -d "$DATA/images" ]; then
  "$PY" -m feedbench sample "$DATA" -n "${IMAGES:-400}" --format tree --jobs 1 >/dev/null
fi
SCAN=$OUT/two-nodes-scan.json
for NODE in 0 1; do  # one scan command per node, as on two machines
  "$PY" -m torch.distributed.run --nnodes 2 --nproc-per-node "${RANKS:-1}" --node-rank $NODE \
    --master-addr 127.0.0.1 --master-port "$PORT" -m feedbench consumer "$DATA/images" \
    --stages "${STAGES:-read,decode}" -b 4 --workers 1 --repeat 3 --no-plots --json "$SCAN" &
done
wait
"$PY" -m feedbench plan "$SCAN" --rate "${RATE:-100}" --at "${AT:-64}" \
  --json "$OUT/two-nodes-plan.json"
