#!/usr/bin/env sh
# Print the container engine to build images with: $CONTAINER_ENGINE when set, else the first of docker, podman,
# buildah that is installed and answers (`<engine> info`; a docker CLI without a running daemon does not).
# Says on stderr which one it chose and why the others were passed over; exits 1 when none works.
set -u

if [ -n "${CONTAINER_ENGINE:-}" ]; then
  if "$CONTAINER_ENGINE" info >/dev/null 2>&1; then
    echo "container engine: $CONTAINER_ENGINE (from CONTAINER_ENGINE)" >&2
    echo "$CONTAINER_ENGINE"
    exit 0
  fi
  echo "CONTAINER_ENGINE=$CONTAINER_ENGINE does not work: '$CONTAINER_ENGINE info' failed" >&2
  exit 1
fi

skipped=""
for engine in docker podman buildah; do
  if ! command -v "$engine" >/dev/null 2>&1; then
    skipped="$skipped $engine (not installed);"
    continue
  fi
  if "$engine" info >/dev/null 2>&1; then
    echo "container engine: $engine${skipped:+ (passed over:$skipped)}" >&2
    echo "$engine"
    exit 0
  fi
  skipped="$skipped $engine (installed, but '$engine info' fails: is its daemon running?);"
done
echo "no container engine works:$skipped install one (Debian: apt-get install podman) or set CONTAINER_ENGINE" >&2
exit 1
