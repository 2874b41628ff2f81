#!/usr/bin/env bash
# Build .xfer/extra.tar: feedbench's own dependencies that the GPU machine lacks (it has torch,
# torchvision, numpy, pillow, psutil, typer, jinja2), as wheels for its Python 3.12.
# scripts/device_env.sh installs them beside the DALI parts (../shared/device/dali-parts.sh).
# scipy (35 MB) goes with the DALI parts instead (into their cache: run dali-parts.sh after
# this): with it, extra.tar and the tracked tree would pass one call's 64 MiB.
set -euo pipefail
CACHE=${EXTRA_CACHE:-$HOME/.cache/feedbench-device-extra}
rm -rf "$CACHE/wheels" && mkdir -p "$CACHE/wheels" .xfer
plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps "${plat[@]}" -d "$CACHE/wheels" \
  rich markdown-it-py mdurl pygments nvidia-ml-py matplotlib contourpy cycler fonttools kiwisolver \
  pyparsing python-dateutil simplejpeg fsspec crc32c webdataset braceexpand
python3 -m pip download -q --no-deps "${plat[@]}" -d "${DALI_CACHE:-$HOME/.cache/feedbench-device}/wheels" scipy
tar -C "$CACHE" -cf .xfer/extra.tar wheels
ls -la .xfer/extra.tar
