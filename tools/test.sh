#!/usr/bin/env bash
# All tests: set up, build, run every meson test suite, and print a one-line summary.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh || exit 1
BUILD=${MT_BUILD_DIR:-build}
meson test -C "$BUILD" --print-errorlogs --num-processes 2 "$@" 2>&1 | tee "$BUILD/test-summary.log"
rc=${PIPESTATUS[0]}
ok=$(grep -E '^Ok:' "$BUILD/test-summary.log" | awk '{print $2}')
fail=$(grep -E '^Fail:' "$BUILD/test-summary.log" | awk '{print $2}')
skip=$(grep -E '^Skipped:' "$BUILD/test-summary.log" | awk '{print $2}')
timeout=$(grep -E '^Timeout:' "$BUILD/test-summary.log" | awk '{print $2}')
echo "tests: ${ok:-0} passed, $(( ${fail:-0} + ${timeout:-0} )) failed, ${skip:-0} skipped"
exit "$rc"
