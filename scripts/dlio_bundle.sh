#!/usr/bin/env bash
# Pack DLIO 2.0.0 (MLPerf Storage's benchmark, dlio-benchmark) and the Python packages it needs
# beyond the GPU machine's own into .xfer/dlio.tar, for scripts/bench_dlio.py on that machine
# (Python 3.12, no package registry; it has numpy, pandas, h5py, psutil, Pillow, mpi4py, torch).
#
#   scripts/dlio_bundle.sh                      # here: → .xfer/dlio.tar (≈ 4 MB)
#   . scripts/device_dlio_env.sh                # there: → /tmp/dlio-site, /tmp/dlio-python
#   python3 scripts/bench_dlio.py ... --dlio-python /tmp/dlio-python
#
# What is packed (wheels/, each --no-deps, versions those of the reference /work/dlio-venv):
# dlio-benchmark 2.0.0, pydftracer 1.0.2 (its tracer; compiled: cp312 manylinux_2_34, so the
# target needs glibc >= 2.34, or DFTRACER_ENABLE=0 as the dlio-lean runs set), hydra-core,
# omegaconf, antlr4-python3-runtime 4.9.3 (an sdist: built here into a wheel), PyYAML (cp312)
# and packaging (hydra's). DLIO's own requirements are not followed: they name a placeholder
# (nvidia-dali-cuda110) that fails to install, and TensorFlow, torchvision and torchaudio, which
# its pytorch / npz path never uses.
#
# stub/tensorflow/__init__.py: DLIO imports tensorflow when it starts (main → profiler_factory →
# tf_profiler: `import tensorflow as tf`, read only for profiler=tensorboard); its other
# TensorFlow parts (framework, reader, loader, generator, checkpointing) are imported only when
# a config picks them. The stub makes that import succeed and answers any attribute with an
# AttributeError that says it is the stub.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
out="$here/.xfer/dlio.tar"
pyver=3.12
max_mib=60
pip=${PIP:-python3 -m pip}
case "${1:-}" in
-h | --help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; echo "Options: --out FILE (default .xfer/dlio.tar)"; exit 0 ;;
--out) out=$(realpath -m "$2") ;;
"") ;;
*) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
esac

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/wheels" "$stage/stub/tensorflow"
# binaries for the target's CPython and glibc (pydftracer 1.0.2 has only manylinux_2_34 wheels)
$pip download -q --no-deps --only-binary=:all: -d "$stage/wheels" \
    --python-version "$pyver" --implementation cp --abi "cp${pyver/./}" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64 \
    dlio-benchmark==2.0.0 pydftracer==1.0.2 hydra-core==1.3.8 omegaconf==2.3.1 \
    PyYAML==6.0.4 packaging==26.4
# antlr4's runtime is published as an sdist only: a pure-Python wheel, built here
$pip wheel -q --no-deps -w "$stage/wheels" antlr4-python3-runtime==4.9.3

cat >"$stage/stub/tensorflow/__init__.py" <<'EOF'
"""Not TensorFlow: a stand-in so that DLIO 2.0.0 starts without it (feedbench's
scripts/dlio_bundle.sh). DLIO imports tensorflow at start-up (profiler/tf_profiler.py, through
profiler_factory, which main.py imports) and reads it only for profiler=tensorboard; its other
TensorFlow parts are imported only when a config picks framework=tensorflow, format=tfrecord or
data_loader=tensorflow. Every attribute read here raises AttributeError naming this stub."""

__version__ = "0.0.0+feedbench.stub"
FEEDBENCH_STUB = True


def __getattr__(name):
    raise AttributeError(
        f"tensorflow.{name}: this is feedbench's TensorFlow stub ({__file__}), not TensorFlow; "
        "DLIO's TensorFlow paths (framework/format/data_loader tensorflow, tfrecord, "
        "profiler=tensorboard) need the real one"
    )
EOF

(cd "$stage/wheels" && ls) >"$stage/CONTENTS"
echo "stub/tensorflow/__init__.py" >>"$stage/CONTENTS"
mkdir -p "$(dirname "$out")"
tar -C "$stage" -cf "$out" CONTENTS wheels stub
bytes=$(stat -c %s "$out")
echo "DLIO bundle: $out ($((bytes / 1024)) KiB):"
sed 's/^/  /' "$stage/CONTENTS"
if [ "$bytes" -gt $((max_mib * 1048576)) ]; then
    echo "error: larger than ${max_mib} MB, more than one file carries" >&2
    exit 1
fi
if [[ "$out" == "$here"/* ]] && ! git -C "$here" check-ignore -q "$out" 2>/dev/null; then
    echo "  warning: $out is not ignored by git (add .xfer/ to .gitignore)" >&2
fi
