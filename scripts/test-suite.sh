#!/usr/bin/env bash
# make test's runner: build every test target of the workspace once (the features `make test` uses), then run the
# test binaries in two lanes at once, each lane one binary after another, and the doc tests; the aarch64 build
# (make cross-arm64) first in the slurm lane; the few binaries that judge a component under load (SOLO) run alone
# after both lanes.
#
#   test-suite.sh [CARGO_FLAGS...]     e.g. test-suite.sh --features isthmus-tests/system
#   TEST_SUITE_ONLY=REGEX test-suite.sh ...   only the binaries whose name matches (grep -E), and no doc tests
#
# Why two lanes: most of the system tier waits for daemons (a slurmd registering, a Slurm node state, a controller's
# pass), and cargo runs test binaries one at a time, so a 2-core machine sat half idle for much of the suite. The
# `slurm` lane holds the binaries that wait on Slurm sites of their own and a few more that even out the lanes; the
# `main` lane holds everything else, the kubelet node and the VMs among them. The lanes share nothing but the machine:
# every test picks free ports and private directories, and the kubelet node and the VM keep their own locks
# (/tmp/isthmus-kubenode.lock, ~/.cache/isthmus/vm.lock). Which lane a binary runs in is decided here alone
# (SLURM_LANE); a binary not named there runs in the main lane, so a new test file is never left out.
#
# Each binary runs as cargo would run it (from its package's directory, with cargo's CARGO* variables); its output is
# printed whole when it ends, never interleaved with the other lane's. At the end: every binary's wall time, slowest
# first (also in target/test-suite/times.txt), and the failed ones. Exit status 1 if any binary or the doc tests
# failed.
set -uo pipefail
cd "$(dirname "$0")/.."

CARGO=${CARGO:-cargo}
# The binaries that wait on Slurm sites of their own (test target names), and arm64_qemu, which runs the aarch64 build
# this lane starts with (a full run on 2 cores before that build moved here from before the lanes: main 1535 s,
# slurm 1364 s, with status, controller_run and hwloc_truth in the slurm lane; target/test-suite/times.txt after each
# run says how they stand).
SLURM_LANE="crash_convergence controller_nodesync health_nodesync controller_placement controller_placement_forgery
controller_placement_tenancy controller_placement_fencing placement_owners slurm_agent slurm_cluster slurm_image_root
slurm_readyz slurm_cgroup deviceplugin_slurm fabric_slurm deploy_auth_slurm arm64_qemu"
# The aarch64 build and its unit tests under qemu (make cross-arm64: ~5 CPU-minutes of compiling) run first in the slurm
# lane, one job at a time, in a target directory of their own: the other lane's tests never wait for its build lock
# (they build the host's isthmus on first use), and it uses the core the lanes' waits leave idle instead of holding up
# every test before the lanes. arm64_qemu, later in the same lane, finds the binary there (ISTHMUS_AARCH64_TARGET_DIR).
export ISTHMUS_AARCH64_TARGET_DIR="$PWD/target/aarch64"
# The binaries whose tests put a component under load and judge how it holds (admission: 200 held request bodies
# against one webhook replica, its memory and the pods it must still admit): they run alone, after both lanes, so that
# the other lane's load is not part of what they measure.
SOLO="admission"

out=target/test-suite
rm -rf "$out"
mkdir -p "$out/logs"

# 1. Build every test target once; the list of executables comes from cargo's own messages.
if ! "$CARGO" test --workspace --no-run --message-format=json-render-diagnostics "$@" >"$out/build.json"; then
  echo "test-suite: building the tests failed" >&2
  exit 1
fi
python3 - "$out/build.json" >"$out/binaries.txt" <<'EOF'
import json, os, sys
seen = set()
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
        continue
    t = m["target"]
    kind = "test" if "test" in t["kind"] else "unit"
    name = t["name"] if kind == "test" else t["name"] + "(" + t["kind"][0] + ")"
    if m["executable"] in seen:
        continue
    seen.add(m["executable"])
    print(kind, name, t["name"], os.path.dirname(m["manifest_path"]), m["executable"], sep="\t")
EOF
if [ ! -s "$out/binaries.txt" ]; then
  echo "test-suite: cargo named no test binary" >&2
  exit 1
fi

named() {
  local t
  for t in $1; do [ "$t" = "$2" ] && return 0; done
  return 1
}

: >"$out/main.txt"
: >"$out/slurm.txt"
: >"$out/solo.txt"
while IFS=$'\t' read -r kind name target dir exe; do
  if [ -n "${TEST_SUITE_ONLY:-}" ] && ! grep -Eq -- "$TEST_SUITE_ONLY" <<<"$name"; then
    continue
  fi
  if [ "$kind" = test ] && named "$SOLO" "$target"; then
    printf '%s\t%s\t%s\n' "$name" "$dir" "$exe" >>"$out/solo.txt"
  elif [ "$kind" = test ] && named "$SLURM_LANE" "$target"; then
    printf '%s\t%s\t%s\n' "$name" "$dir" "$exe" >>"$out/slurm.txt"
  else
    printf '%s\t%s\t%s\n' "$name" "$dir" "$exe" >>"$out/main.txt"
  fi
done <"$out/binaries.txt"
for t in $SLURM_LANE $SOLO; do
  [ -n "${TEST_SUITE_ONLY:-}" ] || grep -q "^$t	" "$out/slurm.txt" "$out/solo.txt" ||
    echo "test-suite: $t is named here but cargo built no such test binary" >&2
done

# One step of a lane (a test binary, or a make target): run it with its output kept, time it, print the output whole
# when it ends.
run_step() {
  local lane=$1 name=$2 start end status secs
  shift 2
  local log="$out/logs/$name.log"
  start=$(date +%s.%N)
  "$@" >"$log" 2>&1 </dev/null
  status=$?
  end=$(date +%s.%N)
  secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
  printf '%s\t%s\t%s\t%s\n' "$secs" "$lane" "$name" "$status" >>"$out/times.raw"
  [ "$status" = 0 ] || echo "$name" >>"$out/failed.txt"
  flock "$out/print.lock" sh -c "printf '\n== %s (%s lane, %s s, exit %s)\n' '$name' '$lane' '$secs' '$status'; cat '$log'"
}

# One binary, run as cargo would run it: from its package's directory, with cargo's CARGO* variables.
run_one() {
  local lane=$1 name=$2 dir=$3 exe=$4
  run_step "$lane" "$name" sh -c 'cd "$1" && CARGO="$2" CARGO_MANIFEST_DIR="$1" exec "$3"' sh "$dir" "$(command -v "$CARGO")" "$exe"
}

run_lane() {
  local lane=$1
  local name dir exe
  if [ "$lane" = slurm ] && grep -q "^arm64_qemu	" "$out/slurm.txt"; then
    run_step slurm cross-arm64 env CARGO_BUILD_JOBS=1 make --no-print-directory CARGO="$CARGO" cross-arm64
  fi
  while IFS=$'\t' read -r name dir exe; do
    run_one "$lane" "$name" "$dir" "$exe" </dev/null
  done <"$out/$lane.txt"
  if [ "$lane" = slurm ] && [ -z "${TEST_SUITE_ONLY:-}" ]; then
    # The doc tests (cargo compiles them as it runs them), last in the slurm lane.
    run_step slurm doctests "$CARGO" test --workspace --doc "$@"
  fi
}

echo "test-suite: $(wc -l <"$out/main.txt") binaries in the main lane, $(wc -l <"$out/slurm.txt") in the slurm lane," \
  "$(wc -l <"$out/solo.txt") alone after them"
run_lane slurm "$@" &
slurm_pid=$!
run_lane main "$@"
wait "$slurm_pid"
run_lane solo "$@"

echo
echo "== wall time of each test binary (seconds, lane, binary, exit status), slowest first"
sort -rn "$out/times.raw" | tee "$out/times.txt"
for lane in main slurm solo; do
  awk -F'\t' -v l="$lane" '$2 == l { s += $1 } END { printf "== %s lane: %.0f s\n", l, s }' "$out/times.raw"
done
if [ -s "$out/failed.txt" ]; then
  echo "== FAILED:"
  sed 's/^/  /' "$out/failed.txt"
  exit 1
fi
exit 0
