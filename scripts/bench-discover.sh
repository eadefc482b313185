#!/usr/bin/env bash
# Measure `isthmus discover` against hwloc's `lstopo-no-graphics --of xml`
# as whole processes, on two recorded host roots. Run from the repo root.
#
# Needs: cargo, hyperfine (>= 1.13 for -N), GNU time (/usr/bin/time),
# lstopo-no-graphics (hwloc), tar + bzip2.
# Results are written up in docs/benchmarks.md.
set -euo pipefail

WARMUP=${WARMUP:-5}
RUNS=${RUNS:-50}
RSS_RUNS=${RSS_RUNS:-5}

for tool in cargo hyperfine lstopo-no-graphics tar bzip2; do
    command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 1; }
done
[[ -x /usr/bin/time ]] || { echo "missing: /usr/bin/time (GNU time)" >&2; exit 1; }

cargo build --release -p isthmus-cli --bin isthmus
BIN=target/release/isthmus

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

H100_ROOT=fixtures/hosts/xe9680-8xh100/root
tar -xjf fixtures/hwloc/128arm-2pa2n8cluster4co/128arm-2pa2n8cluster4co.tar.bz2 -C "$TMP"
ARM_ROOT="$TMP/128arm-2pa2n8cluster4co"
[[ -d "$ARM_ROOT/sys" ]] || { echo "unexpected tarball layout under $TMP" >&2; exit 1; }

echo "## machine"
echo "nproc: $(nproc)"
echo "cpu: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "kernel: $(uname -r)"
echo "hwloc: $(lstopo-no-graphics --version)"
echo "hyperfine: $(hyperfine --version)"
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- 2>/dev/null || echo ' (dirty tree)')"
echo

# Peak RSS in KiB of one command (stdout discarded): median and range of RSS_RUNS runs.
peak_rss() {
    local vals=() v i
    for ((i = 0; i < RSS_RUNS; i++)); do
        v=$(/usr/bin/time -v "$@" 2>&1 >/dev/null | awk -F': ' '/Maximum resident set size/ {print $2}')
        vals+=("$v")
    done
    mapfile -t vals < <(printf '%s\n' "${vals[@]}" | sort -n)
    printf '| `%s` | %s | %s–%s |\n' "$*" "${vals[RSS_RUNS / 2]}" "${vals[0]}" "${vals[RSS_RUNS - 1]}"
}

bench_root() {
    local name=$1 root=$2; shift 2
    # lstopo reads these; isthmus sets the same values itself from --host-root.
    export HWLOC_FSROOT="$root" HWLOC_COMPONENTS=linux,stop
    local cmds=(
        "$BIN discover --host-root $root --output json --no-nvml"
        "$BIN discover --host-root $root --output table --no-nvml"
        "$BIN discover --host-root $root --output json --no-nvml --counters"
        "lstopo-no-graphics --of xml"
        "$@"
    )
    echo "## $name"
    echo "HWLOC_FSROOT=$HWLOC_FSROOT HWLOC_COMPONENTS=$HWLOC_COMPONENTS"
    echo
    # hyperfine discards each command's stdout (the JSON/table/XML).
    hyperfine -N --warmup "$WARMUP" --runs "$RUNS" --style basic \
        --export-markdown "$TMP/$name.md" "${cmds[@]}" >&2
    cat "$TMP/$name.md"
    echo
    echo "| command | peak RSS KiB (median of $RSS_RUNS) | range |"
    echo "|---|---:|---:|"
    local c
    for c in "${cmds[@]}"; do
        # shellcheck disable=SC2086  # commands are plain space-separated words
        peak_rss $c
    done
    echo
    unset HWLOC_FSROOT HWLOC_COMPONENTS
}

bench_root xe9680-8xh100 "$H100_ROOT" "lstopo-no-graphics --of xml --whole-io"
bench_root 128arm-2pa2n8cluster4co "$ARM_ROOT"
