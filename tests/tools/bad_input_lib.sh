# Shared harness of the bad-input suites (tests/tools/test_bad_input_*.sh), sourced, not run.
# Each case asserts what issue 10 asks of every bad input: a non-zero exit, an error message that
# names what is wrong (file, field, flag, line), and no file changed or left half-written in the
# directories the case watches.
#
#   source bad_input_lib.sh            # sets WORK (a fresh temporary directory), pass/fail
#   bad_case NAME [--watch DIR]... [--timeout S] PATTERN... -- COMMAND...
#     runs COMMAND (stdout and stderr captured) under `timeout S` (default 60 s) and fails the case
#     when it exits 0, times out (a hang), crashes (a signal), misses any PATTERN (fixed strings,
#     each searched in stderr), or changes anything under a watched DIR (content, names, or a
#     temporary left behind).
#     --mpi marks a case run under mpirun: Open MPI 4.1's launcher itself now and then dies of a
#     signal while it prints the MPI_Abort notice (after every rank has ended), so there a signal
#     exit counts as an exit when every PATTERN is in stderr; the case still fails on a hang.
#   bad_input_done                     # prints the summary; exit status 1 if any case failed
set -u
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
BAD_INPUT_FAILS=0
BAD_INPUT_CASES=0
pass() { echo "ok   - $1"; }
fail() { echo "FAIL - $1"; BAD_INPUT_FAILS=$((BAD_INPUT_FAILS + 1)); }

# A listing of DIR that changes when any file's name, size or content changes. A checkpoint
# directory's lock file (.meshtrain.lock, which every run that opens the directory takes; it holds
# only the last holder's PID) is left out.
snapshot_dir() {
  [ -e "$1" ] || { echo "(absent)"; return; }
  (cd "$1" && find . -name .meshtrain.lock -prune -o -print0 | LC_ALL=C sort -z | xargs -0 -I{} sh -c \
    'if [ -f "{}" ]; then printf "%s %s\n" "{}" "$(cksum < "{}")"; else printf "%s\n" "{}"; fi')
}

bad_case() {
  local name=$1; shift
  local watch=() pats=() limit=60 mpi=0
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    case $1 in
      --watch) watch+=("$2"); shift 2 ;;
      --timeout) limit=$2; shift 2 ;;
      --mpi) mpi=1; shift ;;
      *) pats+=("$1"); shift ;;
    esac
  done
  shift  # --
  BAD_INPUT_CASES=$((BAD_INPUT_CASES + 1))
  local before=() i
  for i in "${!watch[@]}"; do before[$i]=$(snapshot_dir "${watch[$i]}"); done
  timeout -k 5 "$limit" "$@" >"$WORK/case.out" 2>"$WORK/case.err"
  local rc=$?
  if [ $rc -eq 0 ]; then fail "$name: exit code 0"; return; fi
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then fail "$name: no exit within ${limit}s (hang)"; return; fi
  if [ $rc -gt 128 ] && [ $mpi -eq 1 ]; then
    echo "note - $name: mpirun ended by signal $((rc - 128)) after the abort"
  elif [ $rc -gt 128 ]; then fail "$name: killed by signal $((rc - 128)): $(tail -n 3 "$WORK/case.err")"; return; fi
  local p
  for p in "${pats[@]}"; do
    if ! grep -qF -- "$p" "$WORK/case.err"; then
      fail "$name: '$p' not in stderr: $(tail -n 2 "$WORK/case.err")"
      return
    fi
  done
  for i in "${!watch[@]}"; do
    if [ "${before[$i]}" != "$(snapshot_dir "${watch[$i]}")" ]; then
      fail "$name: ${watch[$i]} changed"
      return
    fi
  done
  pass "$name ($(tail -n 1 "$WORK/case.err" | cut -c1-160))"
}

bad_input_done() {
  echo "bad-input cases: $BAD_INPUT_CASES, failed: $BAD_INPUT_FAILS"
  [ "$BAD_INPUT_FAILS" -eq 0 ]
}
