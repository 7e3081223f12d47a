#!/usr/bin/env bash
# Installs this build into a temporary prefix, then compiles and runs a small program against it
# through pkg-config, as a C++ trainer embedding meshtrain would.
# usage: test_pkgconfig.sh BUILD_DIR CONSUMER_SOURCE (MT_CONSUMER_CXX / MT_CONSUMER_FLAGS: the
# compiler and extra flags, as the build used; c++ by default)
set -euo pipefail
BUILD=$1
SRC=$2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
meson install -C "$BUILD" --destdir "$WORK/dest" --no-rebuild >/dev/null
PC=$(find "$WORK/dest" -name meshtrain.pc | head -n 1)
[ -n "$PC" ] || { echo "FAIL: no meshtrain.pc installed"; exit 1; }
PREFIX=$(pkg-config --variable=prefix "$PC")
export PKG_CONFIG_PATH=$(dirname "$PC")
FLAGS=$(pkg-config --define-variable=prefix="$WORK/dest$PREFIX" --cflags --libs meshtrain)
${MT_CONSUMER_CXX:-c++} -std=c++20 ${MT_CONSUMER_FLAGS:-} "$SRC" -o "$WORK/consumer" $FLAGS
LIBDIR=$(dirname "$(find "$WORK/dest" -name 'libmeshtrain.so*' | head -n 1)")
OUT=$(LD_LIBRARY_PATH="$LIBDIR" "$WORK/consumer")
echo "$OUT"
[ "$OUT" = "grad [4, 3] params 39" ] || { echo "FAIL: unexpected output"; exit 1; }
echo "pkgconfig: 1 passed, 0 failed"
