#!/usr/bin/env bash
# The screenshots of the report and compare pages in docs/img/ (docs/compare-and-report.md),
# made from the recorded dev-VM scans of benchmarks/2026-12-03-devvm-plan/ (1-16 consumers):
# headless Chromium draws the whole page 1280 px wide, then the image is cut below the page's
# last line and reduced to 64 colours (text stays sharp, each file well under 400 KB). About
# 20 s. Needs chromium (Debian: apt-get install chromium). From the repository root:
#
#   scripts/docs_screenshots.sh
#
# Environment: PY (default python3), CHROMIUM (default chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
CHROMIUM=${CHROMIUM:-chromium}
root=$PWD
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for name in lat10 lat2 s3; do
  gunzip -c "benchmarks/2026-12-03-devvm-plan/scan-$name.json.gz" >"$tmp/scan-$name.json"
done
# in the folder of the results files, so the pages name them as a user would
cd "$tmp"
"$PY" -m feedbench report scan-lat10.json --html scan-report.html >/dev/null
"$PY" -m feedbench compare scan-lat2.json scan-s3.json -L disk-2ms -L rclone-s3 --no-plots \
  --json compare.json >/dev/null
"$PY" -m feedbench report compare.json --html compare.html >/dev/null
for page in scan-report compare; do
  "$CHROMIUM" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,6000 \
    --screenshot="$tmp/$page.png" "file://$tmp/$page.html" 2>/dev/null
  "$PY" - "$tmp/$page.png" "$root/docs/img/$page.png" <<'PYEOF'
import sys

import numpy as np
from PIL import Image

shot = Image.open(sys.argv[1]).convert("RGB")
ink = np.where((np.asarray(shot.convert("L")) < 250).any(axis=1))[0]
page = shot.crop((0, 0, shot.width, min(shot.height, int(ink.max()) + 24)))
page.quantize(colors=64, dither=Image.Dither.NONE).save(sys.argv[2], optimize=True)
print(sys.argv[2], page.size)
PYEOF
done
