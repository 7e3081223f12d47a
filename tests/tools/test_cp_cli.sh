#!/usr/bin/env bash
# Context parallelism through the real binary under real mpirun (docs/context_parallel.md):
#   plan:   `meshtrain plan` prints the cp split (ZS, each rank's positions for --seq);
#   parity: llama_cp at np 2 and 4 and llama_dp_cp_tp at np 4 ([dp=1, cp=2, tp=2]) against one
#           device, 20 steps, --dropout 0.1 (attention dropout inside the ring, residual dropout on
#           sequence shards): every loss, step 1's grad norm and gradients within 1e-5 relative;
#           weights and gradients after the 20 AdamW steps within 5e-3 (AdamW magnifies rounding);
#   bad input: --seq not divisible by 2 x cp (names --seq and the plan line), a cp dim the mesh
#           lacks (names the plan line); --estimate of a cp plan counts the ring's shifts over cp.
# MODE fast (suite cli/mpi, about 20 s) or slow (np 4 runs and llama_dp_cp_tp: suite slow).
# usage: test_cp_cli.sh MESHTRAIN_BINARY MPIRUN PLANS_DIR [fast|slow]
set -u
BIN=$1
MPIRUN=$2
PLANS=$3
MODE=${4:-fast}
source "$(dirname "$0")/parity_lib.sh"

if [ "$MODE" = fast ]; then
  # ---- plan -------------------------------------------------------------------------------------
  "$BIN" plan --plan "$PLANS/llama_cp.plan" --world 2 --seq 16 > "$WORK/plan.txt" 2>&1
  for want in "# context parallel over cp (2 ranks): the sequence is ZS(1), load-balanced" \
      "llama_cp.plan:8:1" "cp=0: positions [0, 4) + [12, 16) of --seq 16" "cp=1: positions [4, 12) of --seq 16" \
      "model.forward_pre:<in>:0:to(ZS(1)@cp)" "model.layers.0.forward_pre:<in>:1:to(ZS(0)@cp)"; do
    grep -qF -- "$want" "$WORK/plan.txt" && pass "plan prints: $want" || fail "plan lacks '$want': $(head -8 "$WORK/plan.txt")"
  done

  # ---- parity -----------------------------------------------------------------------------------
  parity "$PLANS/llama_cp.plan" 2 20 1 1e-5 5e-3

  # ---- bad input --------------------------------------------------------------------------------
  expect_error "--seq not divisible by 2 x cp" "--seq 18" "not divisible by 2 x cp = 4" "llama_cp.plan:8:1" -- \
    mpi 2 "$BIN" parity --plan "$PLANS/llama_cp.plan" --batch 2 --seq 18 --steps 1 --warmup 1
  expect_error "train: --seq not divisible by 2 x cp" "--seq 6" "not divisible by 2 x cp = 4" "llama_cp.plan:8:1" -- \
    mpi 2 "$BIN" train --plan "$PLANS/llama_cp.plan" --batch 2 --seq 6 --steps 1 --warmup 1
  # eval and grad take the sizes from the token file: it is named (an internal local_layout error
  # before 2026-11-28).
  "$BIN" init --config llama-tiny --out "$WORK/hf" >/dev/null 2>&1
  printf '1,2,3,4,5,6\n7,8,9,10,11,12\n' > "$WORK/tok6.txt"
  expect_error "eval: an input length not divisible by 2 x cp" "tok6.txt: the input length" "5 is not divisible by 2 x cp = 4" \
    "llama_cp.plan:8:1" -- mpi 2 "$BIN" eval --hf "$WORK/hf" --tokens "$WORK/tok6.txt" --plan "$PLANS/llama_cp.plan"
  # init runs no forward: a cp plan at np 3 (cp 3) is no --seq error (the start-up check used 8
  # tokens, not divisible by 2 x 3, for one day); its weights equal one device's.
  mpi 3 "$BIN" init --config llama-tiny --out "$WORK/hf_cp3" --plan "$PLANS/llama_cp.plan" >"$WORK/out" 2>"$WORK/err" \
    && cmp -s "$WORK/hf/model.safetensors" "$WORK/hf_cp3/model.safetensors" \
    && pass "init under llama_cp at np 3: one device's bytes" || fail "init under llama_cp np 3: $(tail -n 2 "$WORK/err")"
  printf 'mesh dp=*\nplace model <in>:0 dp=S(0) cp=ZS(1)\n' > "$WORK/nocp.plan"
  expect_error "a cp dim the mesh lacks" "nocp.plan:2:28" "'cp=ZS(1)' names no mesh dim" -- \
    "$BIN" plan --plan "$WORK/nocp.plan" --world 2
  # --estimate of a cp plan: the ring's shifts (all_to_all over cp) counted on every rank
  # (tests/plan/test_estimate.cpp compares them with a real step).
  if "$BIN" plan --plan "$PLANS/llama_cp.plan" --world 2 --estimate --seq 16 --json > "$WORK/cp_est.json" &&
     python3 -c "import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if all(any(c['kind']=='all_to_all' and c['dims']=='cp' and c['calls']>0 for c in r['comm']) for r in d['ranks']) else 1)" "$WORK/cp_est.json"; then
    pass "--estimate of a cp plan counts the ring's shifts over cp"
  else
    fail "--estimate of a cp plan: $(head -c 400 "$WORK/cp_est.json")"
  fi
else
  parity "$PLANS/llama_cp.plan" 4 20 1 1e-5 5e-3
  parity "$PLANS/llama_dp_cp_tp.plan" 4 20 1 1e-5 5e-3
  # Two micro-batches: the ring and its dropout offsets per micro-batch.
  parity "$PLANS/llama_cp.plan" 2 5 2 1e-5 5e-3
fi

[ $fails -eq 0 ] && echo "all passed" || echo "$fails failed"
exit $((fails > 0))
