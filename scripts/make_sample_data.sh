#!/usr/bin/env bash
# Regenerate the bundled sample_data/ (deterministic: same output for the same seed and libjpeg).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf sample_data
feedbench sample sample_data --images 36 --per-shard 9 --seed 0
