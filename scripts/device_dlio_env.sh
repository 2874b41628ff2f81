# Source on the GPU machine, from the repository root, after `. scripts/device_env.sh`: installs
# .xfer/dlio.tar (made by scripts/dlio_bundle.sh: DLIO 2.0.0, its Python dependencies, a
# TensorFlow stub) into /tmp/dlio-site once per warm machine (again when the tar changes), and
# writes /tmp/dlio-python, the Python to give bench_dlio.py: the machine's python3 with
# /tmp/dlio-site and the stub (/tmp/dlio-stub) first on PYTHONPATH.
#   Usage: `. scripts/device_dlio_env.sh`, then
#   python3 scripts/bench_dlio.py --data D --work W --dlio-python /tmp/dlio-python
if [ ! -f .xfer/dlio.tar ]; then
  echo "device_dlio_env: no .xfer/dlio.tar (run scripts/dlio_bundle.sh, carry .xfer/dlio.tar)" >&2
  false # the status the sourcing shell sees
elif [ "$(cat /tmp/dlio-site/.bundle-id 2>/dev/null)" != "$(sha256sum .xfer/dlio.tar | cut -c1-16)" ]; then
  rm -rf /tmp/dlio-site /tmp/dlio-stub /tmp/dlio-bundle && mkdir -p /tmp/dlio-bundle
  tar -xf .xfer/dlio.tar -C /tmp/dlio-bundle
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/dlio-site \
    /tmp/dlio-bundle/wheels/*.whl &&
    cp -r /tmp/dlio-bundle/stub /tmp/dlio-stub &&
    sha256sum .xfer/dlio.tar | cut -c1-16 >/tmp/dlio-site/.bundle-id
  rm -rf /tmp/dlio-site/tests # DLIO's wheel ships a top-level `tests` package
  cat >/tmp/dlio-python <<EOF
#!/bin/sh
# DLIO's Python (scripts/device_dlio_env.sh): its packages and the TensorFlow stub come first
PYTHONPATH=/tmp/dlio-site:/tmp/dlio-stub\${PYTHONPATH:+:\$PYTHONPATH}
export PYTHONPATH
exec $(command -v python3) "\$@"
EOF
  chmod +x /tmp/dlio-python
  # pydftracer (DLIO's tracer, on in bench_dlio's `dlio` runs) is built for glibc >= 2.34
  /tmp/dlio-python -c 'import pydftracer, dlio_benchmark.main' ||
    echo "device_dlio_env: DLIO does not import (above); with DFTRACER_ENABLE=0" \
      "$(DFTRACER_ENABLE=0 /tmp/dlio-python -c 'import dlio_benchmark.main' 2>/dev/null &&
        echo 'it does: use --tools dlio-lean,feedbench' || echo 'neither')" >&2
fi
