#!/usr/bin/env bash
# `meshtrain plan`: IR lines and local shapes for stock plans, uneven shards, and errors with
# file:line:column. Usage: test_plan_cli.sh MESHTRAIN PLANS_DIR
set -euo pipefail
bin=$1
plans=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
has() { grep -qxF -- "$2" "$1" || fail "missing line in $1: $2"; }

"$bin" plan --config llama-tiny --plan "$plans/llama_tp.plan" --world 2 > "$tmp/tp.txt"
has "$tmp/tp.txt" "# plan $plans/llama_tp.plan for llama-tiny on a world of 2: mesh [tp=2]"
has "$tmp/tp.txt" "model.layers.0.self_attn.o_proj.forward:<out>:0:redist(P(sum)->R@tp)"
has "$tmp/tp.txt" "model.layers.0.self_attn.q_proj.weight [128, 128] init S(0)@tp: [64, 128] on all 2 ranks"
has "$tmp/tp.txt" "model.layers.3.mlp.down_proj.weight [128, 344] init S(1)@tp: [128, 172] on all 2 ranks"
has "$tmp/tp.txt" "lm_head.weight [256, 128] init R: [256, 128] on all 2 ranks"

# Uneven shards: 344 MLP rows over 3 ranks (an MLP-only tensor-parallel plan: the MLP has no
# views, so its uneven shards run).
cat > "$tmp/mlp_tp.plan" <<'PLAN'
mesh tp=*
place  model\.layers\.\d+\.mlp\.(gate|up)_proj  weight  tp=S(0)
place  model\.layers\.\d+\.mlp\.down_proj       weight  tp=S(1)
redistribute  model\.layers\.\d+\.mlp\.down_proj  <out>:0  tp=P(sum) -> tp=R
PLAN
"$bin" plan --plan "$tmp/mlp_tp.plan" --world 3 > "$tmp/tp3.txt"
has "$tmp/tp3.txt" "model.layers.0.mlp.up_proj.weight [344, 128] init S(0)@tp: [115, 128] on (0), (1); [114, 128] on (2)"
# llama_tp over 3 ranks splits attention heads unevenly (128 q rows: 43, 43, 42): the forward
# check on meta tensors finds it (parallelize's shard-unit check: a rank must hold whole heads) and
# names the parameter and the plan line.
if "$bin" plan --plan "$plans/llama_tp.plan" --world 3 2> "$tmp/err3.txt"; then fail "llama_tp at world 3 accepted"; fi
grep -qF "parameter model.layers.0.self_attn.q_proj.weight" "$tmp/err3.txt" || fail "no module: $(cat "$tmp/err3.txt")"
grep -qF "llama_tp.plan:8:1" "$tmp/err3.txt" || fail "no plan line: $(cat "$tmp/err3.txt")"

# ZeRO-3 at world 4: storage sharded, compute gathered.
"$bin" plan --plan "$plans/llama_zero3.plan" --world 4 > "$tmp/z3.txt"
has "$tmp/z3.txt" "model.norm.forward_pre:weight:redist(S(0)->R@dp)"
has "$tmp/z3.txt" "model.norm.weight [128] init S(0)@dp: [32] on all 4 ranks"
has "$tmp/z3.txt" "model.norm.weight [128] run R: [128] on all 4 ranks"

# FSDP: the planner's layout per unit, and the RaggedShard storage it gives each parameter.
"$bin" plan --plan "$plans/llama_fsdp.plan" --world 2 --fsdp-layout > "$tmp/fsdp.txt"
has "$tmp/fsdp.txt" "# FSDP layouts: 5 units"
grep -qF "llama_fsdp.plan:9:1): 9 tensors over 2 ranks: shard 90752 elements (lower bound 90752), buffer 181504, payload 181504, padding 0 (0.00%)" "$tmp/fsdp.txt" \
  || fail "no layout of model.layers.0: $(grep 'unit model.layers.0' "$tmp/fsdp.txt")"
has "$tmp/fsdp.txt" "  model.layers.0.mlp.gate_proj.weight [344, 128] block 1 rows: offset 49152, ranks 0..1 hold [325,19] blocks"
"$bin" plan --plan "$plans/llama_fsdp.plan" --world 2 > "$tmp/fsdp_ir.txt"
has "$tmp/fsdp_ir.txt" "model.layers.0.mlp.gate_proj.weight [344, 128] init RS(0,[325,19],b1)@dp: [325, 128] on (0); [19, 128] on (1)"
has "$tmp/fsdp_ir.txt" "model.layers.0.mlp.gate_proj.forward_pre:weight:redist(RS(0,[325,19],b1)->R@dp)"
if "$bin" plan --plan "$plans/llama_tp.plan" --world 2 --fsdp-layout 2> "$tmp/nofsdp.txt"; then fail "--fsdp-layout without fsdp entries accepted"; fi
grep -qF "has no fsdp entries" "$tmp/nofsdp.txt" || fail "--fsdp-layout error: $(cat "$tmp/nofsdp.txt")"

# 2-D mesh with coordinates (dp,tp), and expert ownership.
"$bin" plan --plan "$plans/llama_dp_tp.plan" --world 4 > "$tmp/dptp.txt"
has "$tmp/dptp.txt" "# local parameter shapes per mesh coordinate (dp,tp)"
"$bin" plan --config mixtral-tiny --plan "$plans/mixtral_ep_tp.plan" --world 4 > "$tmp/ep.txt"
has "$tmp/ep.txt" "model.layers.1.block_sparse_moe.experts.3.w1.weight [256, 128] init RS(0,[0,1],b256)@ep: [0, 128] on (0,0), (0,1); [256, 128] on (1,0), (1,1)"
has "$tmp/ep.txt" "model.layers.1.block_sparse_moe.experts.3.w2.weight [128, 256] init RS(0,[0,1],b128)@ep: [0, 256] on (0,0), (0,1); [128, 256] on (1,0), (1,1)"
has "$tmp/ep.txt" "model.layers.1.block_sparse_moe.forward_pre:experts:dispatch(all_to_all@ep)"

# Errors: one line, file:line:column, exit code 1.
printf 'mesh tp=*\nplace model\\.layers\\.\\d+\\.self_atn weight tp=S(0)\n' > "$tmp/bad.plan"
if "$bin" plan --plan "$tmp/bad.plan" --world 2 2> "$tmp/err.txt"; then fail "bad plan accepted"; fi
grep -qF "$tmp/bad.plan:2:7: module regex" "$tmp/err.txt" || fail "no location: $(cat "$tmp/err.txt")"
grep -qF "nearest module paths: model.layers.0.self_attn" "$tmp/err.txt" || fail "no nearby paths: $(cat "$tmp/err.txt")"
if "$bin" plan --plan "$plans/llama_dp_tp.plan" --world 3 2> "$tmp/err2.txt"; then fail "world 3 accepted"; fi
grep -qF "llama_dp_tp.plan:" "$tmp/err2.txt" && grep -qF "does not fit a world of 3" "$tmp/err2.txt" || fail "$(cat "$tmp/err2.txt")"
echo "plan cli: ok"
