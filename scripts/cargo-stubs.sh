#!/usr/bin/env sh
# Turn a copy of the workspace's manifests (root Cargo.toml, Cargo.lock, each member's Cargo.toml and build script)
# into a workspace that builds the dependencies and nothing of ours: every member gets an empty src/lib.rs and a
# `fn main() {}` for each [[bin]], and loses its [[test]], [[example]] and [[bench]] sections, which do not change
# what is built for the binary, and every manifest its comments and blank lines. The Containerfile's dependency layer
# is built from the result, so a new test (a new [[test]] section), a comment or any source change leaves that layer
# cached.
# Usage: cargo-stubs.sh DIR   (DIR holds the copy; it edits DIR's Cargo.toml files, so never the repository itself)
set -eu

dir=${1:?usage: cargo-stubs.sh DIR}
cd "$dir"
if [ -e .git ]; then
  echo "cargo-stubs: $dir is a git checkout; run it on a copy of the manifests" >&2
  exit 1
fi

members=$(sed -n '/^members *=/,/]/p' Cargo.toml | tr ',[]' '\n\n\n' | sed -n 's/^ *"\(.*\)" *$/\1/p')
[ -n "$members" ] || { echo "cargo-stubs: no workspace members in $dir/Cargo.toml" >&2; exit 1; }

stub() {
  [ -e "$1" ] && return 0
  mkdir -p "$(dirname "$1")"
  printf '%s\n' "$2" >"$1"
}

# Drop the test, example and bench targets (from their header to the next table header), comment lines and blank
# lines: what is left is what cargo needs to build the dependencies, and the same whatever the tests and comments.
canonical() {
  awk '
    /^[ \t]*(#.*)?$/ { next }
    /^\[\[(test|example|bench)\]\]/ { skip = 1; next }
    /^\[/ { skip = 0 }
    !skip { print }
  ' "$1" >"$1.stub"
  mv "$1.stub" "$1"
}

canonical Cargo.toml
for m in $members; do
  [ -f "$m/Cargo.toml" ] || { echo "cargo-stubs: $m/Cargo.toml is missing" >&2; exit 1; }
  stub "$m/src/lib.rs" ""
  canonical "$m/Cargo.toml"
  # Each [[bin]]: its declared path, else cargo's conventional src/bin/<name>.rs.
  awk '
    function flush() { if (inbin) print (path != "" ? path : "src/bin/" name ".rs"); inbin = 0 }
    /^\[\[bin\]\]/ { flush(); inbin = 1; name = ""; path = ""; next }
    /^\[/ { flush(); next }
    inbin && /^name *=/ { v = $0; sub(/^[^"]*"/, "", v); sub(/".*/, "", v); name = v }
    inbin && /^path *=/ { v = $0; sub(/^[^"]*"/, "", v); sub(/".*/, "", v); path = v }
    END { flush() }
  ' "$m/Cargo.toml" | while read -r target; do
    stub "$m/$target" "fn main() {}"
  done
done
