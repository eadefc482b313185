#!/usr/bin/env bash
# Build a real kube-apiserver v1.26.0 from the source archive beside this script, for tests that need a real
# Kubernetes API server (the envtest convention: a directory holding `kube-apiserver` and `etcd`).
#
#   build.sh [ASSETS_DIR]      default: ${KUBEBUILDER_ASSETS:-$HOME/.cache/kube-assets/v1.26.0}
#
# Installs Debian's golang-1.19-go and etcd-server when missing. Prints ASSETS_DIR on its last line.
# Takes ~3 min on 2 cores the first time; afterwards it returns at once (the binary is kept).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
assets=${1:-${KUBEBUILDER_ASSETS:-$HOME/.cache/kube-assets/v1.26.0}}
archive=$here/kubernetes-v1.26.0-kube-apiserver-src.tar.xz
# The build is redone when the archive or this script (its flags) changes.
stamp=$(cat "$archive" "$here/build.sh" | sha256sum | cut -c1-16)

if [ -x "$assets/kube-apiserver" ] && [ -x "$assets/etcd" ] && [ "$(cat "$assets/.source" 2>/dev/null)" = "$stamp" ]; then
  echo "$assets"; exit 0
fi

need=""
[ -x /usr/lib/go-1.19/bin/go ] || need="$need golang-1.19-go"
[ -x /usr/bin/etcd ] || need="$need etcd-server"
if [ -n "$need" ]; then
  sudo=$([ "$(id -u)" = 0 ] || echo sudo)
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -qq --no-install-recommends $need >/dev/null 2>&1 ||
    { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends $need >/dev/null; }
  # Debian starts an etcd service on 2379 when it installs etcd-server; tests start their own.
  if command -v systemctl >/dev/null && systemctl is-active -q etcd 2>/dev/null; then $sudo systemctl stop etcd || true; fi
fi

work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
tar -xJf "$archive" -C "$work"
mkdir -p "$assets"
(
  cd "$work"
  export PATH=/usr/lib/go-1.19/bin:$PATH GOFLAGS=-mod=vendor CGO_ENABLED=0 GOTOOLCHAIN=local
  export GOCACHE=${GOCACHE:-$HOME/.cache/go-build}
  # The version, as upstream's hack/lib/version.sh stamps it into both packages: component-base's answers
  # `--version`, client-go's answers GET /version (kube-aggregator serves it).
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags="$ldflags -X $pkg.gitVersion=v1.26.0 -X $pkg.gitMajor=1 -X $pkg.gitMinor=26 -X $pkg.gitTreeState=clean"
  done
  go build -tags providerless -trimpath -ldflags "$ldflags" -o "$assets/kube-apiserver" ./cmd/kube-apiserver
) >&2
ln -sf /usr/bin/etcd "$assets/etcd"
echo "$stamp" > "$assets/.source"
"$assets/kube-apiserver" --version >&2
echo "$assets"
