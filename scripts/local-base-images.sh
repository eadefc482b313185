#!/usr/bin/env bash
# The two images the Containerfile starts from, made on this machine for when no container registry can be reached:
#   localhost/debian:bookworm        Debian bookworm (debootstrap --variant=minbase from the machine's Debian mirror),
#                                    trimmed like Debian's own -slim images; stands for debian:bookworm-slim.
#                                    `base trixie` and `base sid` make localhost/debian:trixie and :sid the same way,
#                                    for the Slurm image of another Slurm line (SLURM_BASE_IMAGE; docs/deploy.md).
#   localhost/rust:<ver>-bookworm    that base with gcc and this machine's Rust toolchain (`rustc --print sysroot`);
#                                    stands for rust:<ver>-bookworm.
# Each is made only when the engine does not have it yet. Then:
#   make image BASE_IMAGE=localhost/debian:bookworm BUILDER_IMAGE=localhost/rust:<ver>-bookworm
# Usage: scripts/local-base-images.sh [base [SUITE]|builder|all]   (SUITE: bookworm (default), trixie or sid;
#        engine: $CONTAINER_ENGINE, else docker, podman, buildah)
# Needs root (debootstrap), debootstrap, and the Debian mirror. Prints the image names it made or found.
set -euo pipefail

what=${1:-all}
suite=${2:-bookworm}
case "$suite" in
  bookworm|trixie|sid) ;;
  *) echo "$0: suite $suite: bookworm, trixie or sid" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."

engine=${CONTAINER_ENGINE:-$(scripts/container-engine.sh)}
base=localhost/debian:$suite

have() { "$engine" image inspect "$1" >/dev/null 2>&1; }

# The machine's Debian mirror: the first `URIs:` (deb822) or `deb` line that ends in /debian.
mirror=${DEBIAN_MIRROR:-$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null \
  | sed -n -e 's|^URIs: *\(.*/debian\)/*$|\1|p' -e 's|^deb  *\(\[[^]]*\] *\)\{0,1\}\([^ ]*/debian\)/* .*|\2|p' | head -n 1 || true)}
mirror=${mirror:-http://deb.debian.org/debian}
security=${DEBIAN_SECURITY_MIRROR:-${mirror}-security}

make_base() {
  if have "$base"; then echo "$base"; return; fi
  command -v debootstrap >/dev/null || { echo "debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
  local root
  root=$(mktemp -d /var/tmp/isthmus-debootstrap.XXXXXX)
  trap 'rm -rf "$root"' RETURN
  debootstrap --variant=minbase "$suite" "$root" "$mirror" >&2
  # What Debian's bookworm-slim leaves out, and its apt settings (no package cache kept in a layer).
  cat >"$root/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
EOF
  cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  if [ "$suite" = sid ]; then
    echo "deb $mirror sid main" >"$root/etc/apt/sources.list"
  else
    cat >"$root/etc/apt/sources.list" <<EOF
deb $mirror $suite main
deb $mirror $suite-updates main
deb $security $suite-security main
EOF
  fi
  # A mirror that serves a fixed snapshot keeps a suite's Release file past its Valid-Until (sid's lasts a week):
  # its signature is still checked, its age is not (as tests/slurm/root.sh).
  echo 'Acquire::Check-Valid-Until "false";' >"$root/etc/apt/apt.conf.d/99isthmus-snapshot"
  find "$root/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete
  rm -rf "$root"/usr/share/{groff,info,linda,locale,man}/* "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin \
    "$root"/var/cache/apt/archives/*.deb "$root"/var/log/* "$root"/etc/machine-id "$root"/var/lib/dbus/machine-id
  tar --numeric-owner -C "$root" -c . | "$engine" import - "$base" >/dev/null
  echo "$base"
}

make_builder() {
  local version sysroot ctx image
  version=$(rustc --version | awk '{print $2}')
  version=${version%.*}
  image=localhost/rust:${version}-bookworm
  if have "$image"; then echo "$image"; return; fi
  make_base >/dev/null
  sysroot=$(rustc --print sysroot)
  ctx=$(mktemp -d /var/tmp/isthmus-rust-image.XXXXXX)
  trap 'rm -rf "$ctx"' RETURN
  # The toolchain without its documentation (~800 MB); hard links where the file system allows.
  mkdir "$ctx/rust"
  for d in bin etc lib libexec; do
    [ -e "$sysroot/$d" ] && { cp -al "$sysroot/$d" "$ctx/rust/" 2>/dev/null || cp -a "$sysroot/$d" "$ctx/rust/"; }
  done
  # The machine's own CA certificates too (a proxy that intercepts TLS to crates.io signs with one of them).
  mkdir "$ctx/ca"
  cp /usr/local/share/ca-certificates/*.crt "$ctx/ca/" 2>/dev/null || true
  # As the official rust image: gcc and the C library's headers for linking, CA certificates for crates.io.
  cat >"$ctx/Containerfile" <<EOF
FROM $base
COPY ca /usr/local/share/ca-certificates
RUN apt-get update \\
 && apt-get install -y --no-install-recommends gcc libc6-dev ca-certificates \\
 && rm -rf /var/lib/apt/lists/*
COPY rust /usr/local/rust
ENV PATH=/usr/local/rust/bin:/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    CARGO_HOME=/usr/local/cargo
EOF
  "$engine" build -f "$ctx/Containerfile" -t "$image" "$ctx" >&2
  echo "$image"
}

case "$what" in
  base) make_base ;;
  builder|all)
    [ "$suite" = bookworm ] || { echo "$0: the builder image is bookworm's" >&2; exit 2; }
    [ "$what" = all ] && make_base
    make_builder ;;
  *) echo "usage: $0 [base|builder|all]" >&2; exit 2 ;;
esac
