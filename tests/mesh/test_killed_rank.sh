#!/usr/bin/env bash
# A dead or hung peer must end the job with an error, never a silent hang.
# usage: test_killed_rank.sh MPIRUN BINARY MODE(hang|exit|create)
# hang: rank 0 must abort after MT_COLLECTIVE_TIMEOUT_S=5 with a message naming all_reduce.
# exit: rank 1 leaves without finalizing; the job must still end non-zero.
# create: rank 1 never joins the communicator's creation; rank 0 must abort after the same time.
# throw: rank 0 fails with an all_reduce in flight; with MT_COLLECTIVE_TIMEOUT_S=40 the job must
#   still end within 20 s, with rank 0's error (it used to wait out the timeout while unwinding).
set -u
MPIRUN=$1 BIN=$2 MODE=$3
export MT_COLLECTIVE_TIMEOUT_S=5
[ "$MODE" = throw ] && export MT_COLLECTIVE_TIMEOUT_S=40
# Root in containers, more ranks than cores (meson passes these too; a manual run needs them).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
start=$(date +%s)
timeout -k 5 60 "$MPIRUN" -np 2 --oversubscribe --mca btl self,vader "$BIN" "$MODE" >"$OUT" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
cat "$OUT"
echo "--- exit code $rc after ${elapsed}s"
if [ $rc -eq 0 ]; then echo "FAIL: the job exited 0"; exit 1; fi
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then echo "FAIL: the job hung until the 60 s limit"; exit 1; fi
if [ "$MODE" = hang ]; then
  if ! grep -q "all_reduce timed out after" "$OUT"; then echo "FAIL: no timeout error naming all_reduce"; exit 1; fi
  if ! grep -q "world ranks \[0, 1\]" "$OUT"; then echo "FAIL: the error does not name the group"; exit 1; fi
elif [ "$MODE" = throw ]; then
  if ! grep -q "rank 0 failed with an all_reduce in flight" "$OUT"; then echo "FAIL: rank 0's error is missing"; exit 1; fi
  if [ "$elapsed" -ge 20 ]; then echo "FAIL: the job took ${elapsed}s to end (the in-flight collective's timeout?)"; exit 1; fi
elif [ "$MODE" = create ]; then
  if ! grep -q "communicator creation timed out after" "$OUT"; then echo "FAIL: no timeout error naming the creation"; exit 1; fi
  if ! grep -q "world ranks \[0, 1\]" "$OUT"; then echo "FAIL: the error does not name the group"; exit 1; fi
else
  if ! grep -qE "all_reduce timed out after|exiting improperly" "$OUT"; then echo "FAIL: no error about the lost rank"; exit 1; fi
fi
echo "ok: the job ended with exit code $rc in ${elapsed}s"
