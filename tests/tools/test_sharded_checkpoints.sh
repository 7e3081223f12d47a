#!/usr/bin/env bash
# Sharded checkpoints of `meshtrain train --plan` (docs/checkpoints.md, "Sharded checkpoints"), with
# real mpirun processes on llama-tiny:
#   - layout: index.json + one shard file per rank; every tensor's chunks tile it; replicated
#     tensors are written once, spread over the ranks;
#   - same plan (llama_tp and llama_zero3 at np 2): 3 steps + save + resume 2 steps == 5 steps bit for
#     bit (every shard file, the index and the metrics losses), with asynchronous saves every step,
#     and with --sync-save;
#   - across plans: saved under llama_tp at np 2, resumed without a plan and under llama_dp: losses
#     within 1e-5 relative of the uninterrupted single-device run;
#   - --keep 2 leaves the newest two step directories;
#   - `meshtrain checkpoint inspect` and `meshtrain export` (export == the gathered save, byte for byte).
# mode `slow` adds, bit for bit, llama_dp_tp at np 4, bf16 under llama_dp_tp, mixtral-tiny under
# mixtral_ep_tp (RaggedShard experts), and a cross-plan resume under llama_dp at np 4.
# usage: test_sharded_checkpoints.sh MESHTRAIN_BINARY MPIRUN PLANS_DIR [fast|slow]
set -u
BIN=$1
MPIRUN=$2
PLANS=$3
MODE=${4:-fast}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1
export MT_COLLECTIVE_TIMEOUT_S=${MT_COLLECTIVE_TIMEOUT_S:-60}
CMP="$(dirname "$0")/compare_outputs.py"
fails=0
pass() { echo "ok   - $1"; }
fail() { echo "FAIL - $1"; fails=$((fails + 1)); }
mpi() { local np=$1; shift; timeout 120 "$MPIRUN" -np "$np" --oversubscribe --mca btl self,vader "$@"; }
T="train --batch 4 --seq 16 --steps 5 --warmup 2 --lr 3e-3 --seed 5"
# The same step-5 shard files and losses: bit for bit.
same_ckpt() {
  local a=$1 b=$2 f
  [ "$(ls "$a" | grep -c '^shard-')" -gt 0 ] || return 1
  for f in "$a"/shard-*.safetensors; do cmp -s "$f" "$b/$(basename "$f")" || return 1; done
  cmp -s "$a/index.json" "$b/index.json"
}
same_losses() { python3 "$CMP" losses "$1" "$2" 0 >/dev/null; }

# ---- same plan, bit for bit (asynchronous saves every step; then --sync-save) ------------------------
same_plan() {  # PLAN NP [EXTRA TRAIN FLAGS...]
  local plan=$1 np=$2 tag=$1_np$2
  shift 2
  local extra=("$@")
  [ ${#extra[@]} -gt 0 ] && tag=$tag$(echo "${extra[*]}" | tr -c 'a-z0-9' '_')
  mpi "$np" "$BIN" $T "${extra[@]}" --plan "$PLANS/$plan.plan" --metrics "$WORK/$tag.full.jsonl" --checkpoint-dir "$WORK/$tag.full" \
    >"$WORK/$tag.out" 2>"$WORK/err" || { fail "$tag: full run exit: $(tail -n 2 "$WORK/err")"; return; }
  mpi "$np" "$BIN" $T "${extra[@]}" --plan "$PLANS/$plan.plan" --metrics "$WORK/$tag.part.jsonl" --checkpoint-dir "$WORK/$tag.part" \
    --stop-at 3 --checkpoint-every 1 >/dev/null 2>"$WORK/err" || { fail "$tag: part run exit: $(tail -n 2 "$WORK/err")"; return; }
  mpi "$np" "$BIN" $T "${extra[@]}" --plan "$PLANS/$plan.plan" --metrics "$WORK/$tag.part.jsonl" --checkpoint-dir "$WORK/$tag.part" \
    --resume --checkpoint-every 1 >/dev/null 2>"$WORK/err" || { fail "$tag: resume exit: $(tail -n 2 "$WORK/err")"; return; }
  same_ckpt "$WORK/$tag.full/step-00000005" "$WORK/$tag.part/step-00000005" && same_losses "$WORK/$tag.full.jsonl" "$WORK/$tag.part.jsonl" \
    && pass "$plan np $np ${extra[*]}: 3 steps + async saves + resume + 2 steps == 5 steps (shards, index, losses bit for bit)" \
    || fail "$plan np $np ${extra[*]}: resume differs"
}
same_plan llama_tp 2
same_plan llama_zero3 2

# The layout of llama_tp's checkpoint.
python3 - "$WORK/llama_tp_np2.full/step-00000005" <<'PY' && pass "layout: index.json tiles every tensor; replicated tensors once, on both ranks" || fail "layout"
import json, os, sys
d = sys.argv[1]
ix = json.load(open(os.path.join(d, "index.json")))
assert ix["world_size"] == 2 and ix["format"] == "meshtrain-sharded-1", ix["world_size"]
files = sorted(f for f in os.listdir(d) if f.startswith("shard-"))
assert files == ["shard-00000-of-00002.safetensors", "shard-00001-of-00002.safetensors"], files
writers = set()
for t in ix["tensors"]:
    n = 1
    for s in t["shape"]: n *= s
    cov = sum(__import__("math").prod(c["sizes"]) for c in t["chunks"])
    assert cov == n, (t["name"], cov, n)
    if "S(" not in t["placements"]:
        assert len(t["chunks"]) == 1, (t["name"], t["chunks"])
        writers.add(t["chunks"][0]["file"])
    else:
        assert len(t["chunks"]) == 2, (t["name"], len(t["chunks"]))
assert writers == set(files), writers  # replicated tensors spread over both ranks
st = json.load(open(os.path.join(d, "trainer_state.json")))
assert st["world_size"] == 2 and st["plan"].endswith("llama_tp.plan"), st
PY

# --sync-save writes the same files.
mpi 2 "$BIN" $T --plan "$PLANS/llama_tp.plan" --metrics "" --checkpoint-dir "$WORK/sync" --sync-save >"$WORK/sync.out" 2>"$WORK/err" \
  && same_ckpt "$WORK/llama_tp_np2.full/step-00000005" "$WORK/sync/step-00000005" \
  && pass "--sync-save: the same shard files as the asynchronous save" || fail "--sync-save: $(tail -n 2 "$WORK/err")"

# ---- across plans: within 1e-5 relative of the single-device run ---------------------------------------
"$BIN" $T --metrics "$WORK/single.jsonl" >/dev/null 2>&1 || fail "single-device run exit"
mpi 2 "$BIN" $T --plan "$PLANS/llama_tp.plan" --metrics "$WORK/x.jsonl" --checkpoint-dir "$WORK/x" --stop-at 3 >/dev/null 2>&1 \
  || fail "cross: save under llama_tp exit"
cp "$WORK/x.jsonl" "$WORK/xn.jsonl"; cp -a "$WORK/x" "$WORK/xn"
"$BIN" $T --metrics "$WORK/xn.jsonl" --checkpoint-dir "$WORK/xn" --resume >/dev/null 2>"$WORK/err" \
  || fail "cross: resume without a plan exit: $(tail -n 2 "$WORK/err")"
r=$(python3 "$CMP" losses "$WORK/single.jsonl" "$WORK/xn.jsonl" 1e-5 rel 2>&1) \
  && pass "saved under llama_tp np 2, resumed without a plan: $r" || fail "cross (no plan): $r"
[ -f "$WORK/xn/step-00000005/model.safetensors" ] && pass "the single-process save after it writes the HF layout" \
  || fail "no model.safetensors in the single-process save"
cp "$WORK/x.jsonl" "$WORK/xd.jsonl"; cp -a "$WORK/x" "$WORK/xd"
mpi 2 "$BIN" $T --plan "$PLANS/llama_dp.plan" --metrics "$WORK/xd.jsonl" --checkpoint-dir "$WORK/xd" --resume >/dev/null 2>"$WORK/err" \
  || fail "cross: resume under llama_dp exit: $(tail -n 2 "$WORK/err")"
r=$(python3 "$CMP" losses "$WORK/single.jsonl" "$WORK/xd.jsonl" 1e-5 rel 2>&1) \
  && pass "saved under llama_tp np 2, resumed under llama_dp np 2: $r" || fail "cross (llama_dp): $r"

# ---- a run started with --hf resumes with --resume added (the flag is then not read) --------------------
# The --hf input is bf16; the step directories hold f32 masters, and their config.json says so (it
# kept the input's "bfloat16" until 2026-12-07).
"$BIN" init --config llama-tiny --seed 3 --dtype bf16 --out "$WORK/hf0" >/dev/null 2>&1
mpi 2 "$BIN" $T --plan "$PLANS/llama_tp.plan" --metrics "" --hf "$WORK/hf0" --stop-at 3 --checkpoint-dir "$WORK/hfres" \
  >/dev/null 2>"$WORK/err" || fail "--hf run: $(tail -n 2 "$WORK/err")"
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); sys.exit(0 if c['torch_dtype'] == 'float32' else 1)" \
  "$WORK/hfres/step-00000003/config.json" && pass "a sharded step from a bf16 --hf says torch_dtype float32 (its f32 masters)" \
  || fail "a sharded step's config.json: $(grep torch_dtype "$WORK/hfres/step-00000003/config.json")"
mpi 2 "$BIN" $T --plan "$PLANS/llama_tp.plan" --metrics "" --hf "$WORK/hf0" --resume --checkpoint-dir "$WORK/hfres" \
  >"$WORK/out" 2>"$WORK/err" && grep -q "not read on --resume" "$WORK/out" && grep -q "resumed from $WORK/hfres/step-00000003" "$WORK/out" \
  && pass "--hf run resumed with --resume added under llama_tp (sharded)" \
  || fail "--hf + --resume under a plan (it loaded an empty checkpoint before 2026-11-28): $(tail -n 1 "$WORK/err")"

# ---- --keep ---------------------------------------------------------------------------------------------
mpi 2 "$BIN" $T --plan "$PLANS/llama_tp.plan" --metrics "" --checkpoint-dir "$WORK/keep" --checkpoint-every 1 --keep 2 \
  >/dev/null 2>"$WORK/err" || fail "--keep run exit: $(tail -n 2 "$WORK/err")"
got=$(ls "$WORK/keep" | tr '\n' ' ')
[ "$got" = "latest step-00000004 step-00000005 " ] && [ "$(cat "$WORK/keep/latest")" = step-00000005 ] \
  && pass "--keep 2: $got" || fail "--keep 2 left: $got"

"$BIN" $T --metrics "" --checkpoint-dir "$WORK/keep1" --checkpoint-every 1 --keep 1 >/dev/null 2>"$WORK/err" \
  || fail "--keep run without a plan exit: $(tail -n 1 "$WORK/err")"
got=$(ls "$WORK/keep1" | tr '\n' ' ')
[ "$got" = "latest step-00000005 " ] && pass "--keep 1 without a plan: $got" || fail "--keep 1 without a plan left: $got"

# ---- tools ----------------------------------------------------------------------------------------------
if "$BIN" checkpoint inspect "$WORK/llama_tp_np2.full" >"$WORK/inspect.out" 2>"$WORK/err"; then
  grep -q "model.layers.0.self_attn.q_proj.weight" "$WORK/inspect.out" && grep -q "S(0)" "$WORK/inspect.out" \
    && grep -q "world 2" "$WORK/inspect.out" && pass "checkpoint inspect" || fail "inspect output: $(head -n 3 "$WORK/inspect.out")"
else
  fail "checkpoint inspect exit: $(tail -n 1 "$WORK/err")"
fi
if "$BIN" export --checkpoint "$WORK/x" --hf "$WORK/exp" >/dev/null 2>"$WORK/err"; then
  # The same llama_tp run saved the former way (--gather-save: full tensors on rank 0): the same bits.
  mpi 2 "$BIN" $T --plan "$PLANS/llama_tp.plan" --metrics "" --checkpoint-dir "$WORK/g3" --stop-at 3 --gather-save >/dev/null 2>&1 \
    || fail "--gather-save run exit"
  cmp -s "$WORK/g3/step-00000003/model.safetensors" "$WORK/exp/model.safetensors" && [ -f "$WORK/exp/config.json" ] \
    && pass "export --hf: model.safetensors byte-identical to the gathered save of the same run" || fail "export differs from the gathered save"
  # Shards of at most 0.1 MiB: an HF index; eval gives the loss of the single-file export.
  printf '1,2,3,4,5,6,7,8,9\n9,8,7,6,5,4,3,2,1\n' >"$WORK/tok.txt"
  "$BIN" export --checkpoint "$WORK/x" --hf "$WORK/exp2" --max-shard-mb 0.1 >/dev/null 2>"$WORK/err" \
    && [ -f "$WORK/exp2/model.safetensors.index.json" ] && [ "$(ls "$WORK/exp2" | grep -c '^model-.*-of-.*safetensors$')" -gt 1 ] \
    && [ "$("$BIN" eval --hf "$WORK/exp2" --tokens "$WORK/tok.txt" 2>&1)" = "$("$BIN" eval --hf "$WORK/exp" --tokens "$WORK/tok.txt" 2>&1)" ] \
    && pass "export --max-shard-mb 0.1: $(ls "$WORK/exp2" | grep -c '^model-') HF shards + index, the same eval loss" \
    || fail "export shards: $(tail -n 1 "$WORK/err")"
  # A tiny --max-shard-mb is one byte, not "no limit": one tensor per shard. A temporary left by
  # an export that was killed (its process gone) is removed by the next export to that name.
  # (--hf OUT/ names OUT: its temporary is OUT.tmp.PID beside it, not inside.)
  mkdir -p "$WORK/exp3.tmp.999999999" && touch "$WORK/exp3.tmp.999999999/model.safetensors.tmp.999999999"
  "$BIN" export --checkpoint "$WORK/x" --hf "$WORK/exp3/" --max-shard-mb 1e-9 >/dev/null 2>"$WORK/err" \
    && [ "$(ls "$WORK/exp3" | grep -c '^model-.*-of-.*safetensors$')" = \
         "$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["weight_map"]))' "$WORK/exp3/model.safetensors.index.json")" ] \
    && [ ! -e "$WORK/exp3.tmp.999999999" ] \
    && pass "export --max-shard-mb 1e-9: one tensor per shard; a dead export's temporary removed" \
    || fail "export tiny shards: $(ls "$WORK" | grep exp3) $(tail -n 1 "$WORK/err")"
  # eval and generate read a sharded step directory directly: the same results as its export.
  step=$(cat "$WORK/x/latest")
  [ "$("$BIN" eval --hf "$WORK/x/$step" --tokens "$WORK/tok.txt" 2>&1)" = "$("$BIN" eval --hf "$WORK/exp" --tokens "$WORK/tok.txt" 2>&1)" ] \
    && [ "$("$BIN" generate --hf "$WORK/x/$step" --prompt-ids 1,2,3 --max-new-tokens 8 --temperature 0 2>/dev/null)" = \
         "$("$BIN" generate --hf "$WORK/exp" --prompt-ids 1,2,3 --max-new-tokens 8 --temperature 0 2>/dev/null)" ] \
    && pass "eval and generate --hf on a sharded step directory: the export's loss and tokens" \
    || fail "eval/generate on a sharded step directory: $("$BIN" eval --hf "$WORK/x/$step" --tokens "$WORK/tok.txt" 2>&1 | tail -n 1)"
else
  fail "export exit: $(tail -n 1 "$WORK/err")"
fi

if [ "$MODE" = slow ]; then
  same_plan llama_dp_tp 4
  same_plan llama_dp_tp 2 --precision bf16
  same_plan mixtral_ep_tp 2 --config mixtral-tiny  # RaggedShard expert placements
  same_plan llama_fsdp 2  # the FSDP layout planner's RaggedShards (docs/fsdp.md)
  # Saved under llama_fsdp at np 2, resumed under llama_fsdp at np 4 (another layout) and llama_tp.
  mpi 2 "$BIN" $T --plan "$PLANS/llama_fsdp.plan" --metrics "$WORK/f.jsonl" --checkpoint-dir "$WORK/f" --stop-at 3 \
    >/dev/null 2>&1 || fail "cross: save under llama_fsdp exit"
  for spec in llama_fsdp:4 llama_tp:2; do
    IFS=: read -r plan np <<<"$spec"
    cp "$WORK/f.jsonl" "$WORK/f_$plan.jsonl"; rm -rf "$WORK/f_$plan"; cp -a "$WORK/f" "$WORK/f_$plan"
    mpi "$np" "$BIN" $T --plan "$PLANS/$plan.plan" --metrics "$WORK/f_$plan.jsonl" --checkpoint-dir "$WORK/f_$plan" --resume \
      >/dev/null 2>"$WORK/err" || fail "cross: resume under $plan np $np exit: $(tail -n 2 "$WORK/err")"
    r=$(python3 "$CMP" losses "$WORK/single.jsonl" "$WORK/f_$plan.jsonl" 1e-5 rel 2>&1) \
      && pass "saved under llama_fsdp np 2, resumed under $plan np $np: $r" || fail "cross (llama_fsdp -> $plan np $np): $r"
  done
  cp "$WORK/x.jsonl" "$WORK/x4.jsonl"; cp -a "$WORK/x" "$WORK/x4"
  mpi 4 "$BIN" $T --plan "$PLANS/llama_dp.plan" --metrics "$WORK/x4.jsonl" --checkpoint-dir "$WORK/x4" --resume >/dev/null 2>"$WORK/err" \
    || fail "cross: resume under llama_dp np 4 exit: $(tail -n 2 "$WORK/err")"
  r=$(python3 "$CMP" losses "$WORK/single.jsonl" "$WORK/x4.jsonl" 1e-5 rel 2>&1) \
    && pass "saved under llama_tp np 2, resumed under llama_dp np 4: $r" || fail "cross (llama_dp np 4): $r"
fi
[ $fails -eq 0 ] && echo "all passed" || echo "$fails failed"
exit $((fails > 0))
