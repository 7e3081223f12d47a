#!/usr/bin/env bash
# Run on a machine with Debian's package index (a build machine, not the GPU host): downloads the
# .deb files that a GPU host without package access needs to build and run meshtrain (Eigen, fmt,
# nlohmann-json, re2 + abseil, Catch2, Open MPI and its runtime libraries, pkg-config) into
# .gpu-deps/ at the repository root, which git ignores. tools/gpu_check.sh unpacks them there
# (tools/gpu_env.sh). MT_GPU_DEPS_EXTRA="pkg ..." adds packages. About 10 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.gpu-deps
mkdir -p "$dest"
pkgs=(libeigen3-dev libfmt-dev libfmt9 nlohmann-json3-dev libre2-dev libre2-9 libabsl20220623 catch2
      libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common
      libhwloc15 libevent-2.1-7 libevent-core-2.1-7 libevent-pthreads-2.1-7 libpmix2
      libfabric1 libucx0 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200
      libpsm2-2 libpsm-infinipath1 libmunge2 libltdl7 libnuma1
      pkgconf pkgconf-bin libpkgconf3 pkg-config)
read -r -a extra <<< "${MT_GPU_DEPS_EXTRA:-}"
pkgs+=("${extra[@]}")
ls /var/lib/apt/lists/*_Packages* >/dev/null 2>&1 || apt-get update -qq  # Packages or Packages.lz4
( cd "$dest" && apt-get download "${pkgs[@]}" >/dev/null )
echo "gpu_deps: $(ls "$dest"/*.deb | wc -l) packages, $(du -sh "$dest" | cut -f1) in $dest"
