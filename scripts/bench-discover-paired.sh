#!/usr/bin/env bash
# `isthmus discover` against `lstopo-no-graphics --of xml` as paired runs: PAIRS rounds, each timing both commands
# back to back with hyperfine (ROUND_RUNS runs each, after one warm-up), the ratio of the round's two means
# recorded; the median ratio of the rounds is printed per tree. Pairing keeps the machine's drift (other load, CPU
# frequency) out of the ratio. The times shown are the means of the rounds' medians. Run from the repo root; results are written up in docs/benchmarks.md.
#
# Trees: the 8×H100 recording and every hwloc recording in fixtures/hwloc with 32 CPUs or more (TREES=name,... to
# choose). Needs cargo, hyperfine (>= 1.13), python3, lstopo-no-graphics, tar + bzip2.
set -euo pipefail

PAIRS=${PAIRS:-21}
ROUND_RUNS=${ROUND_RUNS:-10}
BIN=${BIN:-target/release/isthmus}
[[ -n ${BIN_BUILT:-} ]] || cargo build --release -p isthmus-cli --bin isthmus

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

declare -A ROOTS=([xe9680-8xh100]=fixtures/hosts/xe9680-8xh100/root)
for tarball in $(find fixtures/hwloc -mindepth 2 -maxdepth 2 -name '*.tar.bz2' | sort); do
    name=$(basename "$tarball" .tar.bz2)
    case $name in 128* | 32* | 40* | 48* | 64*) ;; *) continue ;; esac
    mkdir "$TMP/$name"
    tar -xjf "$tarball" -C "$TMP/$name"
    # Each tarball holds one directory: the tree.
    ROOTS[$name]=$(find "$TMP/$name" -mindepth 1 -maxdepth 1 -type d | head -1)
done

echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- 2>/dev/null || echo ' (dirty tree)')"
echo "pairs: $PAIRS rounds of $ROUND_RUNS runs each"
echo
echo "| tree | isthmus [ms] | lstopo [ms] | ratio isthmus/lstopo: median (min–max) of rounds |"
echo "|---|---:|---:|---:|"
for name in $(printf '%s\n' "${!ROOTS[@]}" | sort); do
    [[ -z ${TREES:-} || ,$TREES, == *,$name,* ]] || continue
    root=$(realpath "${ROOTS[$name]}")
    export HWLOC_FSROOT=$root HWLOC_COMPONENTS=linux,stop
    for ((i = 0; i < PAIRS; i++)); do
        hyperfine -N --warmup 1 --runs "$ROUND_RUNS" --style none --export-json "$TMP/round-$i.json" \
            "$BIN discover --host-root $root --output json --no-nvml" "lstopo-no-graphics --of xml" >/dev/null 2>&1
    done
    python3 - "$name" "$TMP" "$PAIRS" <<'PY'
import json, statistics, sys
name, tmp, pairs = sys.argv[1], sys.argv[2], int(sys.argv[3])
ours, theirs, ratios = [], [], []
for i in range(pairs):
    r = json.load(open(f"{tmp}/round-{i}.json"))["results"]
    a, b = statistics.median(r[0]["times"]), statistics.median(r[1]["times"])
    ours.append(a); theirs.append(b); ratios.append(a / b)
print(f"| {name} | {statistics.mean(ours)*1000:.2f} | {statistics.mean(theirs)*1000:.2f} | "
      f"**{statistics.median(ratios):.2f}** ({min(ratios):.2f}–{max(ratios):.2f}) |")
PY
    unset HWLOC_FSROOT HWLOC_COMPONENTS
done
