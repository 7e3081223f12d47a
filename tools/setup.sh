#!/usr/bin/env bash
# Installs the Debian packages meshtrain needs (only those missing) and builds it into ./build.
# Used by tools/run.sh, tools/test.sh and tools/sanitize.sh; safe to run again. Environment:
# MT_BUILD_DIR (default build), MT_MESON_ARGS (extra `meson setup` options), MT_EXTRA_PKGS (more
# Debian packages, e.g. clang), MT_JOBS (ninja -j; ninja's default otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(g++ meson ninja-build pkg-config libeigen3-dev libopenblas-dev libfmt-dev nlohmann-json3-dev catch2 libre2-dev python3 libopenmpi-dev openmpi-bin)
read -r -a extra <<< "${MT_EXTRA_PKGS:-}"
PKGS+=("${extra[@]}")
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The CUDA backend is built when nvcc is on PATH; the toolkit's usual home is not on it by default.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

BUILD=${MT_BUILD_DIR:-build}
if [ ! -f "$BUILD/build.ninja" ]; then
  meson setup "$BUILD" --buildtype=release ${MT_MESON_ARGS:-}
fi
ninja -C "$BUILD" ${MT_JOBS:+-j "$MT_JOBS"}
