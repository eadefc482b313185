#!/usr/bin/env bash
# A real single-node Kubernetes on loopback for the tests whose truth is the kubelet's: etcd + kube-apiserver +
# kube-controller-manager + kube-scheduler (tests/kubernetes/build.sh) + containerd and runc (Debian) + the kubelet
# with the static CPU manager (one CPU kept for the system), the single-numa-node topology manager and the
# PodResources socket. No registry:
# the images in $BIN/images (and $IMAGES) are imported into containerd; pods use imagePullPolicy: Never.
# Prints the administrator's kubeconfig path on its last line once the Node is Ready and the default ServiceAccount
# and its token exist.
#
# env: NODE_LAB (/tmp/isthmus-kubenode)  state, logs, PKI, containerd root
#      BIN (built by build.sh when unset)  NODE_NAME (isthmus-node)  CGROUP_ROOT (/isthmus-kubenode)
#      KUBELET_ROOT (/var/lib/kubelet: the kubelet's --root-dir; its configuration is written to
#        $KUBELET_ROOT/config.yaml, where the DaemonSet reads it, and PodResources is in $KUBELET_ROOT/pod-resources)
#      API_PORT ETCD_PORT ETCD_PEER_PORT KUBELET_PORT KUBELET_HEALTHZ_PORT KCM_PORT SCHED_PORT (free ports)
#      CPU_MANAGER_POLICY (static) TOPOLOGY_POLICY (single-numa-node) IMAGES ("a.tar b.tar")
#      RESERVED_CPUS (unset: reservedSystemCPUs, e.g. 0) or KUBE_RESERVED_CPU (500m: kubeReserved.cpu; the static
#        policy then keeps ceil(500m) = 1 CPU for the system, while the node's allocatable CPU is only 0.5 less, so
#        a 2-CPU machine fits a Guaranteed one-CPU pod beside a small pod)
#      AUDIT_POLICY (a file: audit logging to $NODE_LAB/run/audit.log)
# What it changes on the host, all undone by node-down.sh: cgroups under $CGROUP_ROOT, a bridge isthmus0 without an
# address, $KUBELET_ROOT (bind-mounted on itself, rshared), /var/log/pods and /var/log/containers. No iptables rule,
# no kube-proxy, nothing listening beyond loopback. The kubelet runs in its own mount namespace whose /proc/sys
# files already hold the values it insists on writing, so the host's sysctls stay as they are.
set -euo pipefail
T0=$(date +%s.%N)
HERE=$(cd "$(dirname "$0")" && pwd)
LAB=${NODE_LAB:-/tmp/isthmus-kubenode}
KROOT=${KUBELET_ROOT:-/var/lib/kubelet}
NODE=${NODE_NAME:-isthmus-node}
CG=${CGROUP_ROOT:-/isthmus-kubenode}
API_PORT=${API_PORT:-16443}; ETCD_PORT=${ETCD_PORT:-12379}; ETCD_PEER_PORT=${ETCD_PEER_PORT:-12380}
KUBELET_PORT=${KUBELET_PORT:-10250}; KUBELET_HEALTHZ_PORT=${KUBELET_HEALTHZ_PORT:-10248}
KCM_PORT=${KCM_PORT:-10257}; SCHED_PORT=${SCHED_PORT:-10259}
RUN=$LAB/run; PKI=$LAB/pki; CTRD=$LAB/containerd; SOCK=$CTRD/containerd.sock
die() { echo "node-up.sh: $*" >&2; exit 1; }
stamp() { printf '%6.1fs %s\n' "$(awk "BEGIN{print $(date +%s.%N) - $T0}")" "$*" >&2; }

[ "$(id -u)" = 0 ] || die "must run as root (cgroups, mounts, containerd)"
BIN=${BIN:-$(bash "$HERE/build.sh" | tail -1)}
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet etcd images/pause.tar; do
  [ -e "$BIN/$b" ] || die "$BIN/$b missing (tests/kubernetes/build.sh builds it)"
done
for t in /usr/bin/containerd /usr/bin/containerd-shim-runc-v2 /usr/lib/cni/bridge /usr/lib/cni/host-local; do
  [ -x "$t" ] || die "missing $t (apt-get install containerd runc containernetworking-plugins)"
done
command -v runc >/dev/null || die "missing runc"
# A lab of an earlier run that was not torn down (its test process was killed): tear it down first.
[ -d "$RUN" ] && { bash "$HERE/node-down.sh" >&2 || true; }
mkdir -p "$RUN" "$PKI"

# ---------------- PKI ----------------
sign() { # name subject extensions
  printf '%b\n' "$3" > "$PKI/$1.ext"
  openssl req -newkey rsa:2048 -nodes -keyout "$PKI/$1.key" -out "$PKI/$1.csr" -subj "$2" 2>/dev/null
  openssl x509 -req -in "$PKI/$1.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial -days 30 \
    -extfile "$PKI/$1.ext" -out "$PKI/$1.crt" 2>/dev/null
}
(
  umask 077; cd "$PKI"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 30 -subj "/CN=isthmus-test-ca" 2>/dev/null
  openssl genrsa -out sa.key 2048 2>/dev/null; openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  client='basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth'
  server='basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth'
  sign apiserver "/CN=kube-apiserver" "$server\nsubjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
  sign admin "/O=system:masters/CN=admin" "$client"
  sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client"
  sign kcm "/CN=system:kube-controller-manager" "$client"
  sign scheduler "/CN=system:kube-scheduler" "$client"
  sign node "/O=system:nodes/CN=system:node:$NODE" "$client"
  sign kubelet-serving "/CN=$NODE" "$server\nsubjectAltName=IP:127.0.0.1,DNS:localhost,DNS:$NODE"
) || die "certificate generation failed"
kubeconfig() { # file cert
  umask 077
  cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority-data: $(base64 -w0 < "$PKI/ca.crt")}
users:
- name: u
  user: {client-certificate-data: $(base64 -w0 < "$PKI/$2.crt"), client-key-data: $(base64 -w0 < "$PKI/$2.key")}
contexts:
- name: test
  context: {cluster: test, user: u}
current-context: test
EOF
}
for k in admin kcm scheduler node; do kubeconfig "$LAB/$k.kubeconfig" "$k"; done
stamp "PKI"

start() { # name cmd...
  local n=$1; shift
  nohup "$@" </dev/null >"$RUN/$n.log" 2>&1 &
  echo $! > "$RUN/$n.pid"
}
alive() { kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null || { tail -25 "$RUN/$1.log" >&2; die "$1 exited"; }; }
api() { curl -fsS --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "https://127.0.0.1:$API_PORT$1"; }
wait_for() { # what timeout process cmd...
  local what=$1 t=$2 p=$3; shift 3
  local deadline=$(( $(date +%s) + t ))
  until "$@" >/dev/null 2>&1; do
    [ -z "$p" ] || alive "$p"
    [ "$(date +%s)" -lt "$deadline" ] || die "timed out after ${t}s waiting for $what (logs in $RUN)"
    sleep 0.2
  done
  stamp "$what"
}

# ---------------- control plane ----------------
mkdir -p "$RUN/etcd-data"; chmod 700 "$RUN/etcd-data"
start etcd "$BIN/etcd" --name node --data-dir "$RUN/etcd-data" --unsafe-no-fsync \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "node=http://127.0.0.1:$ETCD_PEER_PORT" --logger zap --log-level warn
wait_for "etcd" 30 etcd sh -c "curl -fsS http://127.0.0.1:$ETCD_PORT/health | grep -q '\"health\":\"true\"'"
audit=()
[ -n "${AUDIT_POLICY:-}" ] && audit=(--audit-policy-file="$AUDIT_POLICY" --audit-log-path="$RUN/audit.log")
start kube-apiserver "$BIN/kube-apiserver" \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
  --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" --client-ca-file="$PKI/ca.crt" \
  --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
  --kubelet-preferred-address-types=InternalIP,Hostname \
  --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction --allow-privileged=true \
  --service-account-issuer=https://kubernetes.default.svc \
  --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
  --service-cluster-ip-range=10.0.0.0/24 --endpoint-reconciler-type=none \
  --cert-dir="$RUN/apiserver-certs" --profiling=false "${audit[@]}"
wait_for "kube-apiserver" 120 kube-apiserver api /readyz
start kube-controller-manager "$BIN/kube-controller-manager" \
  --kubeconfig="$LAB/kcm.kubeconfig" --authentication-kubeconfig="$LAB/kcm.kubeconfig" \
  --authorization-kubeconfig="$LAB/kcm.kubeconfig" --bind-address=127.0.0.1 --secure-port="$KCM_PORT" \
  --leader-elect=false --use-service-account-credentials=true --service-account-private-key-file="$PKI/sa.key" \
  --root-ca-file="$PKI/ca.crt" --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
  --profiling=false
start kube-scheduler "$BIN/kube-scheduler" \
  --kubeconfig="$LAB/scheduler.kubeconfig" --authentication-kubeconfig="$LAB/scheduler.kubeconfig" \
  --authorization-kubeconfig="$LAB/scheduler.kubeconfig" --bind-address=127.0.0.1 --secure-port="$SCHED_PORT" \
  --leader-elect=false --profiling=false

# ---------------- containerd ----------------
mkdir -p "$CTRD" "$LAB/cni/net.d" "$LAB/cni/ipam"
# Root without CAP_SYS_RESOURCE cannot lower an oom_score_adj, and runc then fails to start the sandbox (-998):
# containerd clamps to >= 0 when restrict_oom_score_adj is set.
restrict_oom=false
(( ( 0x$(awk '/^CapEff/ {print $2}' /proc/self/status) >> 24 ) & 1 )) || restrict_oom=true
cat > "$CTRD/config.toml" <<EOF
version = 2
root = "$CTRD/root"
state = "$CTRD/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$CTRD/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "isthmus.local/pause:3.4"
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  restrict_oom_score_adj = $restrict_oom
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$LAB/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$CTRD/state/runc"
EOF
# Pod network: a bridge without an address: pods reach nothing outside their namespace (hostNetwork pods use the
# host's loopback to reach the API server).
cat > "$LAB/cni/net.d/10-isthmus.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "isthmus-test", "plugins": [{"type": "bridge", "bridge": "isthmus0",
  "isGateway": false, "ipMasq": false, "hairpinMode": false,
  "ipam": {"type": "host-local", "dataDir": "$LAB/cni/ipam", "ranges": [[{"subnet": "10.201.0.0/24"}]]}}]}
EOF
start containerd /usr/bin/containerd --config "$CTRD/config.toml"
wait_for "containerd" 30 containerd ctr -a "$SOCK" version
for img in "$BIN"/images/*.tar ${IMAGES:-}; do
  ctr -a "$SOCK" -n k8s.io images import "$img" >/dev/null || die "cannot import $img"
done
stamp "images imported"

# ---------------- the kubelet ----------------
[ -d /var/log/pods ] || touch "$RUN/created-var-log-pods"
[ -d /var/log/containers ] || touch "$RUN/created-var-log-containers"
[ -d "$KROOT" ] || touch "$RUN/created-kubelet-root"
grep -q " $KROOT[/ ]" /proc/self/mountinfo && die "mounts left under $KROOT"
# A fresh etcd knows no pod: no state of an earlier kubelet may remain.
rm -rf "$KROOT/pods" "$KROOT/cpu_manager_state" "$KROOT/memory_manager_state" "$KROOT/plugins" \
  "$KROOT/plugins_registry" "$KROOT/device-plugins" "$KROOT/pod-resources"
mkdir -p "$KROOT"
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  mkdir -p "/sys/fs/cgroup$CG"
  for c in cpuset cpu io memory hugetlb pids; do echo "+$c" > "/sys/fs/cgroup$CG/cgroup.subtree_control" 2>/dev/null || true; done
else
  for h in /sys/fs/cgroup/*/; do
    [ "$(basename "$h")" = unified ] && continue
    [ -f "$h/tasks" ] || continue
    mkdir -p "$h$CG"
    if [ -f "$h/cpuset.cpus" ]; then
      [ -n "$(cat "$h$CG/cpuset.cpus")" ] || cat "$h/cpuset.cpus" > "$h$CG/cpuset.cpus"
      [ -n "$(cat "$h$CG/cpuset.mems")" ] || cat "$h/cpuset.mems" > "$h$CG/cpuset.mems"
    fi
  done
fi
# A kubelet configuration already there (a real node's) is kept aside and put back by node-down.sh.
[ -f "$KROOT/config.yaml" ] && cp -p "$KROOT/config.yaml" "$RUN/saved-kubelet-config"
cat > "$KROOT/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupRoot: $CG
cgroupsPerQOS: true
failSwapOn: false
makeIPTablesUtilChains: false
cpuManagerPolicy: ${CPU_MANAGER_POLICY:-static}
$(if [ -n "${RESERVED_CPUS:-}" ]; then echo "reservedSystemCPUs: \"$RESERVED_CPUS\""; else echo "kubeReserved: {cpu: ${KUBE_RESERVED_CPU:-500m}}"; fi)
topologyManagerPolicy: ${TOPOLOGY_POLICY:-single-numa-node}
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
serializeImagePulls: false
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
nodeStatusUpdateFrequency: 5s
syncFrequency: 10s
fileCheckFrequency: 10s
staticPodPath: $LAB/manifests
EOF
mkdir -p "$LAB/manifests"
kubelet=("$BIN/kubelet" --config="$KROOT/config.yaml" --kubeconfig="$LAB/node.kubeconfig"
  --container-runtime=remote --container-runtime-endpoint="unix://$SOCK" --pod-infra-container-image=isthmus.local/pause:3.4
  --root-dir="$KROOT" --cert-dir="$KROOT/pki" --hostname-override="$NODE" --node-ip=127.0.0.1)
# The values the kubelet writes into /proc/sys unless they are there already; in its own mount namespace each
# differing file is a read-only bind mount of a file holding the wanted value. $KROOT is rshared first, so the
# volumes it mounts there still reach the host's namespace, where containerd is.
mkdir -p "$LAB/sysctl"
shield=""
for kv in vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1 \
          kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000; do
  k=${kv%=*} v=${kv#*=}
  [ "$(cat "/proc/sys/$k")" = "$v" ] && continue
  f="$LAB/sysctl/${k//\//.}"; echo "$v" > "$f"
  shield="$shield mount --bind -o ro '$f' '/proc/sys/$k' &&"
done
grep -q " $KROOT $KROOT " /proc/self/mountinfo || mount --bind "$KROOT" "$KROOT"
mount --make-rshared "$KROOT"
# The command is kept in $RUN/kubelet.cmd, so that kubelet-restart.sh can start the same kubelet again.
printf 'exec unshare --mount --propagation unchanged sh -c %q kubelet' "$shield exec \"\$@\"" > "$RUN/kubelet.cmd"
printf ' %q' "${kubelet[@]}" >> "$RUN/kubelet.cmd"
start kubelet bash "$RUN/kubelet.cmd"
wait_for "kubelet /healthz" 240 kubelet curl -fsS "http://127.0.0.1:$KUBELET_HEALTHZ_PORT/healthz"
wait_for "Node $NODE registered" 240 kubelet api "/api/v1/nodes/$NODE"
# The kubelet publishes no loopback address; set it as a cloud controller would (the API server then reaches the
# kubelet on 127.0.0.1 for logs and exec).
curl -fsS --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" -X PATCH \
  -H 'Content-Type: application/merge-patch+json' "https://127.0.0.1:$API_PORT/api/v1/nodes/$NODE/status" \
  -d "{\"status\":{\"addresses\":[{\"type\":\"InternalIP\",\"address\":\"127.0.0.1\"},{\"type\":\"Hostname\",\"address\":\"$NODE\"}]}}" >/dev/null \
  || die "cannot set the Node's addresses"
ready() {
  api "/api/v1/nodes/$NODE" | python3 -c 'import json,sys; n=json.load(sys.stdin); sys.exit(0 if any(c["type"]=="Ready" and c["status"]=="True" for c in n["status"]["conditions"]) else 1)'
}
wait_for "Node $NODE Ready" 240 kubelet ready
token() { api /api/v1/namespaces/default/serviceaccounts/default | python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin).get("secrets") else 1)'; }
wait_for "default ServiceAccount with a token" 60 kube-controller-manager token
[ -S "$KROOT/pod-resources/kubelet.sock" ] || die "no PodResources socket in $KROOT/pod-resources"
echo "$LAB/admin.kubeconfig"
