#!/usr/bin/env bash
# The newest Pythons, which pyenv may not have yet: Debian unstable (sid) packages them, so
# a sid root made by debootstrap supplies them. Into a fresh venv of each, the cp312-abi3
# wheel with the newest jax the package registry serves, as a user installs it, with no C/C++
# compiler on PATH; the load check (.ci/check_native.py newest: the module built on the
# oldest headers loads and registers there) and the smoke test (.ci/smoke.py). On the newest
# Python, the newest end of the support window, the wheel comes with its test extra and the
# README's test command runs there in full (`pytest -q` from the clone's root), then the
# tests of jax's announced future defaults with those all on (JAX_EXT_FUTURE_DEFAULTS=1,
# tests/future_defaults.py). .ci/run calls it; it runs alone as well:
#
#   .ci/sid-python.sh WHEEL [ROOTDIR]
#
# WHEEL: the x86_64 cp312-abi3 wheel (.ci/build-wheel.sh x86_64 python3.12 OUTDIR, or `pip
# wheel .` on Python 3.12). ROOTDIR: where the sid root is made, or reused when it already
# holds the Pythons (default build/sidroot). SMOKE_PYTHONS (default 3.14) get the load check
# and the smoke test; NEWEST_PYTHON (default 3.15) gets those and the suite. Needs root
# (debootstrap, chroot, mount), debootstrap (apt-get install debootstrap), git, and the
# Debian mirror (DEBIAN_MIRROR, default deb.debian.org) and the package registry.
#
# Inside the root: the clone's files (tracked and untracked, not the ignored ones) are
# copied to /src, so that the suite runs from a clone's root while the root holds no mount
# of the host's files; /proc and a fresh /dev/shm are mounted there and unmounted at exit.
# The root's own /dev holds the nodes debootstrap made.
set -euo pipefail
cd "$(dirname "$0")/.."
. .ci/chroot-lib.sh
chroot_stage_args build/sidroot "$@"
SID=$ROOT
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SMOKE_PYTHONS=${SMOKE_PYTHONS-3.14}
NEWEST=${NEWEST_PYTHON:-3.15}
case $(basename "$WHEEL") in
  *-cp312-abi3-*x86_64*.whl) ;;
  *) echo "sid-python: $WHEEL is not a cp312-abi3 x86_64 wheel" >&2; exit 1 ;;
esac
stamp() { echo "sid-python: $(date -u +%H:%M:%S) $*"; }
t_start=$(date +%s)

# The tests that concern jax's announced future defaults (jax_auto_pcast=False, jax_remat3,
# jax_custom_vjp3): shard_map typing, the transforms, auto's analysis, export.
FUTURE_TESTS="tests/test_shard_map.py tests/test_auto.py tests/test_export_symbolic.py
  tests/test_released_targets.py tests/test_select.py
  tests/test_gather.py::test_linear_transpose_jvp_and_hessian
  tests/test_gather.py::test_inside_scan_cond_checkpoint tests/test_gather.py::test_check_grads_order_2
  tests/test_gather.py::test_vmap_of_grad_and_grad_of_vmap_stay_native
  tests/test_gather.py::test_grad_native_equals_lax_bitwise"

have_pythons() {
  local v
  for v in $SMOKE_PYTHONS $NEWEST; do [ -x "$SID/usr/bin/python$v" ] || return 1; done
}
if ! have_pythons; then
  pkgs=()
  for v in $SMOKE_PYTHONS $NEWEST; do pkgs+=("python$v" "python$v-venv"); done
  stamp "debootstrap of Debian sid (minbase, ${pkgs[*]}) into $SID"
  debootstrap --variant=minbase --include="$(IFS=,; echo "${pkgs[*]}")" \
    sid "$SID" "$MIRROR" >"$SID.debootstrap.log" 2>&1 || {
    tail -20 "$SID.debootstrap.log" >&2; exit 1; }
  stamp "debootstrap done in $(($(date +%s) - t_start)) s"
fi
chroot_network "$SID"
chroot_mount -t proc proc "$SID/proc"
chroot_mount -t tmpfs -o mode=1777 shm "$SID/dev/shm"  # POSIX semaphores (multiprocessing)

# The clone, as its files (a fresh copy each run), and the wheel.
rm -rf --one-file-system "$SID/src" "$SID/tmp/wheels"
mkdir -p "$SID/src" "$SID/tmp/wheels"
git ls-files -z --cached --others --exclude-standard | tar -c --null -T - | tar -x -C "$SID/src"
cp "$WHEEL" "$SID/tmp/wheels/"
W=/tmp/wheels/$(basename "$WHEEL")

# A command inside the root, in an environment of its own: the venv of Python $1 first on
# PATH, then the root's /usr/bin and /bin (no compiler there: checked below), and the
# host's settings for reaching the package registry (its index, proxy and CA bundle, which
# is copied to the same path in the root).
pass=()
for name in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST PIP_CERT PIP_DEFAULT_TIMEOUT \
    PIP_RETRIES PIP_DISABLE_PIP_VERSION_CHECK http_proxy https_proxy no_proxy HTTP_PROXY \
    HTTPS_PROXY NO_PROXY; do
  if [ -n "${!name:-}" ]; then pass+=("$name=${!name}"); fi
done
if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
  mkdir -p "$SID$(dirname "$PIP_CERT")"
  cp -L --remove-destination "$PIP_CERT" "$SID$PIP_CERT"
fi
in_root() {  # $1: the Python (3.15), $2: the directory, then the command
  local v=$1 dir=$2; shift 2
  chroot "$SID" /usr/bin/env -i HOME=/root LANG=C.UTF-8 PATH="/opt/venv$v/bin:/usr/bin:/bin" \
    "${pass[@]}" sh -c 'cd "$0" && exec "$@"' "$dir" "$@"
}
for cc in cc gcc g++ c++ clang clang++ cpp ld; do
  if in_root "$NEWEST" / sh -c "command -v $cc" >/dev/null; then
    echo "sid-python: $cc is on the test PATH inside the root" >&2; exit 1
  fi
done

FAILED=()
for v in $SMOKE_PYTHONS $NEWEST; do
  what=$W
  [ "$v" = "$NEWEST" ] && what="$W[test]"
  stamp "Python $v ($(in_root "$v" / "python$v" -V)): a fresh venv, pip install $(basename "$what")"
  rm -rf "$SID/opt/venv$v"
  in_root "$v" / "python$v" -m venv "/opt/venv$v"
  t0=$(date +%s)
  in_root "$v" / pip install --quiet --root-user-action=ignore "$what"
  stamp "installed in $(($(date +%s) - t0)) s (with its dependencies)"
  in_root "$v" /src python -P .ci/check_native.py newest
  in_root "$v" / python -P /src/.ci/smoke.py
  if [ "$v" = "$NEWEST" ]; then
    stamp "Python $v: pytest -q (wheel install)"
    t0=$(date +%s)
    if ! in_root "$v" /src pytest -q; then FAILED+=("Python $v"); fi
    stamp "the suite: $(($(date +%s) - t0)) s"
    stamp "Python $v: jax's announced future defaults"
    t0=$(date +%s)
    # shellcheck disable=SC2086  # FUTURE_TESTS is a list of words
    if ! in_root "$v" /src env JAX_EXT_FUTURE_DEFAULTS=1 pytest -q $FUTURE_TESTS; then
      FAILED+=("Python $v (jax's future defaults)")
    fi
    stamp "future defaults: $(($(date +%s) - t0)) s"
  fi
done
if [ "${#FAILED[@]}" -ne 0 ]; then
  echo "sid-python: the suite failed on ${FAILED[*]}" >&2; exit 1
fi
stamp "done in $(($(date +%s) - t_start)) s"
