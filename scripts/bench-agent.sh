#!/usr/bin/env bash
# Steady-state footprint of `isthmus agent` (Kubernetes-only mode, no Slurm children) on the 8×H100 fixture, with
# NVML replayed from the fixture's nvidia-smi dump and NRT publication on (to a loopback stand-in for the API server
# written in Python below; no kubelet socket, so PodResources is retried every 10 s): peak and current RSS, CPU time
# per minute while idle (re-discovering every REDISCOVER seconds), the number of API writes while idle, and the
# latency of a /metrics scrape. Usage: scripts/bench-agent.sh  (DURATION=60 REDISCOVER=60 SCRAPES=200)
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-60}
REDISCOVER=${REDISCOVER:-60}
SCRAPES=${SCRAPES:-200}
for tool in cargo curl hyperfine; do
    command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 1; }
done
cargo build --release -q -p isthmus-cli --bin isthmus
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
API_PORT=$(free_port)
TMP=$(mktemp -d)
cat > "$TMP/api.py" <<'PY'
import http.server, sys
writes = 0
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def reply(self, body):
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def do_GET(self):
        if self.path == "/writes": return self.reply(str(writes).encode())
        name = self.path.rsplit("/", 1)[-1]
        self.reply(('{"apiVersion":"v1","kind":"Node","metadata":{"name":"%s","uid":"bench-uid"}}' % name).encode())
    def do_PATCH(self):
        global writes; writes += 1
        self.reply(self.rfile.read(int(self.headers["Content-Length"])))
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
python3 "$TMP/api.py" "$API_PORT" &
API_PID=$!
printf 'apiVersion: v1\nkind: Config\nclusters:\n- name: b\n  cluster:\n    server: http://127.0.0.1:%s\ncontexts:\n- name: b\n  context: {cluster: b, user: b}\ncurrent-context: b\nusers:\n- name: b\n  user: {}\n' "$API_PORT" > "$TMP/kubeconfig"
KUBECONFIG="$TMP/kubeconfig" target/release/isthmus agent --slurm-mode off --publish-nrt true --node-name bench \
    --nvml-replay fixtures/hosts/xe9680-8xh100/nvidia-smi-q.txt --pod-resources-socket "$TMP/none.sock" \
    --listen "127.0.0.1:$PORT" --rediscover-seconds "$REDISCOVER" --host-root fixtures/hosts/xe9680-8xh100/root 2>/dev/null &
PID=$!
trap 'kill $PID $API_PID 2>/dev/null || true; rm -rf "$TMP"' EXIT
for _ in $(seq 50); do curl -sf "127.0.0.1:$PORT/readyz" >/dev/null && break; sleep 0.1; done
ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
HZ=$(getconf CLK_TCK)
sleep 3   # first discovery, first apply
W0=$(curl -sf "127.0.0.1:$API_PORT/writes")
T0=$(ticks); sleep "$DURATION"; T1=$(ticks)
W1=$(curl -sf "127.0.0.1:$API_PORT/writes")
echo "## agent steady state ($DURATION s idle, re-discovery every $REDISCOVER s)"
echo "- CPU: $(( T1 - T0 )) ticks of 1/$HZ s in $DURATION s = $(awk -v t=$((T1 - T0)) -v hz="$HZ" -v d="$DURATION" 'BEGIN{printf "%.3f %% of one core", 100*t/hz/d}')"
grep -E "VmHWM|VmRSS" "/proc/$PID/status" | sed 's/^/- /'
echo "- API writes while idle: $(( W1 - W0 )) (first apply before the window: $W0)"
echo
echo "## /metrics scrape latency ($SCRAPES scrapes)"
hyperfine -N --warmup 5 --runs "$SCRAPES" --style basic "curl -sf -o /dev/null 127.0.0.1:$PORT/metrics" 2>&1 | grep -E "Time|Range"
echo "- size: $(curl -sf "127.0.0.1:$PORT/metrics" | wc -c) bytes"
