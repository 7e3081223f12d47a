#!/usr/bin/env bash
# Sanitizers and fuzzing (docs/robustness.md), the second half of CI after tools/test.sh: builds
# meshtrain with clang, ASan + UBSan and the libFuzzer targets into build-san/ (tools/setup.sh
# installs what is missing and builds), runs the meson test suite there, then each fuzz target for
# a bounded time, printing its executions and coverage. Any test failure, sanitizer report or fuzz
# finding fails the run; findings are saved under build-san/fuzz/findings/.
# Environment: MT_FUZZ_SECONDS (per target, default 30), MT_FUZZ_SEED (default 1: CI explores the
# same inputs on every run, so a new finding comes from a code change, not from chance),
# MT_SAN_TEST_ARGS (`meson test` arguments; default "--no-suite slow": the np 4 repeats and the
# timing-based kill -9 runs are left to tools/test.sh; set it empty to run everything),
# MT_FUZZ_ONLY=1 (skip the test suite), MT_FUZZ_JOBS (fuzzers run at once, default the core
# count), MT_JOBS (ninja -j).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
start=$(date +%s)
BUILD=${MT_SAN_BUILD_DIR:-build-san}
FUZZ_SECONDS=${MT_FUZZ_SECONDS:-30}

# clang and its runtimes: libFuzzer + sanitizers (libclang-rt), OpenMP (libomp), llvm-ar and
# llvm-symbolizer (llvm). Everything else is tools/setup.sh's list.
export MT_EXTRA_PKGS="clang-14 libclang-rt-14-dev libomp-14-dev llvm-14"
cxx=clang++-14
command -v ccache >/dev/null 2>&1 && cxx="ccache clang++-14"
# -O1 (asserts off, as in the release build): the optimization level sanitizers are usually built
# at. It compiled 17% faster than -O3 here and ran the ASan suite in the same time (docs/decisions.md,
# "CI time").
# A unity build like tools/test.sh's, but for the readers that the coverage allowlist
# (tests/fuzz/coverage_allowlist.txt) names by their translation unit's path: meson.build builds
# those file by file with -Dfuzz=true.
CXX="$cxx" AR=llvm-ar-14 MT_BUILD_DIR="$BUILD" \
  MT_MESON_ARGS="-Dcuda=disabled -Dbench=false -Db_sanitize=address,undefined -Db_lundef=false -Dfuzz=true -Doptimization=1 -Db_ndebug=true" \
  bash tools/setup.sh || { echo "sanitize: build failed"; exit 1; }

# The tests get their sanitizer options from the build's default test setup (tests/meson.build).
[ -x /usr/bin/llvm-symbolizer-14 ] && export ASAN_SYMBOLIZER_PATH=/usr/bin/llvm-symbolizer-14

rc=0
if [ "${MT_FUZZ_ONLY:-0}" != 1 ]; then
  # shellcheck disable=SC2086
  meson test -C "$BUILD" --print-errorlogs --num-processes 2 --timeout-multiplier 3 ${MT_SAN_TEST_ARGS---no-suite slow} 2>&1 | tee "$BUILD/test-summary.log"
  test_rc=${PIPESTATUS[0]}
  ok=$(grep -E '^Ok:' "$BUILD/test-summary.log" | awk '{print $2}')
  fail=$(grep -E '^Fail:' "$BUILD/test-summary.log" | awk '{print $2}')
  timeout=$(grep -E '^Timeout:' "$BUILD/test-summary.log" | awk '{print $2}')
  echo "sanitize: tests under ASan+UBSan: ${ok:-0} passed, $(( ${fail:-0} + ${timeout:-0} )) failed"
  [ "$test_rc" -eq 0 ] || rc=1
fi

# libFuzzer stops at the first finding itself; leaks are checked per input, with the same list.
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1"
export LSAN_OPTIONS="suppressions=$ROOT/tests/sanitizers/lsan.supp:print_suppressions=0"
# Each target grows a scratch corpus (seeded from tests/fuzz/corpus/<target>, which is only read).
# A fuzzer is one process on one core: MT_FUZZ_JOBS of them run at once (default: the cores), so
# each target still gets FUZZ_SECONDS of a core of its own.
FUZZ="$BUILD/fuzz"
mkdir -p "$FUZZ/findings"
fuzz_jobs=${MT_FUZZ_JOBS:-$(nproc)}
# Anything but a positive count would make the wait loop below spin forever.
if ! [[ "$fuzz_jobs" =~ ^[1-9][0-9]{0,3}$ ]]; then
  echo "sanitize: MT_FUZZ_JOBS must be a positive integer, got '$fuzz_jobs'"
  exit 2
fi
names=()
for exe in "$BUILD"/tests/fuzz/fuzz_*; do
  name=$(basename "$exe"); name=${name#fuzz_}
  [ -x "$exe" ] && [ -d "tests/fuzz/corpus/$name" ] || continue
  names+=("$name")
  while (( $(jobs -rp | wc -l) >= fuzz_jobs )); do wait -n; done
  mkdir -p "$FUZZ/corpus/$name"
  ( "$exe" "$FUZZ/corpus/$name" "tests/fuzz/corpus/$name" -max_total_time="$FUZZ_SECONDS" -seed="${MT_FUZZ_SEED:-1}" \
      -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$FUZZ/findings/$name-" >"$FUZZ/$name.log" 2>&1
    echo $? >"$FUZZ/$name.rc" ) &
done
wait
printf '%-12s %10s %8s %8s %6s  %s\n' target execs exec/s cov ft result > "$FUZZ/summary.txt"
for name in "${names[@]}"; do
  log="$FUZZ/$name.log"
  frc=$(cat "$FUZZ/$name.rc")
  # The last status line ("#N DONE cov: C ft: F ... exec/s: E") and the final stats.
  last=$(grep -aE '^#[0-9]+' "$log" | tail -1)
  execs=$(grep -aoE 'stat::number_of_executed_units: +[0-9]+' "$log" | tail -1 | awk '{print $2}')
  cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<< "$last")
  ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<< "$last")
  eps=$(grep -aoE 'stat::average_exec_per_sec: +[0-9]+' "$log" | tail -1 | awk '{print $2}')
  result=ok
  if [ "$frc" -ne 0 ]; then
    result="FINDING (rc $frc, log $log)"
    rc=1
    grep -aE 'FUZZ FINDING|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error|Test unit written' "$log" | head -5
  fi
  printf '%-12s %10s %8s %8s %6s  %s\n' "$name" "${execs:-?}" "${eps:-?}" "${cov:-?}" "${ft:-?}" "$result" \
    | tee -a "$FUZZ/summary.txt"
done
echo "sanitize: fuzzing ${FUZZ_SECONDS}s per target:"
cat "$FUZZ/summary.txt"
echo "sanitize: $( ((rc == 0)) && echo passed || echo FAILED ) in $(( $(date +%s) - start ))s"
exit "$rc"
