# Sourced by the stages that run in a Debian root made by debootstrap (.ci/aarch64-smoke.sh,
# .ci/sid-python.sh), from the clone's root: the arguments both take (chroot_stage_args),
# and the mounts made inside a root, recorded and unmounted, the last one first, whenever
# the script exits (an error, or the TERM CI's cleanup sends), so that a later
# `rm -rf --one-file-system` of the root never meets a mount. Bash only.

# chroot_stage_args DEFAULT_ROOT "$@": the stage's arguments, WHEEL [ROOTDIR], relative
# paths read from the clone's root. Sets WHEEL to the wheel's absolute path and ROOT to the
# root's folder (ROOTDIR, or DEFAULT_ROOT below the clone), made and absolute, so that it
# still names the root from inside it. Any other count of arguments exits 2 with the usage.
chroot_stage_args() {
  local default=$1
  shift
  if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: $0 WHEEL [ROOTDIR]" >&2; exit 2
  fi
  WHEEL=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
  ROOT=${2:-$PWD/$default}
  ROOT=$(mkdir -p "$ROOT" && cd "$ROOT" && pwd)
}

CHROOT_MOUNTS=()

chroot_unmount_all() {
  local m
  for m in "${CHROOT_MOUNTS[@]}"; do
    umount "$m" 2>/dev/null || umount -l "$m" || echo "chroot: could not unmount $m" >&2
  done
  CHROOT_MOUNTS=()
}
trap chroot_unmount_all EXIT
trap 'exit 143' TERM INT  # run the EXIT trap on a signal too

# chroot_mount MOUNT-ARGS... DIR: mount, and unmount DIR at exit. DIR is the last argument.
chroot_mount() {
  local dir=${!#}
  mount "$@"
  CHROOT_MOUNTS=("$dir" "${CHROOT_MOUNTS[@]}")
}

# chroot_network ROOT: what pip inside ROOT needs to reach the package registry as the host
# does (name service, the CA bundle pip is pointed at), and /etc/hosts, which jax's
# distributed (gloo) transport needs to resolve this host's own name.
chroot_network() {
  cp -L --remove-destination /etc/resolv.conf /etc/hosts "$1/etc/"
  mkdir -p "$1/etc/ssl/certs"
  cp -L --remove-destination /etc/ssl/certs/ca-certificates.crt "$1/etc/ssl/certs/"
}
