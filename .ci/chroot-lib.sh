# Sourced by the stages that run in a Debian root made by debootstrap (.ci/aarch64-smoke.sh,
# .ci/sid-python.sh): the mounts made inside a root are recorded and unmounted, the last one
# first, whenever the script exits (an error, or the TERM CI's cleanup sends), so that a
# later `rm -rf --one-file-system` of the root never meets a mount. Bash only.

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
