#!/usr/bin/env bash
# Steady-state footprint of `isthmus agent` (Kubernetes-only mode, no Slurm children) on the 8×H100 fixture:
# peak and current RSS, CPU time used per minute while idle (re-discovering every REDISCOVER seconds), and the
# latency of a /metrics scrape. Usage: scripts/bench-agent.sh  (DURATION=60 REDISCOVER=60 SCRAPES=200)
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-60}
REDISCOVER=${REDISCOVER:-60}
SCRAPES=${SCRAPES:-200}
for tool in cargo curl hyperfine; do
    command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 1; }
done
cargo build --release -q -p isthmus-agent --bin isthmus
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
target/release/isthmus agent --slurm-mode off --no-nvml --listen "127.0.0.1:$PORT" \
    --rediscover-seconds "$REDISCOVER" --host-root fixtures/hosts/xe9680-8xh100/root 2>/dev/null &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
for _ in $(seq 50); do curl -sf "127.0.0.1:$PORT/readyz" >/dev/null && break; sleep 0.1; done
ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
HZ=$(getconf CLK_TCK)
T0=$(ticks); sleep "$DURATION"; T1=$(ticks)
echo "## agent steady state ($DURATION s idle, re-discovery every $REDISCOVER s)"
echo "- CPU: $(( T1 - T0 )) ticks of 1/$HZ s in $DURATION s = $(awk -v t=$((T1 - T0)) -v hz="$HZ" -v d="$DURATION" 'BEGIN{printf "%.3f %% of one core", 100*t/hz/d}')"
grep -E "VmHWM|VmRSS" "/proc/$PID/status" | sed 's/^/- /'
echo
echo "## /metrics scrape latency ($SCRAPES scrapes)"
hyperfine -N --warmup 5 --runs "$SCRAPES" --style basic "curl -sf -o /dev/null 127.0.0.1:$PORT/metrics" 2>&1 | grep -E "Time|Range"
echo "- size: $(curl -sf "127.0.0.1:$PORT/metrics" | wc -c) bytes"
