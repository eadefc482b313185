#!/usr/bin/env bash
# The cgroup v2 suite's scenario, run as root inside the VM (vm.sh: this machine's / read-only, a real cgroup2
# hierarchy mounted with nsdelegate). It only acts and records; tests/tests/cgroup_v2.rs asserts on what it left in
# $RUN/out/<case>/. Settings come from $RUN/env: ISTHMUS_BIN (the agent), ROOTS (release=root dir of each Slurm
# release, or `host` for the machine's own packages), CASES (name:release:layout:caps:jobs, one per case; jobs is
# `all`, `layout` — one job and where it lives, for the second layout of a release — or `caps` — one job, for a pod
# with a capability taken away).
#
# A case is one pod: a container as the runtime makes it — its own PID, mount and cgroup namespaces, its cgroup
# holding its processes only, /sys/fs/cgroup mounted read-only, the release's root file system as its /, the
# capabilities the case names (bounding, permitted and effective; all others dropped) — whose PID 1 is the agent
# with `--slurm-cgroups delegated`, supervising munged and slurmd. slurmctld runs outside, on the "node".
set -u
RUN=$(cd "$(dirname "$0")" && pwd)
. "$RUN/env"
OUT=$RUN/out
mkdir -p "$OUT"
P=/sys/fs/cgroup
GPUS=4
for i in $(seq 0 $((GPUS - 1))); do mknod -m 666 /dev/nvidia$i c 195 $i; done

layout_path() { # LAYOUT UID CID: the container's cgroup as the kubelet's driver names it
  case "$1" in
    systemd) echo "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod${2//-/_}.slice/cri-containerd-$3.scope" ;;
    cgroupfs) echo "kubepods/burstable/pod$2/$3" ;;
  esac
}

make_cgroup() { # PATH: every level with the controllers enabled for its children, as systemd or the kubelet does
  local d=$P part
  for part in ${1//\// }; do
    echo "+cpuset +cpu +io +memory +pids" > "$d/cgroup.subtree_control"
    d=$d/$part
    mkdir -p "$d"
  done
}

# The container runtime's part, in the container's namespaces (PID 1 of its PID namespace until it execs the agent).
cat > "$RUN/container.sh" <<'EOF'
cg=$1 R=$2 caps=$3; shift 3
echo $$ > "$cg/cgroup.procs"
exec unshare --cgroup bash -c '
R=$1 caps=$2; shift 2
# The root file system is a mount of its own, as a container runtime makes it (pivot_root).
mount --bind "$R" "$R"
mount --rbind /dev "$R/dev"
mount -t proc proc "$R/proc"
umount -R -l "$R/sys" 2>/dev/null # those of the node, where the root file system is its own (22.05)
mount -t sysfs -o ro sysfs "$R/sys"
mount -t cgroup2 -o ro,nosuid,nodev,noexec cgroup2 "$R/sys/fs/cgroup"
mount --rbind /tmp "$R/tmp"
mount -t tmpfs tmpfs "$R/run"
mount -t tmpfs tmpfs "$R/var/spool"
mount --bind "$(dirname "$ISTHMUS_BIN")" "$R/opt"
for f in /etc/hosts /etc/passwd /etc/group; do mount --bind "$f" "$R$f"; done
exec chroot "$R" setpriv --bounding-set=-all,$caps --inh-caps=-all --ambient-caps=-all "$@"
' bash "$R" "$caps" "$@"
EOF

run_case() { # NAME RELEASE LAYOUT CAPS JOBS INDEX
  local name=$1 rel=$2 layout=$3 caps=$4 jobs=$5 index=$6
  local root=${ROOTS_MAP[$rel]} bin=${BINS_MAP[$rel]}
  local o=$OUT/$name T=/tmp/site-$name
  local started=$SECONDS
  mkdir -p "$o" "$T/state" "$T/spool" "$T/munge" "$T/etc"
  head -c 1024 /dev/urandom > "$T/munge.key"; chmod 400 "$T/munge.key"
  # Two cases run at once (two lanes): each its own ports.
  local ctld_port=$((6800 + index)) slurmd_port=$((6900 + index))
  cat > "$T/etc/slurm.conf" <<EOF
ClusterName=vm
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$T/munge/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup,task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
GresTypes=gpu
NodeName=vm1 NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 Gres=gpu:$GPUS
PartitionName=debug Nodes=ALL Default=YES
EOF
  cp "$RUN/cgroup.conf" "$T/etc/cgroup.conf"
  echo "Name=gpu File=/dev/nvidia[0-$((GPUS - 1))]" > "$T/etc/gres.conf"
  export SLURM_CONF=$T/etc/slurm.conf
  local cg
  cg=$(layout_path "$layout" "0000-$name" "$(printf %s "$name" | sha256sum | cut -c1-16)")
  make_cgroup "$cg"
  echo "$cg" > "$o/cgroup"
  ISTHMUS_BIN=$ISTHMUS_BIN unshare --mount --pid --fork --kill-child --propagation private \
    bash "$RUN/container.sh" "$P/$cg" "$root" "$caps" \
    /opt/$(basename "$ISTHMUS_BIN") agent --host-root / --node-name vm1 --no-nvml --listen 127.0.0.1:0 \
      --slurm-mode configured --slurm-conf "$SLURM_CONF" --gres-out "$T/agent-gres.conf" --slurm-cgroups delegated \
      --slurmd /usr/sbin/slurmd --munged /usr/sbin/munged --munge-socket "$T/munge/munge.sock" \
      --munge-key "$T/munge.key" --munge-state-dir "$T/munge" --grace-seconds 1 \
    > "$o/agent.log" 2>&1 &
  local pod=$!
  # slurmctld uses the pod's munged.
  for _ in $(seq 1 60); do [ -S "$T/munge/munge.sock" ] && break; sleep 0.5; done
  "$bin/slurmctld" -D -f "$SLURM_CONF" > "$o/slurmctld.out" 2>&1 &
  local ctld=$!
  local up=no deadline=$((SECONDS + 90))
  [ "$jobs" = caps ] && deadline=$((SECONDS + 30))
  while [ "$SECONDS" -lt "$deadline" ]; do
    if "$bin/sinfo" -h -N -o '%T' 2>/dev/null | grep -qx idle; then up=yes; break; fi
    sleep 1
  done
  echo "$up" > "$o/registered"
  if [ "$up" = yes ]; then
    case "$jobs" in
      all) jobs_of "$o" "$bin" "$name" "$cg" ;;
      layout) timeout 60 "$bin/srun" -N1 -n1 --mem=50 --gres=gpu:1 bash -c "$PROBE" > "$o/job-gpu1.txt" 2>&1
              node_view "$o" "$bin" "$name" "$cg" ;;
      caps) timeout 60 "$bin/srun" -N1 -n1 --mem=50 --gres=gpu:1 bash -c "$PROBE" > "$o/job-gpu1.txt" 2>&1 ;;
    esac
  fi
  # unshare --fork ignores SIGTERM and waits for its child, the pod's PID 1: the agent, told to stop as the kubelet
  # would.
  pkill -TERM -P "$pod" 2>/dev/null
  wait "$pod" 2>/dev/null
  kill "$ctld" 2>/dev/null; wait "$ctld" 2>/dev/null
  cp "$T/slurmd.log" "$o/slurmd.log" 2>/dev/null
  cp "$T/slurmctld.log" "$o/slurmctld.log" 2>/dev/null
  # The pod's cgroups go with the pod.
  find "$P/$cg" -depth -type d -exec rmdir {} + 2>/dev/null
  echo "$((SECONDS - started))" > "$o/seconds"
}

in_case() { # CGROUP NAME: the PIDs of processes called NAME in the case's pod (by the node's view of its cgroup)
  local p
  for p in $(pgrep -x "$2"); do
    grep -q "^0::/$1/" "/proc/$p/cgroup" 2>/dev/null && echo "$p"
  done
}

# What opening each GPU gave in the job (`nvidiaN: <error>`), its GPUs, cores, cgroup and capabilities.
PROBE='for i in 0 1 2 3; do printf "nvidia%s: %s\n" $i "$(head -c1 /dev/nvidia$i 2>&1 >/dev/null)"; done
echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"
grep -E "^(Cpus_allowed_list|CapEff|CapBnd)" /proc/self/status
echo "cgroup=$(cat /proc/self/cgroup)"'

# A root job trying to leave: into its namespace's root, into the pod's cgroup through munged's view of the
# container, into another namespace, a new mount, then the GPUs again.
ESCAPE='echo $$ > /sys/fs/cgroup/cgroup.procs 2>/dev/null && echo "escape-ns-root: moved" || echo "escape-ns-root: refused"
for p in $(pgrep -x munged); do
  f=/proc/$p/root/sys/fs/cgroup/isthmus/cgroup.procs
  if [ -e "$f" ]; then echo $$ > "$f" 2>/dev/null && echo "escape-pod: moved" || echo "escape-pod: refused ($(echo $$ 2>&1 > "$f"))"
  else echo "escape-pod: not visible"; fi
done
nsenter -t 1 -C true 2>/dev/null && echo "escape-setns: entered" || echo "escape-setns: refused"
mkdir -p /tmp/escape-$$ && mount -t cgroup2 none /tmp/escape-$$ 2>/dev/null && echo "escape-mount: mounted" || echo "escape-mount: refused"
echo "cgroup-after=$(cat /proc/self/cgroup)"'

jobs_of() { # OUT BIN CASE CGROUP
  local o=$1 bin=$2 name=$3 cg=$4
  timeout 60 "$bin/srun" -N1 -n1 --mem=50 --gres=gpu:1 bash -c "$PROBE" > "$o/job-gpu1.txt" 2>&1
  timeout 60 "$bin/srun" -N1 -n1 --mem=50 bash -c "$PROBE" > "$o/job-none.txt" 2>&1
  # Two at once, one GPU and one core each: each records, then waits for the other.
  local both=()
  for j in a b; do
    timeout 60 "$bin/srun" -N1 -n1 --mem=50 --gres=gpu:1 bash -c "$PROBE; touch /tmp/both-$name-$j; for _ in \$(seq 1 40); do [ -e /tmp/both-$name-a ] && [ -e /tmp/both-$name-b ] && break; sleep 0.5; done; echo together=\$([ -e /tmp/both-$name-a ] && [ -e /tmp/both-$name-b ] && echo yes || echo no)" > "$o/job-concurrent-$j.txt" 2>&1 &
    both+=($!)
  done
  wait "${both[@]}"
  rm -f "/tmp/both-$name-a" "/tmp/both-$name-b"
  # 200 MB in one read(): past memory.max inside one system call, so the kernel OOM-kills at once (a program that grows
  # a little per system call is throttled at memory.high, which Slurm sets to the same limit, and may take minutes).
  timeout 60 "$bin/srun" -N1 -n1 --mem=20 bash -c 'dd if=/dev/zero of=/dev/null bs=200M count=1 2>/dev/null && echo survived' > "$o/job-oom.txt" 2>&1
  echo "rc=$?" >> "$o/job-oom.txt"
  timeout 60 "$bin/srun" -N1 -n1 --mem=50 --gres=gpu:1 bash -c "$ESCAPE; $PROBE" > "$o/job-escape.txt" 2>&1
  # slurmd killed: the agent starts it again in the same namespace (Slurm's tree, controllers enabled, stays), and
  # the next job is confined as before.
  # This case's slurmd only: another lane's runs beside it.
  kill -9 $(in_case "$cg" slurmd) 2>/dev/null
  sleep 2
  for _ in $(seq 1 60); do
    "$bin/sinfo" -h -N -o '%T' 2>/dev/null | grep -qx idle && break
    sleep 1
  done
  timeout 60 "$bin/srun" -N1 -n1 --mem=50 --gres=gpu:1 bash -c "$PROBE" > "$o/job-after-restart.txt" 2>&1
  node_view "$o" "$bin" "$name" "$cg"
}

node_view() { # OUT BIN CASE CGROUP: while a job runs, where its processes are, seen from the node
  local o=$1 bin=$2 name=$3 cg=$4
  timeout 60 "$bin/srun" -N1 -n1 --mem=50 bash -c "echo \$\$ > /tmp/sleeper-$name.pid; sleep 30" > /dev/null 2>&1 &
  local sleeper=$!
  for _ in $(seq 1 40); do [ -s "/tmp/sleeper-$name.pid" ] && break; sleep 0.5; done
  sleep 1
  local pid
  pid=$(in_case "$cg" sleep | tail -1)
  echo "sleep=$(cat /proc/$pid/cgroup 2>/dev/null)" > "$o/job-node-view.txt"
  tree_of "$(cat "$o/cgroup")" > "$o/tree-running.txt"
  "$bin/scancel" -u root 2>/dev/null
  wait "$sleeper"
  rm -f "/tmp/sleeper-$name.pid"
}

tree_of() { # CGROUP: each cgroup under the container's with its processes' names
  local d f
  find "$P/$1" -maxdepth 4 -type d | sort | while read -r d; do
    f=""
    for p in $(cat "$d/cgroup.procs" 2>/dev/null); do f="$f $(cat /proc/$p/comm 2>/dev/null)"; done
    echo "${d#$P/$1}|$(cat "$d/cgroup.subtree_control" 2>/dev/null)|$f"
  done
}

declare -A ROOTS_MAP BINS_MAP
for r in $ROOTS; do
  if [ "${r#*=}" = host ]; then
    # The machine's own packages (22.05): its / is the container's root file system.
    b=/tmp/bin-${r%%=*}
    mkdir -p "$b"
    for p in slurmctld sinfo srun squeue scancel; do ln -sf "$(command -v $p || echo /usr/sbin/$p)" "$b/$p"; done
    ROOTS_MAP[${r%%=*}]=/; BINS_MAP[${r%%=*}]=$b
  else
    ROOTS_MAP[${r%%=*}]=${r#*=}/root; BINS_MAP[${r%%=*}]=${r#*=}/bin
  fi
done
# The Slurm roots are read-only here: slurmctld's wrapper (enter) binds /tmp into them; Slurm 24.11 and later make
# /run/slurmctld.
for r in "${ROOTS_MAP[@]}"; do [ "$r" = / ] || mount -t tmpfs tmpfs "$r/run"; done
# Two lanes at once, the cases alternating between them (the tests on the machine run several slurmctlds of one
# release from its root at once too).
lane() { # 0 | 1
  local c name rel layout caps jobs index=0
  for c in $CASES; do
    index=$((index + 1))
    [ $((index % 2)) = "$1" ] || continue
    IFS=: read -r name rel layout caps jobs <<< "$c"
    run_case "$name" "$rel" "$layout" "$caps" "$jobs" "$index"
  done
}
lane 0 &
lanes=$!
lane 1
wait "$lanes"
echo done > "$OUT/finished"
