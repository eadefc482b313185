#!/usr/bin/env bash
# Tear down what node-up.sh started (by the pids it saved, checked against the executable) and undo its changes to
# the host: pods (their containers through containerd), the kubelet, containerd and its shims, mounts under the
# kubelet root and the lab, the control plane, cgroups, the bridge, the kubelet configuration it wrote.
# env: the same NODE_LAB, KUBELET_ROOT, CGROUP_ROOT as node-up.sh.
set -uo pipefail
LAB=${NODE_LAB:-/tmp/isthmus-kubenode}
KROOT=${KUBELET_ROOT:-/var/lib/kubelet}
CG=${CGROUP_ROOT:-/isthmus-kubenode}
RUN=$LAB/run; CTRD=$LAB/containerd; SOCK=$CTRD/containerd.sock
rc=0
[ -d "$RUN" ] || exit 0

stop() { # name [timeout-s]
  local f=$RUN/$1.pid pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f"); rm -f "$f"
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid"
  for _ in $(seq 1 $(( ${2:-15} * 10 ))); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null; sleep 0.2
}

# The kubelet first (it would restart what is removed next), then every container through containerd.
stop kubelet 20
pkill -KILL -f -- "--kubeconfig=$LAB/node.kubeconfig" 2>/dev/null
if [ -S "$SOCK" ]; then
  for t in $(ctr -a "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do ctr -a "$SOCK" -n k8s.io tasks kill -s SIGKILL "$t" >/dev/null 2>&1; done
  sleep 0.5
  for t in $(ctr -a "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do ctr -a "$SOCK" -n k8s.io tasks rm -f "$t" >/dev/null 2>&1; done
  for c in $(ctr -a "$SOCK" -n k8s.io containers ls -q 2>/dev/null); do ctr -a "$SOCK" -n k8s.io containers rm "$c" >/dev/null 2>&1; done
fi
stop containerd 20
# Shims outlive containerd by design: found by the socket they serve.
for p in /proc/[0-9]*; do
  cmd=$(tr '\0' ' ' 2>/dev/null < "$p/cmdline") || continue
  case "$cmd" in *containerd-shim*"-address $SOCK "*) kill -KILL "${p#/proc/}" 2>/dev/null ;; esac
done
sleep 0.3
for base in "$KROOT" "$LAB"; do
  awk -v b="$base" '$5 == b || index($5, b "/") == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || echo "node-down.sh: cannot unmount $m" >&2
  done
done
stop kube-scheduler; stop kube-controller-manager; stop kube-apiserver; stop etcd
for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
  [ -d "$h$CG" ] || continue
  find "$h$CG" -depth -type d -exec rmdir {} \; 2>/dev/null
  [ -d "$h$CG" ] && { echo "node-down.sh: cgroup $h$CG not empty" >&2; rc=1; }
done
ip link show isthmus0 >/dev/null 2>&1 && ip link del isthmus0
[ -f "$RUN/created-var-log-pods" ] && rm -rf /var/log/pods
[ -f "$RUN/created-var-log-containers" ] && rm -rf /var/log/containers
rmdir /run/containerd/s /run/containerd/fifo /run/containerd/runc/k8s.io /run/containerd/runc /run/containerd 2>/dev/null
if [ -f "$RUN/saved-kubelet-config" ]; then
  cp -p "$RUN/saved-kubelet-config" "$KROOT/config.yaml"
elif [ -f "$RUN/created-kubelet-root" ]; then
  rm -rf "$KROOT"
else
  rm -f "$KROOT/config.yaml"
fi
rm -rf "$LAB"
exit $rc
