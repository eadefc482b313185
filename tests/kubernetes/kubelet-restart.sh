#!/usr/bin/env bash
# Restart the kubelet of the node node-up.sh started, as a node's service manager would: SIGTERM (SIGKILL after
# 20 s), then the same command again ($RUN/kubelet.cmd, saved by node-up.sh), and wait for its /healthz. Pods keep
# running meanwhile. env: the same NODE_LAB and KUBELET_ROOT as node-up.sh.
set -euo pipefail
LAB=${NODE_LAB:-/tmp/isthmus-kubenode}
KROOT=${KUBELET_ROOT:-/var/lib/kubelet}
RUN=$LAB/run
die() { echo "kubelet-restart.sh: $*" >&2; exit 1; }
[ -f "$RUN/kubelet.cmd" ] || die "no $RUN/kubelet.cmd (node-up.sh saves it)"
pid=$(cat "$RUN/kubelet.pid")
if kill -0 "$pid" 2>/dev/null; then
  kill -TERM "$pid"
  for _ in $(seq 1 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
fi
nohup bash "$RUN/kubelet.cmd" </dev/null >>"$RUN/kubelet.log" 2>&1 &
echo $! > "$RUN/kubelet.pid"
port=$(awk '/^healthzPort:/ {print $2}' "$KROOT/config.yaml")
for _ in $(seq 1 1200); do
  kill -0 "$(cat "$RUN/kubelet.pid")" 2>/dev/null || { tail -25 "$RUN/kubelet.log" >&2; die "the kubelet exited"; }
  curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && exit 0
  sleep 0.2
done
die "the kubelet's /healthz did not answer within 240 s"
