#!/usr/bin/env bash
# The Kubernetes the tests run: kube-apiserver, kube-controller-manager, kube-scheduler and the kubelet v1.20.2, built
# from Debian bookworm's own `kubernetes` source package (1.20.5+really1.20.2-1.1+deb12u1: the complete upstream
# tree with vendor/), fetched by name with apt from the mirror the machine's apt already uses, and Debian's etcd
# linked beside them: an envtest-style directory (what KUBEBUILDER_ASSETS names).
#
#   build.sh [DIR]      default: $ISTHMUS_KUBE_DIR or ~/.cache/isthmus/kubernetes/v1.20.2; prints DIR on its last line
#
# Nothing here is carried in the repository: the source comes from Debian's archive (its upstream tarball checked
# against the SHA-256 in Debian's .dsc), the compiler is Debian's golang-1.19-go, and the build is the tree's own
# `make WHAT=...`. The tree vendors reflect2 v1.0.1, whose map iteration faults under Go >= 1.18 (the API server dies
# with SIGSEGV in json-iterator); it is replaced by Debian's golang-github-modern-go-reflect2-dev (v1.0.2, the
# upstream release with the fix). Two local images for the kubelet tests are made from Debian files: the sandbox
# (`pause`, compiled from the tree's build/pause/linux/pause.c) and a busybox image (busybox-static).
#
# ~4-5 minutes on 2 cores the first time (34 MB download); afterwards it returns at once. A build that fails exits
# non-zero with the reason on stderr: the tests that need it fail (never skip).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-${ISTHMUS_KUBE_DIR:-$HOME/.cache/isthmus/kubernetes/v1.20.2}}
version=1.20.5+really1.20.2-1.1+deb12u1
# Changes whenever what this script produces changes, so a cached directory of an older recipe is rebuilt. The files'
# contents only, not where the checkout is: two checkouts of one recipe share the cache.
stamp="$version $(cat "$here/build.sh" "$here/mkimage.py" | sha256sum | cut -c1-16)"
all="kube-apiserver kube-controller-manager kube-scheduler kubelet etcd images/pause.tar images/busybox.tar"

complete() { for f in $all; do [ -e "$dir/$f" ] || return 1; done; }
if complete && [ "$(cat "$dir/.source" 2>/dev/null)" = "$stamp" ]; then echo "$dir"; exit 0; fi

sudo=$([ "$(id -u)" = 0 ] || echo sudo)
need=""
[ -x /usr/lib/go-1.19/bin/go ] || need="$need golang-1.19-go"
[ -x /usr/bin/etcd ] || need="$need etcd-server"
command -v rsync >/dev/null || need="$need rsync"
[ -x /bin/busybox ] || need="$need busybox-static"
[ -d /usr/share/gocode/src/github.com/modern-go/reflect2 ] || need="$need golang-github-modern-go-reflect2-dev"
{ command -v gcc >/dev/null && [ -f /usr/lib/x86_64-linux-gnu/libc.a ]; } || need="$need gcc libc6-dev"
command -v python3 >/dev/null || need="$need python3"
if [ -n "$need" ]; then
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -qq --no-install-recommends $need >/dev/null 2>&1 ||
    { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends $need >/dev/null; }
  # Debian starts an etcd service (port 2379) when it installs etcd-server; the tests start their own.
  if command -v systemctl >/dev/null && systemctl is-active -q etcd 2>/dev/null; then $sudo systemctl stop etcd || true; fi
  if [ -x /etc/init.d/etcd ]; then $sudo /etc/init.d/etcd stop >/dev/null 2>&1 || true; fi
fi

work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
# The bookworm mirror the machine already uses, as the one deb-src line of a private apt configuration (the system's
# own configuration is not touched).
mirror=$( (grep -rhoE 'https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null || true) | head -1 | tr -d ' ')
if [ -z "$mirror" ]; then
  # deb822 sources (`URIs: ...`)
  mirror=$( (grep -rhoE '^URIs: *https?://[^ ]+/debian/?' /etc/apt/sources.list.d/ 2>/dev/null || true) | head -1 | sed 's/^URIs: *//')
fi
[ -n "$mirror" ] || { echo "build.sh: no Debian mirror in the apt sources under /etc/apt" >&2; exit 1; }
mkdir -p "$work/apt/lists/partial"
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror bookworm main" > "$work/apt/sources.list"
o="-oDir::Etc::SourceList=$work/apt/sources.list -oDir::Etc::SourceParts=/dev/null -oDir::State::Lists=$work/apt/lists"
cache=${ISTHMUS_KUBE_SRC_CACHE:-$HOME/.cache/isthmus/kubernetes/src}
mkdir -p "$cache"
orig=$cache/kubernetes_1.20.5+really1.20.2.orig.tar.gz
if [ ! -f "$orig" ] || ! ls "$cache"/kubernetes_*.dsc >/dev/null 2>&1; then
  apt-get $o update -qq >&2
  (cd "$cache" && apt-get $o source --download-only "kubernetes=$version" >&2)
fi
sha=$(awk '/^Checksums-Sha256:/{f=1;next} f&&/orig.tar.gz/{print $1; exit}' "$cache"/kubernetes_*.dsc)
[ -n "$sha" ] || { echo "build.sh: no orig.tar.gz checksum in $cache/*.dsc" >&2; exit 1; }
echo "$sha  $orig" | sha256sum -c - >&2

src=$work/gopath/src/k8s.io/kubernetes
mkdir -p "$(dirname "$src")"
tar -xzf "$orig" -C "$work"
mv "$work/kubernetes-1.20.2" "$src"
r2=$src/vendor/github.com/modern-go/reflect2
rm -rf "$r2" && cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 "$r2"
mkdir -p "$dir/images"
(
  cd "$src"
  # Go's build cache lives with the sources and goes with them (~1 GB that nothing reuses: the binaries are cached).
  export GOCACHE=${GOCACHE:-$work/go-build}
  export PATH=/usr/lib/go-1.19/bin:$PATH GOPATH=$work/gopath CGO_ENABLED=0 HOME=$work/home GOTOOLCHAIN=local
  mkdir -p "$HOME"
  make WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler cmd/kubelet" \
    GOFLAGS=-tags=providerless KUBE_BUILD_PLATFORMS=linux/amd64
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
    install -m 0755 "_output/bin/$b" "$dir/$b"
  done
  img=$work/img
  mkdir -p "$img/pause" "$img/busybox/bin" "$img/busybox/etc" "$img/busybox/tmp"
  gcc -Os -static -DVERSION=3.4-isthmus -o "$img/pause/pause" build/pause/linux/pause.c
  strip "$img/pause/pause"
  cp /bin/busybox "$img/busybox/bin/busybox"
  for a in $("$img/busybox/bin/busybox" --list); do [ "$a" = busybox ] || ln -sf busybox "$img/busybox/bin/$a"; done
  echo 'root:x:0:0:root:/:/bin/sh' > "$img/busybox/etc/passwd"
  echo 'root:x:0:' > "$img/busybox/etc/group"
  python3 "$here/mkimage.py" isthmus.local/pause:3.4 "$img/pause" "$dir/images/pause.tar" --entrypoint /pause
  python3 "$here/mkimage.py" isthmus.local/busybox:1.35 "$img/busybox" "$dir/images/busybox.tar" --cmd sh
) >&2
ln -sf /usr/bin/etcd "$dir/etcd"
echo "$stamp" > "$dir/.source"
"$dir/kube-apiserver" --version >&2
echo "$dir"
