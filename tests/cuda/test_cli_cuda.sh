#!/usr/bin/env bash
# `meshtrain {init,eval,grad,train} --device cuda` against the same commands on the CPU (issue 17):
# init files byte-identical; eval loss within 1e-5 relative; gradient files within 1e-5 of each
# tensor's largest magnitude; 20 f32 training steps of llama-tiny and mixtral-tiny with per-step
# losses within 1e-5 relative; bf16 on CUDA tracking f32 on the CPU within 2e-2 relative; 8-bit AdamW
# and Muon on CUDA tracking the CPU within 1e-3 relative over 20 steps; and,
# under mpirun on one GPU (host-staged collectives), llama_dp and llama_tp (np 2), llama_dp_tp and
# mixtral_ep_tp (np 4), mixtral_ep (np 1: NCCL; np 2), the FSDP plans llama_fsdp, llama_zero3 (np 2),
# llama_fsdp_tp and llama_hsdp (np 4) and mixtral_fsdp_ep (np 2) training like the single-device run,
# 8-bit AdamW with blocks shared between ranks under llama_fsdp and llama_fsdp_tp (np 2) against the
# CPU, llama_pp (np 2, 1F1B) passing `meshtrain parity` on the GPU, and sharded
# checkpoints saved on one device kind and resumed on the other under another plan (llama_pp's too,
# resumed without a plan); `generate` on the GPU choosing the CPU's tokens. Without a GPU:
# `--device cuda` fails with one line naming the flag (checked everywhere), then the script exits 77
# (meson: SKIP).
# usage: test_cli_cuda.sh MESHTRAIN_BINARY COMPARE_PY PLANS_DIR [MPIRUN]
set -u
BIN=$1
CMP=$2
PLANS=$3
MPIRUN=${4:-}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
fails=0
pass() { echo "ok   - $1"; }
fail() { echo "FAIL - $1"; fails=$((fails + 1)); }
json_loss() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])["loss"])' "$1"; }
rel_close() { python3 -c 'import sys; a,b,t=map(float,sys.argv[1:]); d=abs(a-b)/max(abs(a),1e-30); print(f"{d:.2e}"); sys.exit(0 if d<=t else 1)' "$1" "$2" "$3"; }

# ---- no GPU: one clear line ------------------------------------------------------------------------
CUDA_VISIBLE_DEVICES= "$BIN" train --device cuda --steps 1 --metrics "" >"$WORK/out" 2>"$WORK/err"
rc=$?
if [ $rc -ne 0 ] && [ $rc -lt 128 ] && [ "$(grep -c 'error:' "$WORK/err")" = 1 ] \
   && grep -q -- "--device cuda" "$WORK/err" && grep -q "use --device cpu" "$WORK/err"; then
  pass "--device cuda without a GPU: exit $rc, $(grep 'error:' "$WORK/err")"
else
  fail "--device cuda without a GPU: exit $rc, stderr: $(cat "$WORK/err")"
fi
"$BIN" train --device cuda:x --steps 1 --metrics "" >/dev/null 2>"$WORK/err" && fail "--device cuda:x accepted" \
  || { grep -q "must be cpu, cuda or cuda:N" "$WORK/err" && pass "--device cuda:x refused" || fail "--device cuda:x: $(cat "$WORK/err")"; }

if ! "$BIN" init --config llama-tiny --seed 3 --device cuda --out "$WORK/probe" >/dev/null 2>"$WORK/err"; then
  if grep -q "no CUDA device" "$WORK/err"; then
    echo "SKIP: no CUDA device: $(grep -o 'no CUDA device.*' "$WORK/err" | head -n 1)"
    [ $fails -eq 0 ] && exit 77 || exit 1
  fi
  fail "init --device cuda: $(cat "$WORK/err")"
fi

# ---- init, eval, grad ------------------------------------------------------------------------------
python3 - "$WORK/tokens.txt" <<'PY'
import random, sys
random.seed(0)
with open(sys.argv[1], "w") as f:
    for _ in range(4):
        f.write(",".join(str(random.randrange(256)) for _ in range(33)) + "\n")
PY
for model in llama-tiny mixtral-tiny; do
  "$BIN" init --config $model --seed 3 --out "$WORK/$model.cpu" >/dev/null || fail "$model: init on cpu"
  "$BIN" init --config $model --seed 3 --device cuda --out "$WORK/$model.cuda" >/dev/null 2>"$WORK/err" || fail "$model: init on cuda: $(tail -n 1 "$WORK/err")"
  cmp -s "$WORK/$model.cpu/model.safetensors" "$WORK/$model.cuda/model.safetensors" \
    && pass "$model: init --device cuda writes the CPU's bytes" || fail "$model: init on cuda differs from the cpu"
  ck="$WORK/$model.cpu"
  l_cpu=$(json_loss "$("$BIN" eval --hf "$ck" --tokens "$WORK/tokens.txt" | tail -n 1)")
  l_gpu=$(json_loss "$("$BIN" eval --hf "$ck" --tokens "$WORK/tokens.txt" --device cuda 2>"$WORK/err" | tail -n 1)" 2>/dev/null)
  d=$(rel_close "$l_cpu" "${l_gpu:-nan}" 1e-5) && pass "$model: eval loss cuda $l_gpu vs cpu $l_cpu (rel $d)" \
    || fail "$model: eval cuda '$l_gpu' vs cpu $l_cpu (rel $d) $(tail -n 1 "$WORK/err")"
  "$BIN" grad --hf "$ck" --tokens "$WORK/tokens.txt" --out "$WORK/$model.g_cpu.safetensors" >/dev/null || fail "$model: grad cpu"
  "$BIN" grad --hf "$ck" --tokens "$WORK/tokens.txt" --out "$WORK/$model.g_cuda.safetensors" --device cuda >/dev/null 2>"$WORK/err" \
    || fail "$model: grad cuda: $(tail -n 1 "$WORK/err")"
  r=$(python3 "$CMP" grads "$WORK/$model.g_cpu.safetensors" "$WORK/$model.g_cuda.safetensors" 1e-5 2>&1) \
    && pass "$model: grad --device cuda: $r" || fail "$model: grad --device cuda: $r"
done

# ---- training: 20 steps, f32 on both, bf16 on CUDA --------------------------------------------------
TRAIN="train --batch 4 --seq 32 --steps 20 --warmup 5 --lr 3e-3 --seed 5"
for model in llama-tiny mixtral-tiny; do
  "$BIN" $TRAIN --config $model --metrics "$WORK/$model.t_cpu.jsonl" >/dev/null || fail "$model: train cpu"
  "$BIN" $TRAIN --config $model --device cuda --metrics "$WORK/$model.t_cuda.jsonl" >"$WORK/$model.t_cuda.out" 2>"$WORK/err" \
    || fail "$model: train cuda: $(tail -n 1 "$WORK/err")"
  r=$(python3 "$CMP" losses "$WORK/$model.t_cpu.jsonl" "$WORK/$model.t_cuda.jsonl" 1e-5 rel 2>&1) \
    && pass "$model: 20 f32 steps on cuda vs cpu: $r" || fail "$model: f32 train cuda vs cpu: $r"
  "$BIN" $TRAIN --config $model --device cuda --precision bf16 --metrics "$WORK/$model.t_bf16.jsonl" >/dev/null 2>"$WORK/err" \
    || fail "$model: train cuda bf16: $(tail -n 1 "$WORK/err")"
  r=$(python3 "$CMP" losses "$WORK/$model.t_cpu.jsonl" "$WORK/$model.t_bf16.jsonl" 2e-2 rel 2>&1) \
    && pass "$model: 20 bf16 steps on cuda vs f32 on cpu: $r" || fail "$model: bf16 cuda vs f32 cpu: $r"
done
grep -q "device cuda:0" "$WORK/llama-tiny.t_cuda.out" && pass "train prints its device" || fail "train header: $(head -n 1 "$WORK/llama-tiny.t_cuda.out")"
# The block-wise optimizers (docs/optim.md) on the GPU against the same run on the CPU: 8-bit AdamW's
# kernel gives the CPU's bits for equal gradients, Muon's Newton-Schulz runs as CUDA matmuls; the
# gradients differ by float rounding, which a quantized or orthogonalized update can amplify.
for opt in adamw8bit muon; do
  "$BIN" $TRAIN --config llama-tiny --optimizer $opt --metrics "$WORK/$opt.cpu.jsonl" >/dev/null 2>"$WORK/err" \
    || fail "train --optimizer $opt cpu: $(tail -n 1 "$WORK/err")"
  "$BIN" $TRAIN --config llama-tiny --optimizer $opt --device cuda --metrics "$WORK/$opt.cuda.jsonl" >/dev/null \
    2>"$WORK/err" || fail "train --optimizer $opt cuda: $(tail -n 1 "$WORK/err")"
  r=$(python3 "$CMP" losses "$WORK/$opt.cpu.jsonl" "$WORK/$opt.cuda.jsonl" 1e-3 rel 2>&1) \
    && pass "llama-tiny --optimizer $opt: 20 steps on cuda vs cpu: $r" || fail "--optimizer $opt cuda vs cpu: $r"
done

# ---- generate: a memorized sentence on the GPU (docs/generate.md) --------------------------------------
python3 - "$WORK/rep.bin" <<'PY'
import struct, sys
text = b"the quick brown fox jumps over the lazy dog. " * 400
header = [20240520, 1, len(text)] + [0] * 253
open(sys.argv[1], "wb").write(struct.pack("<256i", *header) + struct.pack(f"<{len(text)}H", *text))
PY
"$BIN" train --data "$WORK/rep.bin" --batch 4 --seq 64 --steps 60 --warmup 5 --checkpoint-dir "$WORK/gen" --metrics "" \
  >/dev/null 2>"$WORK/err" || fail "generate: train the memorized sentence: $(tail -n 1 "$WORK/err")"
for mode in "" "--no-cache" "--precision bf16"; do
  c=$("$BIN" generate --hf "$WORK/gen/step-00000060" --prompt "the quick " --max-new-tokens 54 --temperature 0 $mode 2>/dev/null | tail -n 1)
  g=$("$BIN" generate --hf "$WORK/gen/step-00000060" --prompt "the quick " --max-new-tokens 54 --temperature 0 $mode \
      --device cuda 2>"$WORK/err" | tail -n 1)
  [ -n "$g" ] && [ "$c" = "$g" ] && pass "generate ${mode:-with the KV cache} on cuda: the CPU's tokens" \
    || fail "generate ${mode:-with the KV cache} on cuda: '$g' vs cpu '$c' $(tail -n 1 "$WORK/err")"
done
s1=$("$BIN" generate --hf "$WORK/gen/step-00000060" --prompt "the" --max-new-tokens 40 --seed 5 --device cuda 2>/dev/null | tail -n 1)
s2=$("$BIN" generate --hf "$WORK/gen/step-00000060" --prompt "the" --max-new-tokens 40 --seed 5 --device cuda 2>/dev/null | tail -n 1)
[ -n "$s1" ] && [ "$s1" = "$s2" ] && pass "generate on cuda: sampling with one seed twice, the same tokens" \
  || fail "generate on cuda: seed 5 twice: $s1 vs $s2"

# ---- several ranks on one GPU: host-staged collectives -----------------------------------------------
if [ -n "$MPIRUN" ]; then
  mpi() { local np=$1; shift; timeout 300 "$MPIRUN" -np "$np" --oversubscribe --mca btl self,vader "$@"; }
  for spec in llama_dp:llama-tiny:2 llama_tp:llama-tiny:2 llama_dp_tp:llama-tiny:4 mixtral_ep:mixtral-tiny:1 \
      mixtral_ep:mixtral-tiny:2 mixtral_ep_tp:mixtral-tiny:4 llama_fsdp:llama-tiny:2 llama_zero3:llama-tiny:2 \
      llama_fsdp_tp:llama-tiny:4 mixtral_fsdp_ep:mixtral-tiny:2 llama_hsdp:llama-tiny:4; do
    IFS=: read -r plan model np <<<"$spec"
    mpi $np "$BIN" $TRAIN --config $model --plan "$PLANS/$plan.plan" --device cuda --metrics "$WORK/$plan.jsonl" \
      >/dev/null 2>"$WORK/err" || fail "$plan np $np cuda: $(grep -m 1 '\] error: ' "$WORK/err" || tail -n 3 "$WORK/err")"
    r=$(python3 "$CMP" losses "$WORK/$model.t_cpu.jsonl" "$WORK/$plan.jsonl" 1e-5 rel 2>&1) \
      && pass "$plan np $np on one GPU vs one CPU device: $r" || fail "$plan np $np cuda: $r"
  done
  grep -q "staged through host memory" "$WORK/err" && pass "one-line host-staging notice" || fail "no staging notice: $(head -n 3 "$WORK/err")"
  # 8-bit AdamW with blocks shared between ranks (llama_fsdp's 1-row granularity cuts them, and
  # llama_fsdp_tp's columns): the CUDA kernel's two phases (kMax, then kApply after the absmax
  # all-reduce) under the plan on the GPU, against the same plan on the CPU.
  for plan in llama_fsdp llama_fsdp_tp; do
    mpi 2 "$BIN" $TRAIN --config llama-tiny --optimizer adamw8bit --plan "$PLANS/$plan.plan" \
      --metrics "$WORK/q8_$plan.cpu.jsonl" >/dev/null 2>"$WORK/err" || fail "adamw8bit $plan cpu: $(tail -n 1 "$WORK/err")"
    mpi 2 "$BIN" $TRAIN --config llama-tiny --optimizer adamw8bit --plan "$PLANS/$plan.plan" --device cuda \
      --metrics "$WORK/q8_$plan.cuda.jsonl" >/dev/null 2>"$WORK/err" \
      || fail "adamw8bit $plan cuda: $(grep -m 1 '\] error: ' "$WORK/err" || tail -n 3 "$WORK/err")"
    r=$(python3 "$CMP" losses "$WORK/q8_$plan.cpu.jsonl" "$WORK/q8_$plan.cuda.jsonl" 1e-3 rel 2>&1) \
      && pass "--optimizer adamw8bit under $plan np 2 (shared blocks) on one GPU vs the CPU: $r" \
      || fail "adamw8bit $plan cuda vs cpu: $r"
  done
  # Tied embeddings (llama-1b's layout) on llama-tiny under llama_fsdp on the GPU: the head's and the
  # lookup's gradients summed in place in the root unit's gradient buffer (a CUDA binary kernel),
  # against one CPU device.
  python3 - "$WORK/llama-tiny.cpu/config.json" "$WORK/tied.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["tie_word_embeddings"] = True
json.dump(c, open(sys.argv[2], "w"))
PY
  "$BIN" $TRAIN --config "$WORK/tied.json" --metrics "$WORK/tied.cpu.jsonl" >/dev/null 2>"$WORK/err" \
    || fail "tied cpu: $(tail -n 1 "$WORK/err")"
  mpi 2 "$BIN" $TRAIN --config "$WORK/tied.json" --plan "$PLANS/llama_fsdp.plan" --device cuda \
    --metrics "$WORK/tied.cuda.jsonl" >/dev/null 2>"$WORK/err" \
    || fail "tied llama_fsdp cuda: $(grep -m 1 '\] error: ' "$WORK/err" || tail -n 3 "$WORK/err")"
  r=$(python3 "$CMP" losses "$WORK/tied.cpu.jsonl" "$WORK/tied.cuda.jsonl" 1e-5 rel 2>&1) \
    && pass "tied embeddings under llama_fsdp np 2 on one GPU vs one CPU device: $r" || fail "tied llama_fsdp cuda: $r"
  # Pipeline stages on the GPU (docs/pipeline.md): activations and gradients sent point to point
  # between the ranks (host-staged here); 1F1B over 2 micro-batches against the single-device run.
  if mpi 2 "$BIN" parity --plan "$PLANS/llama_pp.plan" --config llama-tiny --device cuda --accum 2 --steps 5 \
      >"$WORK/pp.out" 2>"$WORK/err"; then
    pass "llama_pp np 2 on one GPU, 1F1B, accum 2: $(grep -m 1 '^PASS' "$WORK/pp.out" | cut -c1-120)"
  else
    fail "llama_pp np 2 cuda: $(grep -m 1 -E '^FAIL|\] error: ' "$WORK/pp.out" "$WORK/err" || tail -n 3 "$WORK/err")"
  fi
  # grad under llama_pp on the GPU (the batch through the stages as one micro-batch; host-staged):
  # against the CPU's single-device gradient file (built above for llama-tiny).
  mpi 2 "$BIN" grad --hf "$WORK/llama-tiny.cpu" --tokens "$WORK/tokens.txt" --plan "$PLANS/llama_pp.plan" --device cuda \
    --out "$WORK/pp.g_cuda.safetensors" >/dev/null 2>"$WORK/err" || fail "grad llama_pp cuda: $(tail -n 2 "$WORK/err")"
  r=$(python3 "$CMP" grads "$WORK/llama-tiny.g_cpu.safetensors" "$WORK/pp.g_cuda.safetensors" 1e-5 2>&1) \
    && pass "grad --plan llama_pp np 2 --device cuda vs one CPU device: $r" || fail "grad llama_pp cuda: $r"
  # Sharded checkpoints across devices and plans (docs/checkpoints.md): saved at step 10 on the GPU
  # under llama_tp, resumed on the CPU under llama_dp; and saved on the CPU, resumed on the GPU. Both
  # runs' 20 losses stay within 1e-5 of the single CPU device.
  for way in cuda:cpu cpu:cuda; do
    IFS=: read -r from to <<<"$way"
    ck="$WORK/ck_$from"
    mpi 2 "$BIN" $TRAIN --config llama-tiny --plan "$PLANS/llama_tp.plan" --device "$from" --metrics "$ck.jsonl" \
      --checkpoint-dir "$ck" --stop-at 10 >/dev/null 2>"$WORK/err" || fail "save on $from: $(grep -m 1 '\] error: ' "$WORK/err")"
    mpi 2 "$BIN" $TRAIN --config llama-tiny --plan "$PLANS/llama_dp.plan" --device "$to" --metrics "$ck.jsonl" \
      --checkpoint-dir "$ck" --resume >/dev/null 2>"$WORK/err" || fail "resume on $to: $(grep -m 1 '\] error: ' "$WORK/err")"
    r=$(python3 "$CMP" losses "$WORK/llama-tiny.t_cpu.jsonl" "$ck.jsonl" 1e-5 rel 2>&1) \
      && pass "sharded checkpoint saved on $from (llama_tp np 2), resumed on $to (llama_dp np 2): $r" \
      || fail "sharded checkpoint $from -> $to: $r"
  done
  # A sharded checkpoint of a pipeline run (each stage writes its own tensors, docs/pipeline.md):
  # saved at step 10 on the GPU under llama_pp, resumed on the CPU without a plan.
  "$BIN" $TRAIN --config llama-tiny --accum 2 --metrics "$WORK/pp_ref.jsonl" >/dev/null 2>"$WORK/err" \
    || fail "pp reference on cpu: $(tail -n 1 "$WORK/err")"
  ck="$WORK/ck_pp"
  mpi 2 "$BIN" $TRAIN --config llama-tiny --accum 2 --plan "$PLANS/llama_pp.plan" --device cuda --metrics "$ck.jsonl" \
    --checkpoint-dir "$ck" --stop-at 10 >/dev/null 2>"$WORK/err" || fail "pp save on cuda: $(grep -m 1 '\] error: ' "$WORK/err")"
  "$BIN" $TRAIN --config llama-tiny --accum 2 --metrics "$ck.jsonl" --checkpoint-dir "$ck" --resume >/dev/null 2>"$WORK/err" \
    || fail "pp resume on cpu: $(tail -n 1 "$WORK/err")"
  r=$(python3 "$CMP" losses "$WORK/pp_ref.jsonl" "$ck.jsonl" 1e-5 rel 2>&1) \
    && pass "sharded llama_pp checkpoint saved on cuda (np 2), resumed on cpu without a plan: $r" \
    || fail "sharded llama_pp checkpoint cuda -> cpu: $r"
fi

echo "$fails failure(s)"
[ $fails -eq 0 ]
