# Source on the GPU machine (the `device` tool) after the DALI parts have been copied to /tmp/asm
# (../shared/device/README.md): installs DALI, webdataset and .xfer/extra.tar's wheels (simplejpeg,
# matplotlib, rich, nvidia-ml-py, ...) into /tmp/site once per warm machine, and puts them and the
# repository on PYTHONPATH.   Usage: `. scripts/device_env.sh`
mkdir -p /tmp/extra
if [ -f .xfer/extra.tar ] && [ ! -d /tmp/extra/wheels ]; then tar -xf .xfer/extra.tar -C /tmp/extra; fi
if [ ! -d /tmp/site/nvidia/dali ]; then
  cat /tmp/asm/part* | tar -x -C /tmp/asm
  # a wheel in both sets (braceexpand) once: pip refuses the same package twice
  extra=$(for w in /tmp/extra/wheels/*.whl; do [ -e "/tmp/asm/wheels/${w##*/}" ] || echo "$w"; done)
  # shellcheck disable=SC2086
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    /tmp/asm/wheels/*.whl $extra
fi
# the carried typer needs pydantic, which the machine lacks; its own typer works
rm -rf /tmp/site/typer /tmp/site/typer-*
export PYTHONPATH=/tmp/site:$PWD
