#!/usr/bin/env bash
# A real cgroup v2 machine for the tests, on a machine that boots cgroup v1: Debian's own kernel under
# qemu-system-x86_64 (software emulation works; KVM is used when /dev/kvm answers), with this machine's / as its
# root (9p, read-only; tmpfs on /tmp, /run, /var/tmp), its cgroup2 hierarchy mounted at /sys/fs/cgroup with
# nsdelegate (as systemd mounts it) and every controller on the unified hierarchy.
#
#   vm.sh prepare          fetch the kernel package by name (apt) and build the initramfs (once; cached in
#                          ${ISTHMUS_VM_CACHE:-~/.cache/isthmus/vm}); prints the cache directory
#   vm.sh run DIR [SECS]   boot, run DIR/inside.sh as root inside (DIR is mounted read-write at the same path),
#                          power off; the console goes to DIR/console.log, the script's exit status to DIR/rc;
#                          exits with that status (124 when the VM did not finish within SECS, default 900)
#
# The kernel does not get to hang: a soft lockup is a panic (softlockup_panic=1), which stops qemu at once
# (panic=-1, -no-reboot). A boot that ended in a kernel panic before its script did is booted again, up to
# ISTHMUS_VM_BOOTS times in all (default 2), within the same SECS: what the failed boot left in DIR is removed first
# (DIR keeps what it held before the first boot), its console kept as DIR/console.bootN.log. A scenario that fails,
# or a VM that stops for any other reason, is never booted again.
#
# Needs qemu-system-x86 and busybox-static (Debian packages; .ci/run installs them).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${ISTHMUS_VM_CACHE:-$HOME/.cache/isthmus/vm}
modules="9p 9pnet_virtio virtio_pci dummy"

prepare() {
  mkdir -p "$cache"
  exec 9>"$cache.lock"
  flock 9
  local pkg
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -1)
  [ -n "$pkg" ] || { echo "vm.sh: apt knows no linux-image-amd64 (run apt-get update)" >&2; exit 2; }
  local dir="$cache/$pkg"
  local recipe
  recipe=$(cat "$here/vm.sh" "$here/init" "$here/mkinitramfs.py" /bin/busybox | sha256sum | cut -c1-16)
  if [ ! -f "$dir/vmlinuz" ]; then
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp/deb"
    (cd "$dir.tmp" && apt-get download "$pkg" >/dev/null 2>&1) ||
      { echo "vm.sh: apt-get download $pkg failed" >&2; exit 2; }
    dpkg-deb -x "$dir.tmp"/"$pkg"_*.deb "$dir.tmp/deb"
    mkdir -p "$dir.tmp/out"
    cp "$dir.tmp"/deb/boot/vmlinuz-* "$dir.tmp/out/vmlinuz"
    cp -a "$dir.tmp"/deb/lib/modules/* "$dir.tmp/out/modules"
    rm -rf "$dir" && mv "$dir.tmp/out" "$dir" && rm -rf "$dir.tmp"
  fi
  if [ "$(cat "$dir/initrd.stamp" 2>/dev/null)" != "$recipe" ]; then
    python3 "$here/mkinitramfs.py" "$dir/modules" "$here/init" "$dir/initrd" $modules >/dev/null
    echo "$recipe" > "$dir/initrd.stamp"
  fi
  echo "$dir"
}

run() {
  local run=${1:?usage: vm.sh run DIR [SECS]} secs=${2:-900}
  run=$(cd "$run" && pwd)
  [ -f "$run/inside.sh" ] || { echo "vm.sh: no $run/inside.sh" >&2; exit 2; }
  local dir
  dir=$(prepare | tail -1)
  command -v qemu-system-x86_64 >/dev/null || { echo "vm.sh: qemu-system-x86_64 is not installed (Debian: qemu-system-x86)" >&2; exit 2; }
  local accel=tcg
  if [ -w /dev/kvm ] && grep -qE 'vmx|svm' /proc/cpuinfo; then accel=kvm; fi
  local boots=${ISTHMUS_VM_BOOTS:-2} boot=1 deadline=$((SECONDS + secs)) left status
  local before
  before=$(cd "$run" && ls -A)
  while :; do
    rm -f "$run/rc"
    left=$((deadline - SECONDS))
    [ "$left" -gt 0 ] || { echo "vm.sh: the VM did not finish within ${secs}s" >&2; exit 124; }
    status=0
    timeout --kill-after=10 "$left" qemu-system-x86_64 \
      -machine q35,accel=$accel -cpu max -smp "${ISTHMUS_VM_CPUS:-2}" -m "${ISTHMUS_VM_MEMORY:-2048}" \
      -nographic -no-reboot -nodefaults -serial stdio \
      -kernel "$dir/vmlinuz" -initrd "$dir/initrd" \
      -append "console=ttyS0 panic=-1 softlockup_panic=1 loglevel=4 isthmus.run=$run" \
      -fsdev local,id=host,path=/,security_model=none,readonly=on,multidevs=remap -device virtio-9p-pci,fsdev=host,mount_tag=host \
      -fsdev local,id=run,path="$run",security_model=none,multidevs=remap -device virtio-9p-pci,fsdev=run,mount_tag=run \
      </dev/null >"$run/console.log" 2>&1 || status=$?
    if [ "$status" = 124 ] || [ "$status" = 137 ]; then echo "vm.sh: the VM did not finish within ${secs}s" >&2; exit 124; fi
    [ -f "$run/rc" ] && exit "$(cat "$run/rc")"
    if grep -q "Kernel panic" "$run/console.log" && [ "$boot" -lt "$boots" ]; then
      echo "vm.sh: boot $boot ended in a kernel panic before its script did: $(grep -m1 "Kernel panic" "$run/console.log" | tr -d '\r'); booting again" >&2
      mv "$run/console.log" "$run/console.boot$boot.log"
      (cd "$run" && ls -A) | while IFS= read -r f; do
        case "$f" in console.boot*.log) continue ;; esac
        grep -qxF -- "$f" <<<"$before" || rm -rf -- "${run:?}/$f"
      done
      boot=$((boot + 1))
      continue
    fi
    echo "vm.sh: the VM stopped before its script ended (qemu: $status); console: $run/console.log" >&2
    exit 125
  done
}

case "${1:-}" in
  prepare) prepare ;;
  run) shift; run "$@" ;;
  *) echo "usage: vm.sh prepare | run DIR [SECS]" >&2; exit 2 ;;
esac
