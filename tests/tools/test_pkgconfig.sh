#!/usr/bin/env bash
# Installs this build into a temporary prefix, MOVES the installed tree elsewhere (a relocated
# install), then compiles the embedding example against it with nothing but
# `pkg-config --cflags --libs meshtrain` (and the consumer's own -std) and runs it: meshtrain.pc
# must find its prefix from its own location, and the rpath must find libmeshtrain. The consumer
# has a models/config.h of its own first on its include path, which must not shadow meshtrain's.
# usage: test_pkgconfig.sh BUILD_DIR CONSUMER_SOURCE PLAN_FILE (MT_CONSUMER_CXX / MT_CONSUMER_FLAGS: the
# compiler and extra flags, as the build used; c++ by default)
set -euo pipefail
BUILD=$1
SRC=$2
PLAN=$3
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
meson install -C "$BUILD" --destdir "$WORK/dest" --no-rebuild >/dev/null
mv "$WORK/dest" "$WORK/moved"
PC=$(find "$WORK/moved" -name meshtrain.pc | head -n 1)
[ -n "$PC" ] || { echo "FAIL: no meshtrain.pc installed"; exit 1; }
grep -q '^prefix=${pcfiledir}' "$PC" || { echo "FAIL: meshtrain.pc hard-codes its prefix:"; head -n 3 "$PC"; exit 1; }
if grep -E '^Cflags:.*(-std=|-fopenmp)' "$PC"; then echo "FAIL: meshtrain.pc imposes -std or -fopenmp"; exit 1; fi
grep -q '^Cflags: -I${includedir}$' "$PC" || { echo "FAIL: meshtrain.pc Cflags should be -I\${includedir} only:"; grep Cflags "$PC"; exit 1; }
# Only what the public headers use is required: not the library's own Eigen, OpenBLAS, RE2, MPI.
if grep -E '^Requires.private:' "$PC"; then echo "FAIL: meshtrain.pc lists private build dependencies"; exit 1; fi
grep -q '^Requires: fmt, nlohmann_json$' "$PC" || { echo "FAIL: meshtrain.pc Requires:"; grep Requires "$PC"; exit 1; }
# A CUDA build adds meshtrain-cuda.pc: meshtrain's flags plus the toolkit's headers, with which the
# installed CUDA stream header compiles.
if grep -q 'MT_HAVE_CUDA 1' "$(find "$WORK/moved" -name config.h -path '*meshtrain/config.h' | head -n 1)" 2>/dev/null; then
  CPC=$(dirname "$PC")/meshtrain-cuda.pc
  [ -f "$CPC" ] || { echo "FAIL: a CUDA build installed no meshtrain-cuda.pc"; exit 1; }
  echo '#include <meshtrain/runtime/cuda/stream.h>' | ${MT_CONSUMER_CXX:-c++} -std=c++20 -x c++ -fsyntax-only \
    $(PKG_CONFIG_PATH=$(dirname "$PC") pkg-config --cflags meshtrain-cuda) - \
    || { echo "FAIL: <meshtrain/runtime/cuda/stream.h> with meshtrain-cuda.pc"; exit 1; }
fi
# Installed headers name each other <meshtrain/...>: none is left with an in-tree "tensor/ops.h".
if grep -rEn '#\s*include\s+"(runtime|kernels|tensor|mesh|optim|plan|models|checkpoint)/' "$WORK/moved"; then
  echo "FAIL: installed headers still include meshtrain headers by their in-tree paths"; exit 1
fi
# A consumer's own models/config.h (first on its include path) must not shadow meshtrain's.
mkdir -p "$WORK/shadow/models"
echo '#error "the consumer'"'"'s models/config.h shadowed meshtrain'"'"'s"' > "$WORK/shadow/models/config.h"
export PKG_CONFIG_PATH=$(dirname "$PC")
FLAGS=$(pkg-config --cflags --libs meshtrain)
${MT_CONSUMER_CXX:-c++} -std=c++20 ${MT_CONSUMER_FLAGS:-} -I"$WORK/shadow" "$SRC" -o "$WORK/consumer" $FLAGS
# The one include declares what docs/embedding.md and docs/optim.md use: every optimizer, the
# master weights of a 16-bit model, the propagation cache's controls (Muon, AdamW8bit and
# MasterWeights were missing until 2026-12-07).
cat >"$WORK/umbrella.cpp" <<'CPP'
#include <meshtrain/meshtrain.h>
using namespace mt;
void names(Muon*, AdamW8bit*, AdamW*, SGD*, MasterWeights*) {}
int main() { clear_dispatch_cache(); return static_cast<int>(dispatch_stats().hits); }
CPP
${MT_CONSUMER_CXX:-c++} -std=c++20 ${MT_CONSUMER_FLAGS:-} "$WORK/umbrella.cpp" -o "$WORK/umbrella" $FLAGS \
  || { echo "FAIL: <meshtrain/meshtrain.h> lacks a public name (above)"; exit 1; }
OUT=$(env -u LD_LIBRARY_PATH OMP_NUM_THREADS=1 "$WORK/consumer" "$PLAN" "$WORK/ckpt" 2)
echo "$OUT"
echo "$OUT" | grep -q '^step 2 loss ' || { echo "FAIL: unexpected output"; exit 1; }
[ -f "$WORK/ckpt/model.safetensors" ] || { echo "FAIL: no checkpoint written"; exit 1; }
# The installed CLI runs from the moved tree (its rpath finds libmeshtrain) and, from a directory
# outside any source tree, finds the installed stock plans and the default hardware profile.
BIN=$(find "$WORK/moved" -type f -name meshtrain -path '*/bin/*' | head -n 1)
[ -n "$BIN" ] || { echo "FAIL: no meshtrain installed"; exit 1; }
IPLAN=$(find "$WORK/moved" -path '*/share/meshtrain/plans/llama_tp.plan' | head -n 1)
[ -n "$IPLAN" ] || { echo "FAIL: the stock plans are not installed under share/meshtrain/plans"; exit 1; }
EST=$(cd "$WORK" && env -u LD_LIBRARY_PATH -u MT_PLANS_DIR -u MT_HARDWARE_DIR OMP_NUM_THREADS=1 \
  "$BIN" plan --config llama-tiny --plan "$IPLAN" --world 2 --estimate 2>&1) \
  || { echo "FAIL: the installed meshtrain plan --estimate: $EST"; exit 1; }
echo "$EST" | grep -q 'h100-nvlink' || { echo "FAIL: the estimate does not name its profile: $EST"; exit 1; }
echo "pkgconfig: 3 passed, 0 failed"
