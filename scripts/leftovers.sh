#!/usr/bin/env bash
# The daemons a test run or a benchmark starts (Slurm's, munged, etcd, Kubernetes', containerd, qemu, isthmus) must
# all be gone when it ends: a job step or an API server left behind piles up run after run on a developer's machine.
#
#   leftovers.sh snapshot FILE   record the ones running now (a developer's own daemons are not the run's)
#   leftovers.sh check FILE      list every one started since FILE was written that is still running after a grace
#                                of LEFTOVER_GRACE seconds (default 15: a test's last stop may still be under way);
#                                exit 1 if there is any
set -euo pipefail

# Process names as the kernel keeps them (15 characters): kube-controller-manager is `kube-controller`,
# qemu-system-x86_64 `qemu-system-x86`.
pattern='^(slurmstepd|slurmd|slurmctld|slurmdbd|munged|etcd|kube-.*|kubelet|qemu-.*|isthmus|containerd.*|runc|ibsim)$'

ours() {
  ps -eo pid=,comm= | awk -v p="$pattern" '$2 ~ p { print $1 }' | sort
}

case "${1:-}" in
  snapshot)
    ours >"$2"
    ;;
  check)
    grace=${LEFTOVER_GRACE:-15}
    left=""
    for _ in $(seq 0 "$grace"); do
      left=$(comm -13 "$2" <(ours) || true)
      [ -z "$left" ] && exit 0
      sleep 1
    done
    echo "processes the run started and left running:" >&2
    for pid in $left; do
      ps -o pid=,ppid=,etimes=,args= -p "$pid" 2>/dev/null | cut -c1-200 >&2 || true
    done
    exit 1
    ;;
  *)
    echo "usage: $0 snapshot|check FILE" >&2
    exit 2
    ;;
esac
