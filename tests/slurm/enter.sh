#!/bin/sh
# Run a program of a Slurm root built by root.sh, in that root: PROGRAM is its path inside the root.
#
#   enter PROGRAM [ARGS...]
#
# A private mount namespace (nothing leaks to the host's mounts) binds /dev, /proc, /sys and /tmp (the tests' temp
# dirs: configs, sockets, logs, fixture trees), the host's /etc/passwd, /etc/group and /etc/hosts (the users jobs run
# as, localhost), and every directory in ISTHMUS_SLURM_BINDS (colon-separated) at the same paths inside, then
# chroots. Every step execs: the program keeps this process's pid, so whoever started it signals and reaps it
# directly. The environment passes through (SLURM_CONF, HWLOC_FSROOT, ...) with the root's own PATH.
root=
prog=$1
shift
exec unshare --mount --propagation private sh -c '
r=$1; prog=$2; shift 2
set -e
mount --rbind /dev "$r/dev"
mount --rbind /proc "$r/proc"
mount --rbind /sys "$r/sys"
mount --rbind /tmp "$r/tmp"
for f in /etc/passwd /etc/group /etc/hosts; do mount --bind "$f" "$r$f"; done
IFS=:
for d in ${ISTHMUS_SLURM_BINDS:-}; do
  [ -d "$d" ] || continue
  mkdir -p "$r$d"
  mount --rbind "$d" "$r$d"
done
exec chroot "$r" /usr/bin/env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$prog" "$@"
' sh "$root" "$prog" "$@"
