#!/usr/bin/env bash
# Run the aarch64 wheel on a real arm64 user space, emulated: a Debian arm64 root made by
# debootstrap, its Python 3.11 run by qemu-user, the aarch64 jax/jaxlib wheels from the
# package registry, then .ci/smoke.py (every op on every path against numpy, the native
# module loaded and called).
#
#   .ci/aarch64-smoke.sh WHEEL [ROOTDIR]
#
# WHEEL: a cp311 aarch64 wheel (.ci/build-wheel.sh aarch64 python3.11 OUTDIR). ROOTDIR: where
# the arm64 root is made, or reused when it already holds Python (default build/arm64root).
# Needs root (debootstrap, chroot), debootstrap and qemu-user-static
# (apt-get install debootstrap qemu-user-static), a Python 3.11 with pip on the host
# (PYTHON, default python3.11) and the Debian mirror (DEBIAN_MIRROR, default deb.debian.org).
#
# No binfmt_misc registration: that is a kernel-wide setting, often not allowed where CI
# runs. Without it nothing inside the root can start another arm64 program, so:
#   - debootstrap runs only its first stage (--foreign: download and unpack the required
#     packages, run nothing), and this script unpacks the other downloaded packages (Python
#     and what it needs) itself; Python needs none of their maintainer scripts;
#   - qemu-aarch64-static starts the root's Python directly, in a venv made there without
#     pip, and the host's pip installs the aarch64 wheels into that venv's site-packages
#     (--platform, --only-binary: nothing is built).
set -euo pipefail
cd "$(dirname "$0")/.."
. .ci/chroot-lib.sh
chroot_stage_args build/arm64root "$@"
ARM=$ROOT
PY=${PYTHON:-python3.11}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
QEMU=$(command -v qemu-aarch64-static) || {
  echo "aarch64-smoke: no qemu-aarch64-static (apt-get install qemu-user-static)" >&2; exit 1; }
case $(basename "$WHEEL") in
  *-cp311-cp311-*aarch64*.whl) ;;
  *) echo "aarch64-smoke: $WHEEL is not a cp311 aarch64 wheel" >&2; exit 1 ;;
esac
stamp() { echo "aarch64-smoke: $(date -u +%H:%M:%S) $*"; }
t0=$(date +%s)

if [ ! -x "$ARM/usr/bin/python3.11" ]; then
  stamp "debootstrap (first stage) of Debian bookworm arm64 into $ARM"
  debootstrap --arch=arm64 --foreign --variant=minbase --include=python3 \
    bookworm "$ARM" "$MIRROR" >"$ARM.debootstrap.log" 2>&1 || {
    tail -20 "$ARM.debootstrap.log" >&2; exit 1; }
  for deb in "$ARM"/var/cache/apt/archives/*.deb; do dpkg-deb -x "$deb" "$ARM"; done
fi
cp "$QEMU" "$ARM/usr/bin/qemu-aarch64-static"
# /proc for what runs inside (XLA reads the CPU's description there). /dev needs no mount:
# debootstrap made its nodes (null, zero, urandom...) in the root, and binding the host's
# /dev there would expose it to a later rm -rf of the root.
chroot_mount -t proc proc "$ARM/proc"
arm() { chroot "$ARM" /usr/bin/qemu-aarch64-static "$@"; }
stamp "the root's Python: $(arm /usr/bin/python3.11 -c 'import platform, sys; print(platform.machine(), sys.version.split()[0])')"

stamp "a venv there, and the aarch64 wheels into it"
rm -rf "$ARM/opt/venv"
arm /usr/bin/python3.11 -m venv --without-pip /opt/venv
SITE=$ARM/opt/venv/lib/python3.11/site-packages
plats=()
for p in manylinux2014_aarch64 manylinux_2_17_aarch64 manylinux_2_27_aarch64 manylinux_2_28_aarch64; do
  plats+=(--platform "$p")
done
"$PY" -m pip install --quiet --root-user-action=ignore --target "$SITE" --only-binary=:all: "${plats[@]}" \
  --python-version 3.11 --implementation cp --abi cp311 \
  "jax==0.10.2" "jaxlib==0.10.2" "$WHEEL"
cp .ci/smoke.py "$ARM/tmp/smoke.py"

stamp "smoke test (emulated)"
# From / inside the root (no source folder there), -P as everywhere else.
(cd "$ARM" && arm /opt/venv/bin/python -P /tmp/smoke.py)
stamp "done in $(($(date +%s) - t0)) s"
