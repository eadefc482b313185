#!/bin/sh
# Check that an image (or a root filesystem) holds what `isthmus agent` needs at run time beside Slurm, for a site
# that adds isthmus to its own slurmd image (a Slurm line Debian does not ship; docs/deploy.md, "Your own Slurm
# image"). Run it inside the image, as its last build step or with the engine:
#
#   podman run --rm --entrypoint sh -v "$PWD/scripts/check-slurm-image.sh:/check.sh:ro" IMAGE /check.sh [--no-munged]
#
# or against an unpacked root as root: `chroot ROOT sh /check.sh`. `--no-munged`: the agent will run with
# `--no-munged` (auth/slurm, Slurm 23.11 and later), so no munged is needed. ISTHMUS (default /usr/local/bin/isthmus) is the
# binary to check. Prints one line per requirement, `ok` or `missing` with what provides it (Debian/Ubuntu package;
# RHEL family package), and exits 1 when anything required is missing. POSIX sh only: the image needs no tool of
# ours.
set -u
no_munged=false
[ "${1:-}" = --no-munged ] && no_munged=true
isthmus=${ISTHMUS:-/usr/local/bin/isthmus}
missing=0
say() { printf '%s\n' "$*"; }

# The binary and what it links (libc >= 2.34, libgcc_s, libhwloc.so.15, libudev.so.1): the dynamic loader answers.
if [ ! -x "$isthmus" ]; then
  say "missing: $isthmus (copy target/release/isthmus, or target/aarch64-unknown-linux-gnu/release/isthmus on arm64)"
  missing=1
else
  out=$("$isthmus" --version 2>&1)
  case "$out" in
    isthmus\ *) say "ok: $out" ;;
    *)
      say "missing: $isthmus does not start: $out"
      case "$out" in
        *libhwloc.so.15*) say "  install libhwloc15 (Debian/Ubuntu) or hwloc-libs (RHEL family)" ;;
        *libudev.so.1*) say "  install libudev1 (Debian/Ubuntu) or systemd-libs (RHEL family)" ;;
        *GLIBC_*) say "  the image's glibc is older than 2.34: isthmus needs 2.34 or later" ;;
      esac
      missing=1
      ;;
  esac
fi

# The programs the agent runs for Slurm: slurmd (with slurmstepd beside it), munged (unless auth/slurm:
# --no-munged), and the clients scontrol (a dynamic node's re-registration) and squeue (the device plugin's job
# list). smpquery is optional (--neighbours).
have() { command -v "$1" >/dev/null 2>&1; }
for p in slurmd scontrol squeue; do
  if have "$p"; then say "ok: $p ($(command -v "$p"))"; else say "missing: $p (slurmd / slurm-client; Slurm's own packages)"; missing=1; fi
done
if have slurmd; then
  sbin=$(dirname "$(command -v slurmd)")
  if [ -x "$sbin/slurmstepd" ] || have slurmstepd; then say "ok: slurmstepd"; else say "missing: slurmstepd (beside slurmd)"; missing=1; fi
  say "ok: $(slurmd -V 2>&1 | head -n 1) (the agent detects the release at start)"
fi
if have munged; then
  say "ok: munged ($(command -v munged))"
elif [ "$no_munged" = true ]; then
  say "ok: no munged (auth/slurm: the agent runs with --no-munged)"
else
  say "missing: munged (munge; or auth/slurm: check with --no-munged, Slurm 23.11 and later)"
  missing=1
fi
if have smpquery; then say "ok: smpquery"; else say "optional: smpquery (infiniband-diags) for --neighbours"; fi

if [ "$missing" = 0 ]; then say "the image holds what isthmus agent needs"; else say "the image lacks what is marked missing"; fi
exit "$missing"
