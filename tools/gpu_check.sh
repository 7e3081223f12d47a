#!/usr/bin/env bash
# The GPU check: the first thing to run on any GPU machine (docs/cuda.md). From the repository root:
#   bash tools/gpu_check.sh OUTDIR
# On a host without package access, first run `bash tools/gpu_deps.sh` on a build machine and send
# .gpu-deps/ along with the working tree: this script unpacks it (tools/gpu_env.sh). Then it
# configures and builds with CUDA for the GPU's architecture (MT_CUDA_ARCH, default 90), runs the
# `cuda` and `nccl` test suites (CUDA kernels against the CPU, NCCL or host-staged collectives, the
# CLI on CUDA against the CPU, several ranks on one GPU), bench_cuda, and a bf16 training benchmark
# on llama-1b shapes, and writes OUTDIR/summary.txt (pass/fail counts, every benchmark ratio,
# tokens/s and MFU) beside the full logs (build.log, tests.log, testlog.txt, bench_cuda.log,
# train_bench.log; train_bench_tuned.log, the same run with MT_GEMM_TUNE). Environment: MT_GPU_BUILD (build folder, default
# build-gpu), MT_JOBS (ninja -j), MT_SKIP_BENCH=1 (tests only), MT_SKIP_TUNE_AB=1 (no MT_GEMM_TUNE run), MT_GPU_CHECK_SECONDS (the whole check's deadline, default 560), MT_TRAIN_BENCH_ARGS (replaces the
# training benchmark's shape flags).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${1:?usage: tools/gpu_check.sh OUTDIR}")
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
T0=$(date +%s)
say() { echo "$*" | tee -a "$SUMMARY"; }
elapsed() { echo "$(( $(date +%s) - T0 )) s"; }
# One deadline for the whole check (MT_GPU_CHECK_SECONDS, default 560: a device call is cut at 600 s
# and then returns only what is in OUTDIR): each step's own limit is capped by the time left, so a
# hang costs the steps after it, never the summary. cap S: the smaller of S and the seconds left.
case "${MT_GPU_CHECK_SECONDS:-560}" in
  ''|*[!0-9]*|0) echo "gpu_check: MT_GPU_CHECK_SECONDS='${MT_GPU_CHECK_SECONDS}' must be a whole number of seconds > 0" >&2; exit 2 ;;
esac
DEADLINE=$(( T0 + ${MT_GPU_CHECK_SECONDS:-560} ))
cap() { local left=$(( DEADLINE - $(date +%s) )); [ "$left" -lt 5 ] && left=5; echo $(( $1 < left ? $1 : left )); }

# The commit, and whether the files checked differ from it (a copied working tree may carry an
# older .git than its files: then the label says so rather than name the wrong code).
tree=$(git diff --quiet HEAD -- 2>/dev/null && echo "" || echo " + uncommitted changes or a stale .git")
say "meshtrain GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$tree"
source tools/gpu_env.sh
say "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'nvidia-smi failed')"
say "nvcc: $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo missing); g++: $(g++ -dumpversion 2>/dev/null || echo missing); meson: $(meson --version 2>/dev/null || echo missing)"

# ---- build ------------------------------------------------------------------------------------------
BUILD=${MT_GPU_BUILD:-build-gpu}
if [ ! -f "$BUILD/build.ninja" ]; then
  # werror off: the host's compiler may be newer than the one the project is checked with. unity
  # off: file by file keeps the GPU host's 16 cores busy, and its compiler never built the unity chunks.
  meson setup "$BUILD" --buildtype=release -Dwerror=false -Dunity=off -Dcuda=enabled -Dcuda-arch="${MT_CUDA_ARCH:-90}" \
    >"$OUT/build.log" 2>&1 || { say "configure FAILED ($(elapsed)): see build.log"; tail -n 30 "$OUT/build.log"; exit 1; }
fi
grep -E "NCCL|MPI|CUDA" "$BUILD/config.h" | sed 's/^/config: /' | tee -a "$SUMMARY"
# The targets the check runs (MT_GPU_FULL_BUILD=1: everything, the CPU tests too).
targets=(tools/meshtrain tools/bench/bench_cuda tests/cuda/test_cuda_core tests/cuda/test_cuda_nn tests/cuda/test_cuda_attention tests/cuda/test_cuda_optim
         tests/cuda/test_cuda_nogpu)
[ -f "$BUILD/build.ninja" ] && grep -q "^build tests/test_nccl:" "$BUILD/build.ninja" && targets+=(tests/test_nccl)
# The libraries test_cuda_nogpu loads (stand-ins for libcublasLt, tests/cuda/meson.build).
[ -f "$BUILD/build.ninja" ] && while read -r lib; do targets+=("$lib"); done \
  < <(grep -oE "^build tests/cuda/lib[A-Za-z0-9_]+\.so:" "$BUILD/build.ninja" | sed 's/^build //; s/:$//')
[ "${MT_GPU_FULL_BUILD:-0}" = 1 ] && targets=()
if ! ninja -C "$BUILD" ${MT_JOBS:+-j "$MT_JOBS"} "${targets[@]}" >>"$OUT/build.log" 2>&1; then
  say "build FAILED ($(elapsed)): see build.log"
  grep -E "error|Error" "$OUT/build.log" | head -n 20
  exit 1
fi
say "build ok ($(elapsed))"

# ---- tests ------------------------------------------------------------------------------------------
# The tests may take the time left but 150 s, kept for the benchmarks (all of it with
# MT_SKIP_BENCH=1). At the limit meson gets SIGTERM, which stops its tests and flushes its log,
# copied below either way.
test_limit=$(( DEADLINE - $(date +%s) - ( ${MT_SKIP_BENCH:-0} == 1 ? 0 : 150 ) ))
[ "$test_limit" -lt 60 ] && test_limit=60
timeout -k 15 "$test_limit" meson test -C "$BUILD" --no-rebuild --suite cuda --suite nccl --print-errorlogs \
  --num-processes 1 --timeout-multiplier "${MT_TIMEOUT_MULTIPLIER:-0.5}" >"$OUT/tests.log" 2>&1
trc=$?
[ $trc -eq 124 ] && say "tests: cut at ${test_limit} s (the check's deadline, MT_GPU_CHECK_SECONDS)"
cp "$BUILD/meson-logs/testlog.txt" "$OUT/testlog.txt" 2>/dev/null
for k in Ok Fail Skipped Timeout; do
  printf '%s ' "tests $k: $(grep -E "^$k: " "$OUT/tests.log" | tail -n 1 | awk '{print $2}')" | tee -a "$SUMMARY"
done
say ""
grep -E "^ *[0-9]+/[0-9]+ " "$OUT/tests.log" | sed 's/^ */test: /' | tee -a "$SUMMARY" >/dev/null
grep -hE "^(ok|FAIL) +- " "$OUT/testlog.txt" 2>/dev/null | sed 's/^/cli_cuda: /' >>"$SUMMARY"
grep -h "^gemm tune test: " "$OUT/testlog.txt" 2>/dev/null | head -n 1 >>"$SUMMARY"
say "tests done ($(elapsed)), meson exit $trc"

# ---- benchmarks --------------------------------------------------------------------------------------
if [ "${MT_SKIP_BENCH:-0}" != 1 ]; then
  # The attention figures first on their own (a GPU not yet heated by the GEMMs holds higher
  # clocks: docs/cuda.md), then the whole benchmark.
  timeout "$(cap 120)" "$BUILD/tools/bench/bench_cuda" 20 attention 2>&1 | grep '^attention' | sed 's/^/bench_cuda (attention alone): /' >>"$SUMMARY"
  timeout "$(cap 300)" "$BUILD/tools/bench/bench_cuda" >"$OUT/bench_cuda.log" 2>&1
  say "bench_cuda exit $? ($(elapsed)):"
  sed 's/^/bench_cuda: /' "$OUT/bench_cuda.log" >>"$SUMMARY"
  ARGS=${MT_TRAIN_BENCH_ARGS:---config llama-1b --batch 4 --seq 2048}
  # train_bench NAME [VAR=VALUE ...]: the benchmark run with those environment variables; its log
  # and metrics go to OUT/NAME.log and OUT/NAME.jsonl, its median figures to the summary.
  train_bench() {
    local name=$1; shift
    rm -f "$OUT/$name.jsonl"
    env "$@" timeout "$(cap 400)" "$BUILD/tools/meshtrain" train $ARGS --device cuda --precision bf16 --steps 6 --warmup 1 \
      --metrics "$OUT/$name.jsonl" >"$OUT/$name.log" 2>&1
    say "$name exit $? ($(elapsed)): $* meshtrain train $ARGS --device cuda --precision bf16"
    grep -E "^model|^step" "$OUT/$name.log" | sed "s/^/$name: /" >>"$SUMMARY"
    python3 - "$OUT/$name.jsonl" "$name" <<'PY' | tee -a "$SUMMARY"
import json, statistics, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1])][2:]  # steps 1-2 warm up
    print(f"{sys.argv[2]}: median {statistics.median(r['tokens_per_s'] for r in rows):.0f} tokens/s, "
          f"MFU {100 * statistics.median(r['mfu'] for r in rows):.1f}%, peak memory {max(r['mem_peak_mib'] for r in rows):.0f} MiB "
          f"(steps 3-{len(rows) + 2})")
except Exception as e:
    print(f"{sys.argv[2]}: no figures ({e})")
PY
  }
  train_bench train_bench
  # GEMM algorithms chosen by timing (MT_GEMM_TUNE, docs/cuda.md), off by default until this A/B
  # shows a gain: the same run with it on, its losses against the run above (they must be equal to
  # the last bit: the tuner keeps only candidates with the first choice's output bits) and the
  # tokens/s ratio. MT_SKIP_TUNE_AB=1 skips it.
  if [ "${MT_SKIP_TUNE_AB:-0}" != 1 ]; then
    train_bench train_bench_tuned MT_GEMM_TUNE=2
    grep -c "^MT_GEMM_TUNE" "$OUT/train_bench_tuned.log" | sed 's/^/gemm tune: choices printed: /' >>"$SUMMARY"
    python3 - "$OUT/train_bench.jsonl" "$OUT/train_bench_tuned.jsonl" <<'PY' | tee -a "$SUMMARY"
import json, statistics, sys
try:
    a, b = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
    same = len(a) == len(b) and all(x["loss"] == y["loss"] for x, y in zip(a, b))
    ratio = statistics.median(r["tokens_per_s"] for r in b[2:]) / statistics.median(r["tokens_per_s"] for r in a[2:])
    print(f"gemm tune A/B: losses {'equal' if same else 'DIFFER'} over {len(b)} steps, tokens/s tuned/default {ratio:.3f}")
except Exception as e:
    print(f"gemm tune A/B: no figures ({e})")
PY
  fi
fi
say "total $(elapsed)"
[ $trc -eq 0 ]
