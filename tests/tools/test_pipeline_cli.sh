#!/usr/bin/env bash
# Pipeline parallelism through the real binary under real mpirun (issue 15, docs/pipeline.md):
#   plan:   `meshtrain plan` prints the stages, their parameter counts and the schedule;
#   parity: the stock pipeline plans train like one device (every loss, grad norm, weight and
#           gradient in the --json report within 1e-5 relative), with dropout 0.1, under 1F1B
#           GPipe and interleaved 1F1B; tied word embeddings (the gradient summed over the first and last stage);
#   checkpoints: a run saved under pp 2 resumes under no plan, pp 4 and pp 2 x dp 2 with the
#           losses of the uninterrupted single-device run; a sharded checkpoint of llama_tp
#           resumes under pp 2;
#   bad input (exit 2, naming the flag or plan line): --accum below the stage count under 1F1B,
#           a pp size that does not divide the layer count, an entry naming the pipeline dim.
# MODE fast (suite cli/mpi, ~25 s) or slow (pp 4, pp x tp, pp x dp x tp at np 8, pp x ZeRO-3;
# suite slow, ~25 s).
# usage: test_pipeline_cli.sh MESHTRAIN_BINARY MPIRUN PLANS_DIR [fast|slow]
set -u
BIN=$1
MPIRUN=$2
PLANS=$3
MODE=${4:-fast}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1
export MT_COLLECTIVE_TIMEOUT_S=${MT_COLLECTIVE_TIMEOUT_S:-30}
fails=0
pass() { echo "ok   - $1"; }
fail() { echo "FAIL - $1"; fails=$((fails + 1)); }
mpi() { local np=$1; shift; timeout 180 "$MPIRUN" -np "$np" --oversubscribe --mca btl self,vader "$@"; }
SMALL="--batch 2 --seq 16 --warmup 1 --seed 7"

# A parity --json report within TOL (every loss, step 1's grad norm and gradients) and DTOL (later
# grad norms, weights and gradients after the last step: what AdamW magnifies when a plan's
# reductions round differently), verdict pass; prints the worst of each kind.
report_within() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); tol, dtol = float(sys.argv[2]), float(sys.argv[3])
tight, loose = [], []
for s in r["steps"]:
    for k in ("loss_rel", "grad_norm_rel"):
        if s[k] is not None:
            (tight if k == "loss_rel" or s["step"] == 1 else loose).append((float(s[k]), f"step {s['step']} {k}"))
for p in r["parameters"]:
    if "grad_step1" in p: tight.append((float(p["grad_step1"]["rel"]), f"step-1 grad {p['name']}"))
    for k in ("weight", "grad"):
        if k in p: loose.append((float(p[k]["rel"]), f"{k} {p['name']}"))
assert tight and loose, "nothing compared"
ok, msg = r["verdict"] == "pass", []
for name, xs, t in (("tol", tight, tol), ("drift-tol", loose, dtol)):
    w = max(xs); ok = ok and w[0] <= t
    msg.append(f"{len(xs)} within {name} {t:g}, worst {w[0]:.2e} ({w[1]})")
print("; ".join(msg) + f"; {len(r['steps'])} steps")
sys.exit(0 if ok else 1)
PY
}

# parity PLAN NP STEPS ACCUM TOL DTOL [extra flags]
parity() {
  local plan=$1 np=$2 steps=$3 accum=$4 tol=$5 dtol=$6; shift 6
  local tag="$(basename "$plan" .plan) np $np, $steps steps, accum $accum"
  if mpi "$np" "$BIN" parity --plan "$plan" $SMALL --steps "$steps" --accum "$accum" --dropout 0.1 \
      --json "$WORK/r.json" "$@" >"$WORK/out" 2>"$WORK/err"; then
    r=$(report_within "$WORK/r.json" "$tol" "$dtol" 2>&1) && pass "$tag: $r" || fail "$tag: $r"
  else
    fail "$tag: exit $?: $(tail -n 2 "$WORK/out") $(grep '] error: ' "$WORK/err" | tail -n 1)"
  fi
}

# Expects exit 2 (or 1 for train) with every PATTERN in the last error line.
expect_error() {
  local name=$1; shift
  local pats=()
  while [ "$1" != "--" ]; do pats+=("$1"); shift; done
  shift
  "$@" >"$WORK/out" 2>"$WORK/err"
  local rc=$?
  local last
  last=$(grep "error: " "$WORK/err" | tail -n 1)
  if [ $rc -eq 0 ]; then fail "$name: exit 0"; return; fi
  for p in "${pats[@]}"; do
    if ! grep -qF -- "$p" <<<"$last"; then fail "$name: '$p' not in: $last"; return; fi
  done
  pass "$name (exit $rc): ${last#*error: }"
}

sed 's/pp=1f1b/pp=gpipe/' "$PLANS/llama_pp.plan" > "$WORK/llama_pp_gpipe.plan"

if [ "$MODE" = fast ]; then
  # ---- plan -------------------------------------------------------------------------------------
  "$BIN" plan --plan "$PLANS/llama_pp.plan" --world 2 --accum 4 > "$WORK/plan.txt" 2>&1
  for want in "# pipeline over pp (2 stages), schedule 1f1b" \
      "stage 0: model.embed_tokens .. model.layers.1 (3 units, 395776 parameters)" \
      "stage 1: model.layers.2 .. lm_head (4 units, 395904 parameters)" \
      "ideal bubble fraction (p-1)/(m+p-1) = 0.200" "stage 0: F0 F1 B0 F2 B1 F3 B2 B3" \
      "stage 1: F0 B0 F1 B1 F2 B2 F3 B3"; do
    grep -qF -- "$want" "$WORK/plan.txt" && pass "plan prints: $want" || fail "plan lacks '$want': $(head -8 "$WORK/plan.txt")"
  done

  # ---- parity -----------------------------------------------------------------------------------
  # Pipeline alone sums every gradient in the single-device order: 1e-5 for everything, 20 steps.
  parity "$PLANS/llama_pp.plan" 2 20 2 1e-5 1e-5
  parity "$WORK/llama_pp_gpipe.plan" 2 3 1 1e-5 1e-5
  # Interleaved 1F1B: llama-tiny's 4 layers as 2 x 2 chunks, each micro-batch crossing both stages
  # twice.
  parity "$PLANS/llama_pp_interleaved.plan" 2 20 4 1e-5 1e-5
  # Tied word embeddings: the first and the last stage both hold the embedding weight and sum its
  # gradient (in another order than one device: 1e-4 after 20 AdamW steps).
  python3 - "$WORK/tied.json" <<'PY'
import json, sys
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256, "hidden_size": 128,
           "intermediate_size": 344, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
           "hidden_act": "silu", "max_position_embeddings": 1024, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
           "tie_word_embeddings": True, "initializer_range": 0.02, "torch_dtype": "float32"}, open(sys.argv[1], "w"))
PY
  parity "$PLANS/llama_pp.plan" 2 20 2 1e-5 1e-4 --config "$WORK/tied.json"
  # With dp the gradient all-reduce rounds differently (as llama_dp): drift-tol after AdamW.
  parity "$PLANS/llama_pp_dp.plan" 4 2 2 1e-5 5e-2 --batch 4

  # ---- checkpoints across stage counts ---------------------------------------------------------
  F="$SMALL --steps 4 --accum 2 --checkpoint-every 2"
  "$BIN" train $F --checkpoint-dir "$WORK/ref" > "$WORK/ref.txt" 2>&1 || fail "single-device train: $(tail -n 2 "$WORK/ref.txt")"
  want=$(grep -E '^step +[34]/4' "$WORK/ref.txt" | sed 's/.*| loss \([0-9.]*\) | grad norm \([0-9.]*\).*/\1 \2/')
  mpi 2 "$BIN" train --plan "$PLANS/llama_pp.plan" $F --stop-at 2 --checkpoint-dir "$WORK/pp2" > "$WORK/t.txt" 2>&1 \
    || fail "train under llama_pp np 2: $(tail -n 2 "$WORK/t.txt")"
  resume() {  # TAG NP [--plan P]
    local tag=$1 np=$2; shift 2
    rm -rf "$WORK/ck" && cp -r "$WORK/pp2" "$WORK/ck"
    if [ "$np" = 1 ]; then "$BIN" train "$@" $F --checkpoint-dir "$WORK/ck" --resume > "$WORK/t.txt" 2>&1
    else mpi "$np" "$BIN" train "$@" $F --checkpoint-dir "$WORK/ck" --resume > "$WORK/t.txt" 2>&1; fi
    got=$(grep -E '^step +[34]/4' "$WORK/t.txt" | sed 's/.*| loss \([0-9.]*\) | grad norm \([0-9.]*\).*/\1 \2/')
    [ -n "$got" ] && [ "$got" = "$want" ] && pass "pp 2 checkpoint resumed $tag: steps 3-4 as one device ($(echo $got))" \
      || fail "pp 2 checkpoint resumed $tag: '$got' vs '$want': $(grep error "$WORK/t.txt" | tail -n 1)"
  }
  resume "without a plan" 1
  resume "under gpipe pp 4" 4 --plan "$WORK/llama_pp_gpipe.plan"
  resume "under pp 2 x dp 2" 4 --plan "$PLANS/llama_pp_dp.plan"
  # A sharded checkpoint of another plan: each stage reads its own tensors' boxes.
  mpi 2 "$BIN" train --plan "$PLANS/llama_tp.plan" $F --stop-at 2 --checkpoint-dir "$WORK/tp" > "$WORK/t.txt" 2>&1 \
    || fail "train under llama_tp: $(tail -n 2 "$WORK/t.txt")"
  rm -rf "$WORK/pp2" && cp -r "$WORK/tp" "$WORK/pp2"
  resume "from a sharded llama_tp checkpoint under pp 2" 2 --plan "$PLANS/llama_pp.plan"

  # ---- bad input --------------------------------------------------------------------------------
  expect_error "1F1B with --accum below the stage count" "--accum 1" "fewer micro-batches than the 2 pipeline stages" \
    "schedule pp=gpipe" -- mpi 2 "$BIN" parity --plan "$PLANS/llama_pp.plan" $SMALL --steps 1 --accum 1
  expect_error "interleaved with --accum not a multiple of pp" "--accum 3 is not a multiple of the 2 pipeline stages" -- \
    mpi 2 "$BIN" parity --plan "$PLANS/llama_pp_interleaved.plan" $SMALL --steps 1 --accum 3
  expect_error "pp 3 does not divide 4 layers" "llama_pp.plan:6:1" "split evenly over pp=3" -- \
    mpi 3 "$BIN" parity --plan "$PLANS/llama_pp.plan" $SMALL --steps 1 --accum 3
  printf 'mesh pp=2 dp=*\nstages pp=even\nplace model <in>:0 pp=S(0)\n' > "$WORK/bad.plan"
  expect_error "an entry naming the pipeline dim" "bad.plan:3:20" "names the pipeline dim 'pp'" -- \
    "$BIN" plan --plan "$WORK/bad.plan" --world 2
  printf 'mesh pp=2\nstage model\\.embed_tokens|model\\.layers\\.[0-2] pp=0\nstage model\\.layers\\.[23]|model\\.norm|lm_head pp=1\n' \
    > "$WORK/twice.plan"
  expect_error "a unit on two stages" "twice.plan:3:7" "assigns model.layers.2 to stage 1" -- \
    "$BIN" plan --plan "$WORK/twice.plan" --world 2
else
  parity "$PLANS/llama_pp.plan" 4 20 4 1e-5 1e-5
  parity "$WORK/llama_pp_gpipe.plan" 4 5 2 1e-5 1e-5
  # TP partial sums round differently (as llama_tp): drift-tol after AdamW.
  parity "$PLANS/llama_pp_tp.plan" 4 5 2 1e-5 5e-2
  parity "$PLANS/llama_pp_dp_tp.plan" 8 3 2 1e-5 5e-2 --batch 4
  # ZeRO-3 within each stage (parameters stored S(0) over dp, gathered for compute).
  printf 'mesh pp=2 dp=*\nstages pp=even\nplace model <in>:0 dp=S(0)\nfactory model rope dp=R\ninit .* .* dp=S(0)\nrun .* .* dp=R\n' \
    > "$WORK/llama_pp_zero3.plan"
  parity "$WORK/llama_pp_zero3.plan" 4 3 2 1e-5 5e-2 --batch 4
fi

echo "$fails failure(s)"
[ $fails -eq 0 ]
