#!/usr/bin/env bash
# `isthmus discover` against `lstopo-no-graphics --of xml` as paired runs: PAIRS rounds, each timing both commands
# back to back with hyperfine (ROUND_RUNS runs each, after one warm-up), the ratio of the round's two means
# recorded; the median ratio of the rounds is printed per tree. Pairing keeps the machine's drift (other load, CPU
# frequency) out of the ratio. The times shown are the means of the rounds' medians. Run from the repo root; results are written up in docs/benchmarks.md.
#
# Trees: the 8×H100 recording and every hwloc recording in fixtures/hwloc with 32 CPUs or more (TREES=name,... to
# choose). Needs cargo, hyperfine (>= 1.13), python3, lstopo-no-graphics, tar + bzip2.
#
# BEFORE=<binary> times a second isthmus (an earlier build) in the same rounds, beside the first and lstopo: both
# ratios to lstopo and the ratio of the two builds come from the same minutes of the machine.
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
if [[ -n ${BEFORE:-} ]]; then
    echo "before: $BEFORE"
    echo
    echo "| tree | before / isthmus / lstopo [ms] | before/lstopo: median (min–max) of rounds | isthmus/lstopo: median (min–max) | isthmus/before: median |"
    echo "|---|---:|---:|---:|---:|"
else
    echo "| tree | isthmus [ms] | lstopo [ms] | ratio isthmus/lstopo: median (min–max) of rounds |"
    echo "|---|---:|---:|---:|"
fi
for name in $(printf '%s\n' "${!ROOTS[@]}" | sort); do
    [[ -z ${TREES:-} || ,$TREES, == *,$name,* ]] || continue
    root=$(realpath "${ROOTS[$name]}")
    export HWLOC_FSROOT=$root HWLOC_COMPONENTS=linux,stop
    cmds=("$BIN discover --host-root $root --output json --no-nvml" "lstopo-no-graphics --of xml")
    [[ -z ${BEFORE:-} ]] || cmds+=("$BEFORE discover --host-root $root --output json --no-nvml")
    for ((i = 0; i < PAIRS; i++)); do
        # Every other round runs the commands in the opposite order: neither goes first every time.
        order=("${cmds[@]}")
        if ((i % 2 == 1)); then
            rev=()
            for ((k = ${#cmds[@]} - 1; k >= 0; k--)); do rev+=("${cmds[k]}"); done
            order=("${rev[@]}")
        fi
        hyperfine -N --warmup 1 --runs "$ROUND_RUNS" --style none --export-json "$TMP/round-$i.json" \
            "${order[@]}" >/dev/null 2>&1
    done
    python3 - "$name" "$TMP" "$PAIRS" "${cmds[@]}" <<'PY'
import json, statistics, sys
name, tmp, pairs, cmds = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
ours, theirs, before, ratios, before_ratios, gains = [], [], [], [], [], []
for i in range(pairs):
    by_cmd = {x["command"]: x["times"] for x in json.load(open(f"{tmp}/round-{i}.json"))["results"]}
    r = [by_cmd[c] for c in cmds]
    a, b = statistics.median(r[0]), statistics.median(r[1])
    ours.append(a); theirs.append(b); ratios.append(a / b)
    if len(r) > 2:
        c = statistics.median(r[2])
        before.append(c); before_ratios.append(c / b); gains.append(a / c)
def ms(xs): return f"{statistics.mean(xs)*1000:.2f}"
def rng(xs): return f"**{statistics.median(xs):.2f}** ({min(xs):.2f}–{max(xs):.2f})"
if before:
    print(f"| {name} | {ms(before)} / {ms(ours)} / {ms(theirs)} | {rng(before_ratios)} | {rng(ratios)} | "
          f"{statistics.median(gains):.3f} |")
else:
    print(f"| {name} | {ms(ours)} | {ms(theirs)} | {rng(ratios)} |")
PY
    unset HWLOC_FSROOT HWLOC_COMPONENTS
done
