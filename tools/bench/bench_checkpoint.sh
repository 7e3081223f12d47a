#!/usr/bin/env bash
# Sharded vs gathered (rank-0 full tensors) checkpoints of `meshtrain train --plan`, under mpirun at
# np 2 and 4, for llama-tiny and plans/models/llama-30m.json (docs/checkpoints.md, "Sharded checkpoints",
# measured figures):
#   save   seconds the training loop was blocked by one save at the end ("checkpoint saves blocked
#          training for"; sharded: --sync-save, i.e. the whole write and commit), and by asynchronous
#          saves every step (sharded, default) vs synchronous ones (--sync-save);
#   load   seconds to load the checkpoint on --resume ("checkpoint loaded in");
#   RSS    peak resident memory of each rank (/usr/bin/time %M) for a 1-step run + save, and a resume.
# usage: bench_checkpoint.sh MESHTRAIN_BINARY PLANS_DIR [MPIRUN]
set -u
BIN=$1
PLANS=$2
MPIRUN=${3:-mpirun}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi() { local np=$1; shift; "$MPIRUN" -np "$np" --oversubscribe --mca btl self,vader "$@"; }
num() { grep -o "$1 [0-9.]*" "$2" | tail -n 1 | awk '{print $NF}'; }
rss() { grep -o 'RSS [0-9]*' "$1" | awk '{printf "%s%.0f", (NR > 1 ? "/" : ""), $2 / 1024} END {print " MiB"}'; }
rss0() { grep -o 'RSS [0-9]*' "$1" | awk '{if ($2 > m) m = $2} END {printf "%.0f", m / 1024}'; }  # the largest rank
ratio() { python3 -c 'import sys; a, b = map(float, sys.argv[1:]); print(f"{a / b:.2f}x" if b > 0 else "-")' "$1" "$2"; }
printf "%-10s %2s %-11s %-8s %10s %10s %20s %20s\n" model np plan format "save (s)" "load (s)" "RSS save (per rank)" "RSS load"
declare -A SAVE LOAD RS RL
for cfg in llama-tiny "$PLANS/models/llama-30m.json"; do
  name=$(basename "$cfg" .json)
  for np in 2 4; do
    plan=llama_tp; [ $np = 4 ] && plan=llama_dp_tp  # llama-tiny's 2 KV heads do not split 4 ways
    for fmt in sharded gathered; do
      flag=--sync-save; [ $fmt = gathered ] && flag=--gather-save
      d="$WORK/$name.$np.$fmt"
      T=(train --config "$cfg" --batch 4 --seq 32 --steps 2 --metrics "" --plan "$PLANS/$plan.plan" --checkpoint-dir "$d")
      mpi "$np" /usr/bin/time -f "RSS %M" "$BIN" "${T[@]}" --stop-at 1 $flag >"$WORK/s.out" 2>"$WORK/s.err" || { echo "save failed: $(tail -n 2 "$WORK/s.err")"; continue; }
      mpi "$np" /usr/bin/time -f "RSS %M" "$BIN" "${T[@]}" --resume $flag >"$WORK/l.out" 2>"$WORK/l.err" || { echo "load failed: $(tail -n 2 "$WORK/l.err")"; continue; }
      SAVE[$fmt]=$(num 'blocked training for' "$WORK/s.out"); LOAD[$fmt]=$(num 'loaded in' "$WORK/l.out")
      RS[$fmt]=$(rss0 "$WORK/s.err"); RL[$fmt]=$(rss0 "$WORK/l.err")
      printf "%-10s %2s %-11s %-8s %10s %10s %20s %20s\n" "$name" "$np" "$plan" "$fmt" "${SAVE[$fmt]}" "${LOAD[$fmt]}" \
        "$(rss "$WORK/s.err")" "$(rss "$WORK/l.err")"
    done
    echo "  gathered / sharded: save $(ratio "${SAVE[gathered]}" "${SAVE[sharded]}"), load $(ratio "${LOAD[gathered]}" "${LOAD[sharded]}"), peak RSS (largest rank) save $(ratio "${RS[gathered]}" "${RS[sharded]}"), load $(ratio "${RL[gathered]}" "${RL[sharded]}")"
  done
done
echo
echo "training loop blocked by saves every step (llama-30m, llama_tp, np 2, 4 steps):"
declare -A B
for mode in async sync; do
  flag=; [ $mode = sync ] && flag=--sync-save
  mpi 2 "$BIN" train --config "$PLANS/models/llama-30m.json" --batch 4 --seq 32 --steps 4 --metrics "" --plan "$PLANS/llama_tp.plan" \
    --checkpoint-dir "$WORK/every.$mode" --checkpoint-every 1 $flag >"$WORK/e.out" 2>"$WORK/e.err" || echo "failed: $(tail -n 2 "$WORK/e.err")"
  B[$mode]=$(num 'blocked training for' "$WORK/e.out")
  echo "  $mode: ${B[$mode]} s"
done
echo "  sync / async: $(ratio "${B[sync]}" "${B[async]}")"
