#!/usr/bin/env bash
# A Slurm release the tests run, from Debian's own packages: a `debootstrap --variant=minbase` root of the Debian
# suite that ships it, made into the Slurm image's root filesystem by running the Containerfile's own recipe in it
# (every RUN of the runtime-slurm-base and runtime-slurm-config stages, as an engine runs them: the libraries the
# binary links, infiniband-diags, slurmd, munge and slurm-client, the install-time munge key deleted), then with
# the controller's side beside it (slurmctld, and sackd from 24.11 on), fetched by name from the mirror the machine's apt already
# uses. `image-recipe.sh` beside the root holds the recipe's commands as they ran (one per line). Beside the root, `bin/` holds one wrapper per
# Slurm program that runs the root's program in the root (`enter`, from enter.sh: a private mount namespace with the
# host's /dev, /proc, /sys, /tmp and a few files bound at the same paths, then chroot); the process keeps its pid and
# its name all the way (exec, never fork), so signals, `kill -9` and process listings see the daemon itself.
#
#   root.sh RELEASE [DIR]    RELEASE: 22.05 (Debian bookworm), 24.11 (Debian trixie) or 26.05 (Debian sid); DIR default
#                            ${ISTHMUS_SLURM_CACHE:-~/.cache/isthmus/slurm}/RELEASE; prints DIR on its last line
#
# About a minute and a half the first time (about 60 MB download, 180 MB on disk); afterwards it only refreshes the
# wrappers (the stamp file names the suite, the installed version and the digest of this script and the recipe). Concurrent calls wait
# for each other (flock). A build that fails, or a suite that no longer ships the release asked for, exits non-zero
# with the reason on stderr: the tests that need it fail (never skip).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
release=${1:?usage: root.sh 24.11|26.05 [DIR]}
case "$release" in
  22.05) suite=bookworm ;;
  24.11) suite=trixie ;;
  26.05) suite=sid ;;
  *) echo "root.sh: no Debian suite known for Slurm $release (known: 22.05 bookworm, 24.11 trixie, 26.05 sid)" >&2; exit 2 ;;
esac
dir=${2:-${ISTHMUS_SLURM_CACHE:-$HOME/.cache/isthmus/slurm}/$release}
programs="slurmctld slurmd munged mungekey scontrol sinfo squeue sbatch scancel sdiag srun sacct sackd"
containerfile=$here/../../Containerfile
# The Slurm image's recipe: each RUN of the Containerfile's runtime-slurm-base and runtime-slurm-config stages, its
# continuation lines joined, one command per line.
image_recipe() {
  awk '
    /^FROM / { stage = $NF; next }
    !run && (stage == "runtime-slurm-base" || stage == "runtime-slurm-config") && /^RUN / { run = 1; sub(/^RUN /, "") }
    run { line = $0; more = sub(/\\$/, "", line); printf "%s", line; if (more) printf " "; else { print ""; run = 0 } }
  ' "$containerfile"
}
recipe=$( { cat "$here/root.sh"; image_recipe; } | sha256sum | cut -c1-16)
sudo=$([ "$(id -u)" = 0 ] || echo sudo)

mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9

build_root() {
  if ! command -v debootstrap >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y -qq --no-install-recommends debootstrap >/dev/null 2>&1 ||
      { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends debootstrap >/dev/null; }
  fi
  # The Debian mirror the machine's apt already uses (one-line or deb822 sources).
  local mirror
  mirror=$( { grep -rhoE '^deb +(\[[^]]*\] +)?https?://[^ ]+/debian/? ' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null |
    grep -oE 'https?://[^ ]+' | head -1; } || true)
  if [ -z "$mirror" ]; then
    mirror=$( { grep -rhoE '^URIs: *https?://[^ ]+/debian/?$' /etc/apt/sources.list.d/ 2>/dev/null | head -1 | sed 's/^URIs: *//'; } || true)
  fi
  [ -n "$mirror" ] || { echo "root.sh: no Debian mirror in the apt sources under /etc/apt" >&2; return 1; }

  work=$(mktemp -d "$dir.build.XXXXXX")
  # Nothing stays mounted: every mount below is made in a private mount namespace that ends with its command.
  trap 'rm -rf --one-file-system "$work"' EXIT
  local root=$work/root
  echo "root.sh: debootstrap $suite from $mirror into $root" >&2
  $sudo debootstrap --variant=minbase --components=main "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 ||
    { tail -30 "$work/debootstrap.log" >&2; echo "root.sh: debootstrap $suite failed" >&2; return 1; }
  # No service starts during installation (there is no init in the root).
  printf '#!/bin/sh\nexit 101\n' | $sudo tee "$root/usr/sbin/policy-rc.d" >/dev/null
  $sudo chmod 755 "$root/usr/sbin/policy-rc.d"
  # A mirror that serves a fixed snapshot keeps a suite's Release file past its Valid-Until (sid's lasts a week):
  # its signature is still checked, its age is not.
  echo 'Acquire::Check-Valid-Until "false";' | $sudo tee "$root/etc/apt/apt.conf.d/99isthmus-snapshot" >/dev/null
  in_root() {
    # shellcheck disable=SC2016
    $sudo unshare --mount --propagation private sh -c '
      r=$1; shift
      mount -t proc proc "$r/proc" && mount --rbind /dev "$r/dev" && mount --rbind /sys "$r/sys" &&
        mount --bind /etc/resolv.conf "$r/etc/resolv.conf" 2>/dev/null; exec chroot "$r" "$@"' sh "$root" "$@"
  }
  in_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >"$work/apt.log" 2>&1 ||
    { tail -30 "$work/apt.log" >&2; return 1; }
  # The Slurm image's recipe, step by step, as the engine would run it on this suite's base.
  image_recipe >"$work/image-recipe.sh"
  grep -q 'apt-get install' "$work/image-recipe.sh" ||
    { echo "root.sh: no RUN with apt-get install in the Containerfile's runtime-slurm stages" >&2; return 1; }
  local step
  while IFS= read -r step <&3; do
    in_root env DEBIAN_FRONTEND=noninteractive sh -ec "$step" </dev/null >>"$work/apt.log" 2>&1 ||
      { tail -30 "$work/apt.log" >&2; echo "root.sh: the Slurm image's step failed in $suite: $step" >&2; return 1; }
  done 3<"$work/image-recipe.sh"
  # The controller's side, which the image does not hold (sackd, the auth/slurm client daemon: 23.11 and later).
  local packages="slurmctld"
  [ "$release" = 22.05 ] || packages="$packages sackd"
  in_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >>"$work/apt.log" 2>&1 </dev/null ||
    { tail -30 "$work/apt.log" >&2; return 1; }
  in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $packages >>"$work/apt.log" 2>&1 </dev/null ||
    { tail -30 "$work/apt.log" >&2; echo "root.sh: apt-get install $packages in $suite failed" >&2; return 1; }
  in_root apt-get clean </dev/null
  $sudo rm -rf "$root/var/lib/apt/lists"/*
  # Mount points for the files enter.sh binds from the host.
  $sudo touch "$root/etc/hosts" "$root/etc/passwd" "$root/etc/group"
  local installed
  installed=$(in_root dpkg-query -W -f='${Version}' slurmd)
  case "$installed" in
    "$release".*) ;;
    *) echo "root.sh: Debian $suite ships Slurm $installed, not $release: the release this root tests is gone from $suite" >&2
       return 1 ;;
  esac
  printf 'release %s\nsuite %s\nslurm %s\nmirror %s\nrecipe %s\n' "$release" "$suite" "$installed" "$mirror" "$recipe" >"$work/stamp"
  # Replace the cached root in one step.
  rm -rf --one-file-system "$dir.old"
  if [ -e "$dir" ]; then mv "$dir" "$dir.old"; fi
  mkdir -p "$dir"
  mv "$work/root" "$dir/root"
  mv "$work/stamp" "$dir/stamp"
  mv "$work/image-recipe.sh" "$dir/image-recipe.sh"
  rm -rf --one-file-system "$dir.old" "$work"
  trap - EXIT
  echo "root.sh: Slurm $installed ($suite) in $dir" >&2
}

if ! { [ -f "$dir/stamp" ] && grep -qx "recipe $recipe" "$dir/stamp" && [ -d "$dir/root/usr/sbin" ]; }; then
  build_root
fi

# The wrappers, refreshed on every call (each file replaced in one step: a running one keeps its old copy).
installed=$(sed -n 's/^slurm //p' "$dir/stamp")
mkdir -p "$dir/bin"
sed "s|^root=.*|root='$dir/root'|" "$here/enter.sh" >"$dir/.enter.new"
chmod 755 "$dir/.enter.new"
mv "$dir/.enter.new" "$dir/enter"
for p in $programs; do
  found=""
  for d in usr/sbin usr/bin sbin bin; do
    if [ -x "$dir/root/$d/$p" ]; then found=/$d/$p; break; fi
  done
  if [ -z "$found" ]; then rm -f "$dir/bin/$p"; continue; fi
  printf '#!/bin/sh\n# Slurm %s (Debian %s): %s in %s/root\nexec "%s/enter" %s "$@"\n' \
    "$installed" "$suite" "$found" "$dir" "$dir" "$found" >"$dir/bin/.$p.new"
  chmod 755 "$dir/bin/.$p.new"
  mv "$dir/bin/.$p.new" "$dir/bin/$p"
done
echo "$dir"
