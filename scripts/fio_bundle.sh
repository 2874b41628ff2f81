#!/usr/bin/env bash
# Pack fio and the shared libraries it loads into .xfer/fio/, to carry to a machine without fio
# and without a package registry (the GPU machine: at most 64 MiB per call, the repo included).
#
#   scripts/fio_bundle.sh                 # fio from PATH → .xfer/fio/ (+ run-fio wrapper)
#   scripts/fio_bundle.sh --with-glibc    # also glibc + its loader: for targets with an older glibc
#   env -i .xfer/fio/run-fio --version    # the wrapper needs nothing from the environment
#
# What is packed: the fio binary and every library `ldd` resolves for it, copied under its soname,
# except glibc's libc, libm, libpthread, libdl, librt and the loader (ld-linux), which the target
# provides. `run-fio` puts its own directory first in LD_LIBRARY_PATH
# and execs fio. Debian's fio links the rbd/rados/gluster/nbd/pmem engines, so the bundle is large
# (≈ 80 MB on Debian 12); above --max-mib (default 48) it is stored as one xz archive (≈ 22 MB)
# that run-fio unpacks once into ${FIO_BUNDLE_CACHE:-${TMPDIR:-/tmp}/fio-bundle-<id>}.
#
# The libraries need the glibc they were built against (the script prints the newest GLIBC_
# symbol version they use: 2.36 on Debian 12). A target with an older glibc (Ubuntu 22.04 has
# 2.35) fails with "version `GLIBC_2.36' not found": pack with --with-glibc, and run-fio then
# starts fio through the bundled loader (ld-linux … --library-path DIR), so nothing of the
# target's C library is used.
set -euo pipefail

usage() {
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
    cat <<'EOF'
Options:
  --fio PATH        the fio to pack (default: fio on PATH)
  --out DIR         bundle directory (default: .xfer/fio in the repository)
  --with-glibc      also pack glibc and its loader, and run fio through them
  --compress MODE   auto (xz when larger than --max-mib), yes, no (default: auto)
  --max-mib N       size above which auto compresses (default: 48)
EOF
}

here=$(cd "$(dirname "$0")/.." && pwd)
fio_bin=""
out="$here/.xfer/fio"
with_glibc=0
compress=auto
max_mib=48
while [ $# -gt 0 ]; do
    case "$1" in
    --fio) fio_bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --with-glibc) with_glibc=1; shift ;;
    --compress) compress=$2; shift 2 ;;
    --max-mib) max_mib=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$compress" in auto | yes | no) ;; *) echo "--compress takes auto, yes or no" >&2; exit 2 ;; esac

if [ -z "$fio_bin" ]; then
    fio_bin=$(command -v fio || true)
fi
if [ -z "$fio_bin" ] || [ ! -x "$fio_bin" ]; then
    echo "fio not found: apt-get install -y fio (or --fio PATH)" >&2
    exit 1
fi
fio_bin=$(readlink -f "$fio_bin")
if ! ldd "$fio_bin" >/dev/null 2>&1; then
    echo "$fio_bin is not a dynamic executable: copy it alone" >&2
    exit 1
fi
if ldd "$fio_bin" | grep -q 'not found'; then
    echo "some libraries of $fio_bin are missing here:" >&2
    ldd "$fio_bin" | grep 'not found' >&2
    exit 1
fi

out=$(realpath -m "$out")
glibc_re='^(libc|libm|libpthread|libdl|librt)\.so|^ld-linux'
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp "$fio_bin" "$stage/fio"

packed=0
skipped=()
# "libfoo.so.1 => /path/libfoo.so.1.2.3 (0x…)" and "/lib64/ld-linux-x86-64.so.2 (0x…)"
while read -r name arrow path _; do
    if [ "$arrow" != "=>" ]; then # the loader line: no "=>"
        path=$name
        name=$(basename "$name")
    fi
    case "$path" in /*) ;; *) continue ;; esac # linux-vdso.so.1 and the like: no file
    if [[ "$name" =~ $glibc_re ]] && [ "$with_glibc" = 0 ]; then
        skipped+=("$name")
        continue
    fi
    cp -L "$path" "$stage/$name"
    packed=$((packed + 1))
done < <(ldd "$fio_bin")

# the newest glibc symbol version anything in the bundle asks for
need=$(for f in "$stage"/*; do
    if command -v objdump >/dev/null; then objdump -T "$f" 2>/dev/null; else strings "$f"; fi
done | grep -o 'GLIBC_2\.[0-9]*' | sort -u -t. -k2,2n | tail -1 | sed 's/GLIBC_//')
echo "${need:-unknown}" >"$stage/glibc-needed"
"$fio_bin" --version >"$stage/fio-version"

cat >"$stage/run-fio" <<'EOF'
#!/bin/sh
# Run the bundled fio with the libraries beside it (made by scripts/fio_bundle.sh).
PATH=${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}
export PATH
case "$0" in */*) here=${0%/*} ;; *) here=. ;; esac
here=$(cd "$here" && pwd) || exit 1
dir=$here
if [ -f "$here/fio-bundle.tar.xz" ]; then
    id=$(cat "$here/fio-bundle.id")
    dir=${FIO_BUNDLE_CACHE:-${TMPDIR:-/tmp}/fio-bundle-$id}
    if [ ! -x "$dir/fio" ]; then
        tmp=$(mktemp -d "${dir}.XXXXXX") || exit 1
        if command -v xz >/dev/null 2>&1; then
            xz -dc "$here/fio-bundle.tar.xz" | tar -xf - -C "$tmp"
        else # no xz: Python's tarfile reads xz through the lzma module
            python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
                "$here/fio-bundle.tar.xz" "$tmp"
        fi || { echo "run-fio: cannot unpack $here/fio-bundle.tar.xz" >&2; rm -rf "$tmp"; exit 1; }
        mv "$tmp" "$dir" 2>/dev/null || rm -rf "$tmp" # another run-fio unpacked it first
    fi
fi
for loader in "$dir"/ld-linux*.so.*; do
    if [ -e "$loader" ]; then # packed --with-glibc: the target's C library is not used at all
        exec "$loader" --library-path "$dir" "$dir/fio" "$@"
    fi
done
need=$(cat "$dir/glibc-needed" 2>/dev/null)
have=$(getconf GNU_LIBC_VERSION 2>/dev/null | sed 's/^glibc //')
if [ -n "$need" ] && [ -n "$have" ] &&
    [ "$(printf '%s\n%s\n' "$need" "$have" | sort -t. -k1,1n -k2,2n | head -1)" != "$need" ]; then
    echo "run-fio: this bundle needs glibc >= $need, this machine has $have:" \
        "rebuild it with scripts/fio_bundle.sh --with-glibc" >&2
fi
LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
exec "$dir/fio" "$@"
EOF
chmod +x "$stage/run-fio"

raw_bytes=$(du -sb "$stage" | cut -f1)
raw_mib=$(((raw_bytes + 1048575) / 1048576))
if [ "$compress" = yes ] || { [ "$compress" = auto ] && [ "$raw_mib" -gt "$max_mib" ]; }; then
    echo "packing ${raw_mib} MiB with xz (a minute or so)…" >&2
    packdir=$(mktemp -d)
    trap 'rm -rf "$stage" "$packdir"' EXIT
    (cd "$stage" && find . -maxdepth 1 -type f ! -name run-fio -printf '%P\0' |
        sort -z | tar --null -T - -cf - | xz -6 -T0 >"$packdir/fio-bundle.tar.xz")
    sha256sum "$packdir/fio-bundle.tar.xz" | cut -c1-16 >"$packdir/fio-bundle.id"
    cp "$stage/run-fio" "$stage/glibc-needed" "$stage/fio-version" "$packdir/"
    rm -rf "$stage"
    stage=$packdir
fi

rm -rf "$out"
mkdir -p "$(dirname "$out")"
cp -r "$stage" "$out"
chmod 755 "$out"

echo "fio bundle: $out ($(du -sh "$out" | cut -f1); unpacked ${raw_mib} MiB)"
echo "  $(cat "$out/fio-version"), $packed libraries packed," \
    "glibc parts left to the target: ${skipped[*]:-none}"
echo "  needs glibc >= $(cat "$out/glibc-needed") on the target$(
    [ "$with_glibc" = 1 ] && echo ' (bundled: the target glibc does not matter)')"
if [[ "$out" == "$here"/* ]] && ! git -C "$here" check-ignore -q "$out/run-fio" 2>/dev/null; then
    echo "  warning: $out is not ignored by git (add .xfer/ to .gitignore)" >&2
fi
echo "  test: env -i $out/run-fio --version"
