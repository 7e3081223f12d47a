#!/usr/bin/env bash
# The sanitizer build's leak checking works under mpirun (docs/robustness.md): a job whose ranks
# each leak one block (leak_on_purpose.cpp) must fail, with exactly one leak report per rank, and
# each names leak_on_purpose. A suppression that hid meshtrain's own leaks, or one that no longer
# matched Open MPI's (more reports), fails this test.
# usage: test_leak_check.sh MPIRUN BINARY
set -u
MPIRUN=$1 BIN=$2
# Root in containers, more ranks than cores (meson passes these too; a manual run needs them).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
timeout -k 5 120 "$MPIRUN" -np 2 --oversubscribe --mca btl self,vader "$BIN" >"$OUT" 2>&1
rc=$?
cat "$OUT"
echo "--- exit code $rc"
# Counted anywhere in a line: the two ranks write at once, and one rank's report can start on a
# line of the other's abort backtrace ("[vm:14701] [ 9] Direct leak of 4096 ...").
leaks=$(grep -oE "(Direct|Indirect) leak of" "$OUT" | wc -l)
ours=$(grep -o "Direct leak of 4096 byte(s) in 1 object(s)" "$OUT" | wc -l)
named=$(grep -cE "#[0-9]+ 0x[0-9a-f]+ in .*leak_on_purpose\(\)" "$OUT")
if [ $rc -eq 0 ]; then echo "FAIL: the leaking job exited 0"; exit 1; fi
if [ "$ours" -ne 2 ] || [ "$named" -ne 2 ]; then
  echo "FAIL: expected the 4096-byte leak reported by both ranks, naming leak_on_purpose (got $ours reports, $named named)"
  exit 1
fi
if [ "$leaks" -ne 2 ]; then echo "FAIL: $leaks leak reports, 2 expected: a suppression no longer matches"; exit 1; fi
echo "OK: each rank reported its own leak and nothing else"
