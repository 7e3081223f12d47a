#!/usr/bin/env bash
# Pipeline parallelism through the real binary under real mpirun (issue 15, docs/pipeline.md):
#   plan:   `meshtrain plan` prints the stages, their parameter counts and the schedule;
#   parity: the stock pipeline plans train like one device (every loss, grad norm, weight and
#           gradient in the --json report within 1e-5 relative), with dropout 0.1, under 1F1B
#           GPipe and interleaved 1F1B; tied word embeddings (the gradient summed over the first and last stage);
#   checkpoints: a run saved under pp 2 (a sharded checkpoint: each stage writes its own
#           tensors) resumes under no plan, pp 4 and pp 2 x dp 2 with the losses of the
#           uninterrupted single-device run; sharded checkpoints of llama_tp and of pp 2 x FSDP
#           resume under pp 2 (and the latter without a plan);
#   pp x FSDP (llama_pp_fsdp, pp 2 x dp 2): plan prints each stage's units; parity under 1F1B,
#           GPipe and interleaved 1F1B; tied embeddings in a unit refused, left out they train;
#   eval, grad, init: one device's loss, and its gradient and init files byte for byte, under
#           llama_pp and llama_pp_interleaved (tied embeddings under the latter); slow: grads under pp x tp,
#           pp x dp x tp and pp x FSDP within 1e-5, mixtral-tiny over 2 stages byte for byte;
#   MoE router losses: mixtral-tiny under pp 2 (1F1B and interleaved) with the load-balancing and
#           z-losses trains like one device; slow: pp x ep;
#   bad input (exit 2, naming the flag or plan line): --accum below the stage count under 1F1B,
#           a pp size that does not divide the layer count, an entry naming the pipeline dim.
# MODE fast (suite cli/mpi, ~60 s with the pp x FSDP rows) or slow (pp 4, pp x tp, pp x dp x tp and pp x FSDP x tp at np 8, pp x ZeRO-3,
# pp x cp (llama_pp_cp, 1F1B and GPipe);
# suite slow, ~25 s).
# usage: test_pipeline_cli.sh MESHTRAIN_BINARY MPIRUN PLANS_DIR [fast|slow]
set -u
BIN=$1
MPIRUN=$2
PLANS=$3
MODE=${4:-fast}
source "$(dirname "$0")/parity_lib.sh"

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

  # FSDP units within each stage (llama_pp_fsdp, pp 2 x dp 2): several micro-batches in flight per
  # unit under 1F1B, GPipe and interleaved 1F1B; dp's reduce-scatters round differently from one
  # device (as llama_fsdp): 1e-5 for losses and step-1 gradients, drift-tol after AdamW.
  "$BIN" plan --plan "$PLANS/llama_pp_fsdp.plan" --world 4 --accum 4 > "$WORK/plan.txt" 2>&1
  for want in "# stage 0: 3 FSDP units on mesh [dp=2]" "#   unit model.layers.1 over dp (" \
      "# stage 1: 3 FSDP units on mesh [dp=2]" "#   unit model.layers.3 over dp (" \
      "#   unit (root) over dp (${PLANS}/llama_pp_fsdp.plan:13:1): 2 tensors over 2 ranks"; do
    grep -qF -- "$want" "$WORK/plan.txt" && pass "pp x fsdp plan prints: $want" \
      || fail "pp x fsdp plan lacks '$want': $(sed -n 8,12p "$WORK/plan.txt")"
  done
  sed 's/pp=1f1b/pp=gpipe/' "$PLANS/llama_pp_fsdp.plan" > "$WORK/llama_pp_fsdp_gpipe.plan"
  sed 's/pp=1f1b/pp=interleaved(2)/' "$PLANS/llama_pp_fsdp.plan" > "$WORK/llama_pp_fsdp_interleaved.plan"
  parity "$PLANS/llama_pp_fsdp.plan" 4 20 4 1e-5 5e-3 --batch 4
  parity "$WORK/llama_pp_fsdp_gpipe.plan" 4 20 4 1e-5 5e-3 --batch 4
  parity "$WORK/llama_pp_fsdp_interleaved.plan" 4 20 4 1e-5 5e-3 --batch 4
  # Tied embeddings inside an FSDP unit are refused with the unit's line; left out of the root
  # unit (replicated over dp, summed over the first and last stage), they train like one device.
  expect_error "tied embedding in an FSDP unit" "llama_pp_fsdp.plan:13:1" \
    "tied word embeddings inside an FSDP unit are not supported" -- \
    mpi 4 "$BIN" parity --plan "$PLANS/llama_pp_fsdp.plan" $SMALL --steps 1 --accum 2 --config "$WORK/tied.json"
  sed 's/^fsdp     ()                  .\*/fsdp     ()  model\\.norm\\.weight/' "$PLANS/llama_pp_fsdp.plan" \
    > "$WORK/llama_pp_fsdp_tied.plan"
  parity "$WORK/llama_pp_fsdp_tied.plan" 4 5 4 1e-5 5e-3 --batch 4 --config "$WORK/tied.json"
  # A unit regex may match only one stage's modules; one matching no module of the model is an error.
  printf 'mesh pp=2 dp=*\nstages pp=even\nfsdp model\\.layers\\.3 .* dp=rows\nplace model <in>:0 dp=S(0)\nfactory model rope dp=R\n' \
    > "$WORK/one_stage.plan"
  parity "$WORK/one_stage.plan" 4 3 2 1e-5 5e-3 --batch 4
  sed 's/layers\\.3/layers\\.7/' "$WORK/one_stage.plan" > "$WORK/no_stage.plan"
  expect_error "an fsdp regex matching no module on any stage" "no_stage.plan:3:6" "matches no module path" -- \
    mpi 4 "$BIN" parity --plan "$WORK/no_stage.plan" $SMALL --steps 1 --accum 2

  # pp x tp with the vocabulary split over tp (Megatron's layout): the entries for lm_head and the
  # embedding name modules that one stage holds and the other only as a placeholder (refused as
  # "matches no parameter" on that stage until 2026-12-07); a misspelt parameter is still refused
  # on the stage that holds the module.
  printf 'mesh pp=2 tp=*\nstages pp=even\nplace model\\.embed_tokens weight tp=S(0)\nredistribute model\\.embed_tokens <out>:0 tp=P(sum) -> tp=R\nplace lm_head weight tp=S(0)\nplace model <in>:0 tp=R\nfactory model rope tp=R\n' \
    > "$WORK/pp_vocab_tp.plan"
  parity "$WORK/pp_vocab_tp.plan" 4 3 2 1e-5 5e-3 --batch 2
  sed 's/lm_head weight/lm_head wieght/' "$WORK/pp_vocab_tp.plan" > "$WORK/pp_vocab_typo.plan"
  expect_error "a misspelt parameter of a module on one stage" "pp_vocab_typo.plan:5:15" \
    "parameter regex 'wieght' matches no parameter of the modules matched by 'lm_head'" -- \
    mpi 4 "$BIN" parity --plan "$WORK/pp_vocab_typo.plan" $SMALL --steps 1 --accum 2

  # ---- checkpoints across stage counts ---------------------------------------------------------
  F="$SMALL --steps 4 --accum 2 --checkpoint-every 2"
  "$BIN" train $F --checkpoint-dir "$WORK/ref" > "$WORK/ref.txt" 2>&1 || fail "single-device train: $(tail -n 2 "$WORK/ref.txt")"
  want=$(grep -E '^step +[34]/4' "$WORK/ref.txt" | sed 's/.*| loss \([0-9.]*\) | grad norm \([0-9.]*\).*/\1 \2/')
  mpi 2 "$BIN" train --plan "$PLANS/llama_pp.plan" $F --stop-at 2 --checkpoint-dir "$WORK/pp2" > "$WORK/t.txt" 2>&1 \
    || fail "train under llama_pp np 2: $(tail -n 2 "$WORK/t.txt")"
  # Sharded: each stage wrote its own tensors (docs/pipeline.md, "Checkpoints"), nobody gathered.
  s2="$WORK/pp2/step-00000002"
  [ -f "$s2/index.json" ] && [ "$(ls "$s2" | grep -c '^shard-.*-of-00002.safetensors$')" = 2 ] && [ ! -e "$s2/model.safetensors" ] \
    && pass "a pp 2 save is a sharded checkpoint (index.json, one shard file per rank)" \
    || fail "a pp 2 save is not sharded: $(ls "$s2" | tr '\n' ' ')"
  "$BIN" checkpoint inspect "$WORK/pp2" 2>&1 | head -n 1 | grep -qF 'saved by world 2 on DeviceMesh([2], ["pp"])' \
    && pass "checkpoint inspect names the plan's mesh [pp=2]" \
    || fail "inspect of a pp checkpoint: $("$BIN" checkpoint inspect "$WORK/pp2" 2>&1 | head -n 1)"
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
  # A checkpoint holding tensors no stage has (its config.json says 2 layers, its index 4): each
  # stage reads only its own tensors, and the union of the stages' is checked (until 2026-12-07
  # the run trained layers 0-1 only and saved that smaller model as the next checkpoint).
  rm -rf "$WORK/ck" && cp -r "$WORK/pp2" "$WORK/ck"
  sed -i 's/"num_hidden_layers": 4/"num_hidden_layers": 2/' "$WORK/ck/step-00000002/config.json"
  if mpi 2 "$BIN" train --plan "$PLANS/llama_pp.plan" $F --checkpoint-dir "$WORK/ck" --resume > "$WORK/t.txt" 2>&1; then
    fail "a pp checkpoint with tensors of no stage resumed (exit 0)"
  elif grep -qF "the model tensors do not match this model: unexpected model.layers.2." "$WORK/t.txt" \
      && [ ! -e "$WORK/ck/step-00000004" ]; then
    pass "a pp checkpoint with tensors of no stage is refused, naming them, and nothing is written"
  else
    fail "a pp checkpoint with tensors of no stage: $(grep error "$WORK/t.txt" | tail -n 1)"
  fi
  resume "under gpipe pp 4" 4 --plan "$WORK/llama_pp_gpipe.plan"
  resume "under pp 2 x dp 2" 4 --plan "$PLANS/llama_pp_dp.plan"
  resume "under pp 2 x FSDP dp 2" 4 --plan "$PLANS/llama_pp_fsdp.plan"
  # A sharded checkpoint of another plan: each stage reads its own tensors' boxes.
  mpi 2 "$BIN" train --plan "$PLANS/llama_tp.plan" $F --stop-at 2 --checkpoint-dir "$WORK/tp" > "$WORK/t.txt" 2>&1 \
    || fail "train under llama_tp: $(tail -n 2 "$WORK/t.txt")"
  rm -rf "$WORK/pp2" && cp -r "$WORK/tp" "$WORK/pp2"
  resume "from a sharded llama_tp checkpoint under pp 2" 2 --plan "$PLANS/llama_pp.plan"
  # Saved under pp 2 x FSDP dp 2: each rank writes its stage's FSDP shards.
  mpi 4 "$BIN" train --plan "$PLANS/llama_pp_fsdp.plan" $F --stop-at 2 --checkpoint-dir "$WORK/ppf" > "$WORK/t.txt" 2>&1 \
    || fail "train under llama_pp_fsdp: $(tail -n 2 "$WORK/t.txt")"
  rm -rf "$WORK/pp2" && cp -r "$WORK/ppf" "$WORK/pp2"
  resume "from a sharded llama_pp_fsdp checkpoint without a plan" 1
  resume "from a sharded llama_pp_fsdp checkpoint under pp 2" 2 --plan "$PLANS/llama_pp.plan"

  # ---- parity --per-module: each module measured on the stage that holds it --------------------
  # Every decoder layer's output and input gradient compared (pipeline alone computes each stage as
  # one device does: within 1e-5), the containers that span both stages ('model', the root) not.
  if mpi 2 "$BIN" parity --plan "$PLANS/llama_pp.plan" $SMALL --steps 1 --accum 2 --per-module --json "$WORK/pm.json" \
      > "$WORK/t.txt" 2>&1; then
    r=$(python3 - "$WORK/pm.json" <<'PY'
import json, sys
pm = json.load(open(sys.argv[1]))["per_module"]
out = {m["module"]: m["output_rel"] for m in pm["modules"]}
grad = {m["module"]: m["input_grad_rel"] for m in pm["modules"]}
layers = [f"model.layers.{i}" for i in range(4)]
ok = (pm["first_difference"] is None and all(out[l] is not None and out[l] <= 1e-5 for l in layers + ["lm_head"])
      and all(grad[l] is not None and grad[l] <= 1e-5 for l in layers) and out["model"] is None and out["(model)"] is None)
print(f"{sum(v is not None for v in out.values())} of {len(out)} module outputs compared, worst "
      f"{max(v for v in out.values() if v is not None):.1e}, first difference {pm['first_difference']}")
sys.exit(0 if ok else 1)
PY
) && pass "llama_pp --per-module: $r" || fail "llama_pp --per-module: $r"
  else
    fail "llama_pp --per-module: $(grep -m 1 -E '^FAIL|error' "$WORK/t.txt")"
  fi

  # ---- bad input --------------------------------------------------------------------------------
  expect_error "1F1B with --accum below the stage count" "--accum 1" "fewer micro-batches than the 2 pipeline stages" \
    "schedule pp=gpipe" -- mpi 2 "$BIN" parity --plan "$PLANS/llama_pp.plan" $SMALL --steps 1 --accum 1
  expect_error "interleaved with --accum not a multiple of pp" "--accum 3 is not a multiple of the 2 pipeline stages" -- \
    mpi 2 "$BIN" parity --plan "$PLANS/llama_pp_interleaved.plan" $SMALL --steps 1 --accum 3
  # Agreed on at start-up (every rank exits with the error, no MPI_Abort; the Trainer found it,
  # with MPI_Abort, until 2026-12-07), by train too.
  expect_error "train: 1F1B with --accum below the stage count" "--accum 1" "fewer micro-batches" -- \
    mpi 2 "$BIN" train --plan "$PLANS/llama_pp.plan" $SMALL --steps 1 --accum 1 --metrics ""
  grep -q "MPI_ABORT" "$WORK/err" "$WORK/out" && fail "train --accum 1 under 1F1B: MPI_Abort" \
    || pass "train --accum 1 under 1F1B: agreed at start-up, no MPI_Abort"
  expect_error "pp 3 does not divide 4 layers" "llama_pp.plan:6:1" "split evenly over pp=3" -- \
    mpi 3 "$BIN" parity --plan "$PLANS/llama_pp.plan" $SMALL --steps 1 --accum 3
  printf 'mesh pp=2 dp=*\nstages pp=even\nplace model <in>:0 pp=S(0)\n' > "$WORK/bad.plan"
  expect_error "an entry naming the pipeline dim" "bad.plan:3:20" "names the pipeline dim 'pp'" -- \
    "$BIN" plan --plan "$WORK/bad.plan" --world 2
  printf 'mesh pp=2\nstage model\\.embed_tokens|model\\.layers\\.[0-2] pp=0\nstage model\\.layers\\.[23]|model\\.norm|lm_head pp=1\n' \
    > "$WORK/twice.plan"
  expect_error "a unit on two stages" "twice.plan:3:7" "assigns model.layers.2 to stage 1" -- \
    "$BIN" plan --plan "$WORK/twice.plan" --world 2

  # A plan whose stages cannot be resolved (lm_head on no stage): eval, grad and init agree on it
  # at start-up (exit 1 on every rank, no MPI_Abort; they aborted the job until 2026-12-07).
  printf 'mesh pp=2\nstage model\\.embed_tokens|model\\.layers\\.[01] pp=0\nstage model\\.layers\\.[23]|model\\.norm pp=1\n' \
    > "$WORK/nohead.plan"
  "$BIN" init --config llama-tiny --seed 3 --out "$WORK/nh_ck" >/dev/null || fail "init exit"
  printf '1,2,3,4,5\n6,7,8,9,10\n' > "$WORK/nh_tok.txt"
  for cmd in "eval --hf $WORK/nh_ck --tokens $WORK/nh_tok.txt" "grad --hf $WORK/nh_ck --tokens $WORK/nh_tok.txt --out $WORK/nh.st" \
      "init --config llama-tiny --out $WORK/nh_init"; do
    # shellcheck disable=SC2086
    expect_error "${cmd%% *} with lm_head on no stage" "lm_head is on no stage" "nohead.plan:2:1" -- \
      mpi 2 "$BIN" $cmd --plan "$WORK/nohead.plan"
    grep -q "MPI_ABORT" "$WORK/err" "$WORK/out" && fail "${cmd%% *} with lm_head on no stage: MPI_Abort" \
      || pass "${cmd%% *} with lm_head on no stage: agreed at start-up, no MPI_Abort"
  done

  # ---- eval, grad and init under pipeline plans ------------------------------------------------
  # One micro-batch through the stages: pipeline parallelism alone changes no arithmetic, so the
  # loss equals one device's and the gradient and init files equal its bytes (in the model's
  # tensor order), for 1F1B and interleaved plans and for tied embeddings (summed over the first
  # and last stage: a + b, in either order).
  "$BIN" init --config llama-tiny --seed 3 --out "$WORK/ev_ck" >/dev/null || fail "init exit"
  "$BIN" init --config "$WORK/tied.json" --seed 5 --out "$WORK/ev_tied" >/dev/null || fail "tied init exit"
  python3 -c 'import random, sys
random.seed(0)
open(sys.argv[1], "w").write("".join(",".join(str(random.randrange(256)) for _ in range(17)) + "\n" for _ in range(4)))' \
    "$WORK/ev_tok.txt"
  for ck in ev_ck ev_tied; do
    "$BIN" grad --hf "$WORK/$ck" --tokens "$WORK/ev_tok.txt" --out "$WORK/${ck}_g1.safetensors" > "$WORK/${ck}_g1.out" \
      || fail "$ck: single-device grad exit"
  done
  for spec in ev_ck:llama_pp ev_ck:llama_pp_interleaved ev_tied:llama_pp_interleaved; do
    ck=${spec%%:*}
    plan=${spec##*:}
    tag="$plan, $ck"
    want=$(tail -n 1 "$WORK/${ck}_g1.out")
    if [ "$spec" != ev_ck:llama_pp_interleaved ]; then
      got=$(mpi 2 "$BIN" eval --hf "$WORK/$ck" --tokens "$WORK/ev_tok.txt" --plan "$PLANS/$plan.plan" 2>"$WORK/err")
      [ "$got" = "$want" ] && pass "$tag: eval prints one device's loss once ($got)" \
        || fail "$tag: eval printed '$got', one device '$want': $(tail -n 2 "$WORK/err")"
    fi
    got=$(mpi 2 "$BIN" grad --hf "$WORK/$ck" --tokens "$WORK/ev_tok.txt" --plan "$PLANS/$plan.plan" \
      --out "$WORK/${ck}_$plan.safetensors" 2>"$WORK/err")
    [ "$got" = "$want" ] && cmp -s "$WORK/${ck}_g1.safetensors" "$WORK/${ck}_$plan.safetensors" \
      && pass "$tag: grad file byte-identical to one device's" \
      || fail "$tag: grad printed '$got' (one device '$want'), files differ: $(tail -n 2 "$WORK/err")"
  done
  # train --val-data under interleaved stages: the batches go through the stages as micro-batches,
  # forwards only; the val losses (and the training losses) equal one device's.
  python3 -c 'import random, struct, sys
random.seed(7)
t = [random.randrange(256) for _ in range(600)]
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, len(t), *([0] * 253)) + struct.pack(f"<{len(t)}H", *t))' \
    "$WORK/val.bin"
  V="train --batch 2 --seq 16 --steps 4 --accum 2 --warmup 1 --seed 5 --dropout 0.1 --val-data $WORK/val.bin --val-every 2"
  "$BIN" $V --metrics "$WORK/val1.jsonl" >/dev/null || fail "val one device"
  mpi 2 "$BIN" $V --plan "$PLANS/llama_pp_interleaved.plan" --metrics "$WORK/valp.jsonl" >/dev/null 2>"$WORK/err"
  python3 - "$WORK/val1.jsonl" "$WORK/valp.jsonl" <<'PY' && pass "train --val-data under llama_pp_interleaved: val and training losses equal one device's" || fail "val under pp: $(tail -n 2 "$WORK/err")"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert [(x["loss"], x.get("val_loss")) for x in a] == [(x["loss"], x.get("val_loss")) for x in b], (a, b)
assert sum("val_loss" in x for x in a) == 2
PY
  mpi 2 "$BIN" init --config "$WORK/tied.json" --seed 5 --out "$WORK/ev_tied_pp" --plan "$PLANS/llama_pp_interleaved.plan" \
    >/dev/null 2>"$WORK/err"
  cmp -s "$WORK/ev_tied/model.safetensors" "$WORK/ev_tied_pp/model.safetensors" \
    && pass "init under llama_pp_interleaved (tied): byte-identical to one device's" \
    || fail "init under llama_pp_interleaved differs: $(tail -n 2 "$WORK/err")"
  # MoE router losses over the stages (refused until 2026-12-08): each stage adds its layers' router
  # statistics to the sums the stage before sent, the last turns the totals into the losses, and
  # the sums' gradients travel back. Same sums in the same order as one device: the losses and
  # weights equal to rounding of the grad norm's cross-stage sum.
  printf 'mesh pp=2\nstages pp=even\n' > "$WORK/mx_pp.plan"
  MOE_LOSSES="--config mixtral-tiny --moe-aux-loss 0.02 --moe-z-loss 0.001"
  parity "$WORK/mx_pp.plan" 2 3 2 1e-12 1e-9 $MOE_LOSSES
  # A 4-layer mixtral-tiny for the cases below.
  "$BIN" init --config mixtral-tiny --out "$WORK/mx4" >/dev/null || fail "mixtral init exit"
  python3 -c 'import json, sys
c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = 4; json.dump(c, open(sys.argv[2], "w"))' \
    "$WORK/mx4/config.json" "$WORK/mx4.json"
  # A stage holding the embedding alone, with --recompute full: that stage has no layer to
  # recompute (an error with MPI_Abort until 2026-12-08), the other recomputes its four.
  printf 'mesh pp=2\nstage model\\.embed_tokens pp=0\nstage model\\.layers\\.[0-3]|model\\.norm|lm_head pp=1\n' \
    > "$WORK/embed_alone.plan"
  parity "$WORK/embed_alone.plan" 2 3 2 1e-12 1e-9 --recompute full --config "$WORK/mx4.json" --moe-aux-loss 0.02 \
    --moe-z-loss 0.001
  # The step line's memory is the largest rank's: here stage 1, which holds every layer (rank 0's,
  # the embedding's alone, was printed until 2026-12-08).
  "$BIN" train --batch 2 --seq 16 --steps 1 --metrics "$WORK/mem1.jsonl" >/dev/null 2>&1
  mpi 2 "$BIN" train --plan "$WORK/embed_alone.plan" --batch 2 --seq 16 --steps 1 --accum 2 --metrics "$WORK/mem2.jsonl" \
    >/dev/null 2>&1
  python3 - "$WORK/mem1.jsonl" "$WORK/mem2.jsonl" <<'PY' && pass "pp with an embedding-only stage: mem is the layers' stage's" \
    || fail "pp mem: $(cat "$WORK/mem1.jsonl" "$WORK/mem2.jsonl" | head -c 400)"
import json, sys
one, pp = (json.loads(open(p).readline())["mem_peak_mib"] for p in sys.argv[1:3])
assert pp > 0.5 * one, (one, pp)
PY
  # A last stage of norm and lm_head alone, under GPipe: it holds no MoE layer, and makes the losses
  # from the sums it receives.
  printf 'mesh pp=2\nstage model\\.embed_tokens|model\\.layers\\.[0-3] pp=0\nstage model\\.norm|lm_head pp=1\nschedule pp=gpipe\n' \
    > "$WORK/head_alone.plan"
  parity "$WORK/head_alone.plan" 2 3 2 1e-12 1e-9 --config "$WORK/mx4.json" --moe-aux-loss 0.02 --moe-z-loss 0.001
  # Interleaved (4 layers, 2 chunks per stage): the sums go stage 0, 1, 0, 1 and back.
  printf 'mesh pp=2\nstages pp=even\nschedule pp=interleaved(2)\n' > "$WORK/mx_pp_il.plan"
  parity "$WORK/mx_pp_il.plan" 2 3 2 1e-12 1e-9 --config "$WORK/mx4.json" --moe-aux-loss 0.02 --moe-z-loss 0.001
  # A gradient reference (grad: cross-entropy alone, dropless) of a checkpoint whose config turns
  # the router losses and a capacity on: they are off for the comparison, with a note (a false FAIL
  # until 2026-12-08); asked for by flag they are refused, as --dropout is.
  "$BIN" init --config mixtral-tiny --seed 6 --out "$WORK/mx_rl" >/dev/null || fail "mixtral init exit"
  python3 -c 'import json, sys
c = json.load(open(sys.argv[1])); c.update(output_router_logits=True, router_aux_loss_coef=0.02,
    mt_router_z_loss_coef=0.001, mt_moe_capacity_factor=1.0); json.dump(c, open(sys.argv[1], "w"))' "$WORK/mx_rl/config.json"
  "$BIN" grad --hf "$WORK/mx_rl" --tokens "$WORK/ev_tok.txt" --out "$WORK/mx_rl_g.safetensors" >/dev/null \
    || fail "grad of the router-loss checkpoint"
  printf 'mesh pp=2\nstages pp=even\nschedule pp=gpipe\n' > "$WORK/mx_pp_gpipe.plan"  # one micro-batch, as grad
  mpi 2 "$BIN" parity --plan "$WORK/mx_pp_gpipe.plan" --hf "$WORK/mx_rl" --tokens "$WORK/ev_tok.txt" --steps 1 \
    --reference "$WORK/mx_rl_g.safetensors" >"$WORK/out" 2>"$WORK/err" \
    && grep -q "router losses and capacity factor are off against the gradient reference" "$WORK/err" \
    && pass "parity --reference GRAD of a checkpoint with router losses: off, with a note, PASS" \
    || fail "parity --reference with router losses in the config: $(tail -n 2 "$WORK/out" "$WORK/err")"
  mpi 2 "$BIN" parity --plan "$WORK/mx_pp_gpipe.plan" --hf "$WORK/mx_rl" --tokens "$WORK/ev_tok.txt" --steps 1 \
    --reference "$WORK/mx_rl_g.safetensors" --moe-aux-loss 0.02 >"$WORK/out" 2>"$WORK/err"; rc=$?
  [ $rc -eq 2 ] && grep -q "moe-aux-loss 0.02 with a gradient reference" "$WORK/err" \
    && pass "parity --reference GRAD --moe-aux-loss 0.02: exit 2, refused" || fail "--moe-aux-loss with a gradient reference: exit $rc"
else
  # eval/grad under pp x tp, pp x dp x tp and pp x FSDP: TP and dp sums round differently from
  # one device (as without stages): gradients within 1e-5 of the largest magnitude.
  "$BIN" init --config llama-tiny --seed 3 --out "$WORK/ev_ck" >/dev/null || fail "init exit"
  python3 -c 'import random, sys
random.seed(0)
open(sys.argv[1], "w").write("".join(",".join(str(random.randrange(256)) for _ in range(17)) + "\n" for _ in range(4)))' \
    "$WORK/ev_tok.txt"
  "$BIN" grad --hf "$WORK/ev_ck" --tokens "$WORK/ev_tok.txt" --out "$WORK/g1.safetensors" > "$WORK/g1.out" || fail "grad exit"
  for spec in llama_pp_tp:4 llama_pp_dp_tp:8 llama_pp_fsdp:4; do
    plan=${spec%%:*}
    np=${spec##*:}
    got=$(mpi "$np" "$BIN" grad --hf "$WORK/ev_ck" --tokens "$WORK/ev_tok.txt" --plan "$PLANS/$plan.plan" \
      --out "$WORK/g_$plan.safetensors" 2>"$WORK/err")
    r=$(python3 "$(dirname "$0")/compare_outputs.py" grads "$WORK/g1.safetensors" "$WORK/g_$plan.safetensors" 1e-5 2>&1) \
      && [ "$got" = "$(tail -n 1 "$WORK/g1.out")" ] && pass "$plan np $np: grad ($got): $r" \
      || fail "$plan np $np: grad printed '$got': $r $(tail -n 2 "$WORK/err")"
  done
  # Mixtral through two stages (no router losses in eval/grad): one device's bytes.
  "$BIN" init --config mixtral-tiny --seed 4 --out "$WORK/ev_mx" >/dev/null || fail "mixtral init exit"
  "$BIN" grad --hf "$WORK/ev_mx" --tokens "$WORK/ev_tok.txt" --out "$WORK/gm1.safetensors" >/dev/null || fail "grad exit"
  printf 'mesh pp=2\nstages pp=even\n' > "$WORK/mx_pp.plan"
  mpi 2 "$BIN" grad --hf "$WORK/ev_mx" --tokens "$WORK/ev_tok.txt" --plan "$WORK/mx_pp.plan" --out "$WORK/gm2.safetensors" \
    >/dev/null 2>"$WORK/err"
  cmp -s "$WORK/gm1.safetensors" "$WORK/gm2.safetensors" && pass "mixtral-tiny pp 2: grad file byte-identical to one device's" \
    || fail "mixtral-tiny pp 2 grad differs: $(tail -n 2 "$WORK/err")"
  # train's routing figures count every layer of every stage (rank 0's stage alone until
  # 2026-12-07): the fewest and most rows per expert and the rows the capacity dropped as on one device.
  MX="train --config mixtral-tiny --batch 4 --accum 2 --seq 16 --steps 2 --warmup 1 --moe-capacity-factor 1 --metrics="
  "$BIN" $MX 2>&1 | grep -o "expert rows .*" > "$WORK/mx1.txt"
  mpi 2 "$BIN" $MX --plan "$WORK/mx_pp.plan" 2>"$WORK/err" | grep -o "expert rows .*" > "$WORK/mx2.txt"
  [ -s "$WORK/mx1.txt" ] && cmp -s "$WORK/mx1.txt" "$WORK/mx2.txt" \
    && pass "mixtral-tiny pp 2: train's expert rows and dropped rows equal one device's ($(tail -n 1 "$WORK/mx1.txt"))" \
    || fail "mixtral-tiny pp 2 expert rows: '$(tr '\n' ' ' < "$WORK/mx2.txt")' against '$(tr '\n' ' ' < "$WORK/mx1.txt")' $(tail -n 2 "$WORK/err")"
  parity "$PLANS/llama_pp.plan" 4 20 4 1e-5 1e-5
  parity "$WORK/llama_pp_gpipe.plan" 4 5 2 1e-5 1e-5
  # TP partial sums round differently (as llama_tp): drift-tol after AdamW.
  parity "$PLANS/llama_pp_tp.plan" 4 5 2 1e-5 5e-2
  # pp x Megatron sequence parallelism (llama_tp_sp's entries in 2 stages): the hidden state
  # crosses the stages as its S(1) sequence shard; the model-input placement (tp=R, for the ids)
  # is not applied to it on the second stage (it was until 2026-12-07: the first step failed).
  { printf 'mesh pp=2 tp=*\nstages pp=even\n'; grep -v '^mesh' "$PLANS/llama_tp_sp.plan"; } > "$WORK/pp_tp_sp.plan"
  parity "$WORK/pp_tp_sp.plan" 4 3 2 1e-5 5e-2
  # ... and interleaved, where the first stage's second chunk takes a hidden state too.
  sed 's/^stages pp=even$/stages pp=even\nschedule pp=interleaved(2)/' "$WORK/pp_tp_sp.plan" > "$WORK/pp_tp_sp_il.plan"
  parity "$WORK/pp_tp_sp_il.plan" 4 3 2 1e-5 5e-2
  parity "$PLANS/llama_pp_dp_tp.plan" 8 3 2 1e-5 5e-2 --batch 4
  # FSDP units over dp x TP within each stage (pp 2 x tp 2 x dp 2).
  parity "$PLANS/llama_pp_fsdp_tp.plan" 8 3 2 1e-5 5e-2 --batch 4
  # ZeRO-3 within each stage (parameters stored S(0) over dp, gathered for compute).
  printf 'mesh pp=2 dp=*\nstages pp=even\nplace model <in>:0 dp=S(0)\nfactory model rope dp=R\ninit .* .* dp=S(0)\nrun .* .* dp=R\n' \
    > "$WORK/llama_pp_zero3.plan"
  parity "$WORK/llama_pp_zero3.plan" 4 3 2 1e-5 5e-2 --batch 4
  # Context parallelism within each stage (pp 2 x cp 2): the ZS(1) hidden state crosses stages.
  parity "$PLANS/llama_pp_cp.plan" 4 20 4 1e-5 5e-2
  sed 's/pp=1f1b/pp=gpipe/' "$PLANS/llama_pp_cp.plan" > "$WORK/llama_pp_cp_gpipe.plan"
  parity "$WORK/llama_pp_cp_gpipe.plan" 4 5 2 1e-5 5e-2
  # pp x ep with router losses: the router sums are Partial over ep on each stage and cross the
  # stages as such; made whole once, after the last layer (as one device under mixtral_ep).
  { printf 'mesh pp=2 ep=*\nstages pp=even\n'; grep -v '^mesh' "$PLANS/mixtral_ep.plan"; } > "$WORK/mx_pp_ep.plan"
  parity "$WORK/mx_pp_ep.plan" 4 3 2 1e-5 5e-2 --config mixtral-tiny --moe-aux-loss 0.02 --moe-z-loss 0.001
  # ... in bf16 with f32 gradient accumulation: a rank's empty expert shards keep bf16 gradients
  # while the owner's are f32, which parity's gather of the stages refused until 2026-12-08.
  # (bf16 rounds ep's all-to-all sums differently: the tolerances of bf16 parity, docs/cli.md.)
  parity "$WORK/mx_pp_ep.plan" 4 2 2 5e-2 0.3 --config mixtral-tiny --moe-aux-loss 0.02 --moe-z-loss 0.001 \
    --precision bf16 --tol 5e-2 --drift-tol 0.3
  # --per-module --tol 0 under pp 2 x tp 2 names the first module that differs: a tensor-parallel
  # projection of the first layer, found by the ranks of stage 0.
  mpi 4 "$BIN" parity --plan "$PLANS/llama_pp_tp.plan" $SMALL --steps 1 --accum 2 --per-module --tol 0 > "$WORK/t.txt" 2>&1
  grep -qE '^first module to differ: model\.layers\.0\.self_attn\.(q|k|v|o)_proj ' "$WORK/t.txt" \
    && pass "llama_pp_tp --per-module --tol 0: $(grep '^first module to differ' "$WORK/t.txt")" \
    || fail "llama_pp_tp --per-module --tol 0: $(grep -m 1 -E '^first module|^no module|error' "$WORK/t.txt")"
fi

echo "$fails failure(s)"
[ $fails -eq 0 ]
