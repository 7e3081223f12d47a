#!/usr/bin/env bash
# Sharded vs gathered (rank-0 full tensors) checkpoints of `meshtrain train --plan`, under mpirun at
# np 2 and 4, for llama-tiny and a ~25M-parameter LLaMA (docs/checkpoints.md, "Sharded checkpoints",
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
cat >"$WORK/llama-25m.json" <<'JSON'
{"model_type": "llama", "vocab_size": 256, "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 8,
 "num_attention_heads": 8, "num_key_value_heads": 8, "max_position_embeddings": 256}
JSON
mpi() { local np=$1; shift; "$MPIRUN" -np "$np" --oversubscribe --mca btl self,vader "$@"; }
num() { grep -o "$1 [0-9.]*" "$2" | tail -n 1 | awk '{print $NF}'; }
rss() { grep -o '^RSS [0-9]*' "$1" | awk '{printf "%s%.0f", (NR > 1 ? "/" : ""), $2 / 1024} END {print " MiB"}'; }
printf "%-10s %2s %-8s %10s %10s %18s %18s\n" model np format "save (s)" "load (s)" "RSS save (rank0/..)" "RSS load"
for cfg in llama-tiny "$WORK/llama-25m.json"; do
  name=$(basename "$cfg" .json)
  for np in 2 4; do
    for fmt in sharded gathered; do
      flag=--sync-save; [ $fmt = gathered ] && flag=--gather-save
      d="$WORK/$name.$np.$fmt"
      T=(train --config "$cfg" --batch 4 --seq 32 --steps 2 --metrics "" --plan "$PLANS/llama_tp.plan" --checkpoint-dir "$d")
      mpi "$np" /usr/bin/time -f "RSS %M" "$BIN" "${T[@]}" --stop-at 1 $flag >"$WORK/s.out" 2>"$WORK/s.err" || { echo "save failed: $(tail -n 2 "$WORK/s.err")"; continue; }
      mpi "$np" /usr/bin/time -f "RSS %M" "$BIN" "${T[@]}" --resume $flag >"$WORK/l.out" 2>"$WORK/l.err" || { echo "load failed: $(tail -n 2 "$WORK/l.err")"; continue; }
      printf "%-10s %2s %-8s %10s %10s %18s %18s\n" "$name" "$np" "$fmt" "$(num 'blocked training for' "$WORK/s.out")" \
        "$(num 'loaded in' "$WORK/l.out")" "$(rss "$WORK/s.err")" "$(rss "$WORK/l.err")"
    done
  done
done
echo
echo "training loop blocked by saves every step (llama-25m, llama_tp, np 2, 4 steps):"
for mode in async sync; do
  flag=; [ $mode = sync ] && flag=--sync-save
  mpi 2 "$BIN" train --config "$WORK/llama-25m.json" --batch 4 --seq 32 --steps 4 --metrics "" --plan "$PLANS/llama_tp.plan" \
    --checkpoint-dir "$WORK/every.$mode" --checkpoint-every 1 $flag >"$WORK/e.out" 2>"$WORK/e.err" || echo "failed: $(tail -n 2 "$WORK/e.err")"
  echo "  $mode: $(num 'blocked training for' "$WORK/e.out") s"
done
