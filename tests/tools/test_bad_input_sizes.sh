#!/usr/bin/env bash
# Bad-input suite for issue 10, items 1, 2 and 6: sizes from config files and flags that overflow
# or are absurd, values that make no sense (eps <= 0, rope_theta 0, --min-lr above --lr, ...),
# non-finite weights and losses, and outputs that cannot be written (a full disk). Every case must
# fail promptly with a message naming the file/field/flag, and write nothing (tests/tools/
# bad_input_lib.sh).
# usage: test_bad_input_sizes.sh MESHTRAIN_BINARY
BIN=$(realpath "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/bad_input_lib.sh"
cd "$WORK" || exit 1
mkdir -p outs run
OUTS=$WORK/outs  # every failing command that could write aims at this (watched, stays empty)

# ---- fixtures -----------------------------------------------------------------------------------
# cfg NAME JSON_OVERRIDES: llama-tiny's config.json with some fields replaced (null drops a field).
cfg() {
  python3 - "$WORK/$1.json" "$2" <<'PY'
import json, sys
c = {"model_type": "llama", "vocab_size": 256, "hidden_size": 128, "intermediate_size": 344,
     "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
     "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0}
over = json.loads(sys.argv[2])
if over.get("model_type") == "mixtral":
    c.update({"num_local_experts": 4, "num_experts_per_tok": 2})
c.update(over)
c = {k: v for k, v in c.items() if v is not None}
# json.dumps writes 1e39 as 1e+39 and huge ints exactly, as a hostile file would hold them.
open(sys.argv[1], "w").write(json.dumps(c))
PY
  echo "$WORK/$1.json"
}
"$BIN" init --config llama-tiny --seed 3 --out "$WORK/ck" >/dev/null || { echo "FAIL - fixture: init"; exit 1; }
python3 - "$WORK/tokens.txt" "$WORK/long.txt" <<'PY'
import random, sys
random.seed(0)
with open(sys.argv[1], "w") as f:
    for _ in range(2):
        f.write(",".join(str(random.randrange(256)) for _ in range(17)) + "\n")
with open(sys.argv[2], "w") as f:  # T = 1100 > llama-tiny's max_position_embeddings 1024
    f.write(",".join(str(random.randrange(256)) for _ in range(1101)) + "\n")
PY

# ck_with NAME PYTHON: a copy of the checkpoint, then PYTHON run with `d` = its directory and
# helpers to edit its config (cfg_set) and one weight element (poke, CRC-32 kept valid).
ck_with() {
  rm -rf "$WORK/$1"
  cp -r "$WORK/ck" "$WORK/$1"
  python3 - "$WORK/$1" "$2" <<'PY'
import json, struct, sys, zlib
d = sys.argv[1]
def cfg_set(**kw):
    p = f"{d}/config.json"; c = json.load(open(p)); c.update(kw); json.dump(c, open(p, "w"))
def retype(name, dtype):  # same width: the header stays the same size, the bytes stay put
    p = f"{d}/model.safetensors"; b = bytearray(open(p, "rb").read())
    n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    h[name]["dtype"] = dtype
    hj = json.dumps(h, separators=(",", ":")).encode()
    assert len(hj) <= n
    b[8:8 + n] = hj + b" " * (n - len(hj))
    open(p, "wb").write(bytes(b))
def poke(name, index, value):
    p = f"{d}/model.safetensors"; b = bytearray(open(p, "rb").read())
    n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    off = 8 + n + h[name]["data_offsets"][0] + 4 * index
    b[off:off + 4] = struct.pack("<f", value)
    h["__metadata__"]["mt.crc32"] = "%08x" % zlib.crc32(bytes(b[8 + n:]))  # same length: header size kept
    hj = json.dumps(h, separators=(",", ":")).encode()
    assert len(hj) <= n
    hj += b" " * (n - len(hj))
    b[8:8 + n] = hj
    open(p, "wb").write(bytes(b))
exec(sys.argv[2])
PY
  echo "$WORK/$1"
}

# st_with NAME HEADER_JSON DATA_BYTES: a checkpoint whose model.safetensors is written by hand.
st_with() {
  mkdir -p "$WORK/$1"
  cp "$WORK/ck/config.json" "$WORK/$1/"
  python3 - "$WORK/$1/model.safetensors" "$2" "$3" <<'PY'
import struct, sys
h = sys.argv[2].encode(); h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + bytes(int(sys.argv[3])))
PY
  echo "$WORK/$1"
}

# A llm.c shard: magic, version, count as given, then BODY_TOKENS uint16 tokens.
bin_shard() {
  python3 - "$WORK/$1" "$2" "$3" "$4" "$5" <<'PY'
import struct, sys
p, magic, version, count, body = sys.argv[1], *map(int, sys.argv[2:])
hdr = [magic, version, count] + [0] * 253
open(p, "wb").write(struct.pack("<256i", *hdr) + struct.pack(f"<{body}H", *([1] * body)))
PY
  echo "$WORK/$1"
}

TWO62=4611686018427387904
init_bad() {  # init_bad NAME OVERRIDES PATTERN...: init --config with a bad config.json
  local name=$1 over=$2; shift 2
  local c
  c=$(cfg "$name" "$over")
  bad_case "config: $name" --watch "$OUTS" --timeout 20 "$c" "$@" -- "$BIN" init --config "$c" --out "$OUTS/ck"
}
train_bad() {  # train_bad NAME PATTERN... -- FLAGS...: train fails at start-up, nothing written
  local name=$1; shift
  local pats=()
  while [ "$1" != "--" ]; do pats+=("$1"); shift; done
  shift
  bad_case "train: $name" --watch "$WORK/run" --watch "$OUTS" --timeout 30 "${pats[@]}" -- \
    "$BIN" train --steps 2 --batch 2 --seq 16 --metrics "$WORK/run/m.jsonl" --checkpoint-dir "$OUTS/cd" "$@"
}

# ---- 1. overflowing sizes in config.json ---------------------------------------------------------
init_bad hidden_2e62 "{\"hidden_size\": $TWO62}" "hidden_size = $TWO62 is too large" "at most 1048576"
init_bad vocab_2e62 "{\"vocab_size\": $TWO62}" "vocab_size = $TWO62 is too large"
init_bad intermediate_2e62 "{\"intermediate_size\": $TWO62}" "intermediate_size = $TWO62 is too large"
init_bad heads_2e62 "{\"num_attention_heads\": $TWO62}" "num_attention_heads = $TWO62 is too large"
init_bad kv_heads_2e40 "{\"num_key_value_heads\": 1099511627776}" "num_key_value_heads = 1099511627776 is too large"
init_bad head_dim_2e62 "{\"head_dim\": $TWO62}" "head_dim = $TWO62 is too large"
init_bad layers_1e9 '{"num_hidden_layers": 1e9}' "num_hidden_layers = 1000000000 is too large" "at most 4096"
init_bad max_pos_2e62 "{\"max_position_embeddings\": $TWO62}" "max_position_embeddings = $TWO62 is too large"
init_bad vocab_2e64 '{"vocab_size": 18446744073709551615}' "field 'vocab_size' = 18446744073709551615 is too large"
init_bad vocab_1e30 '{"vocab_size": 1e30}' "field 'vocab_size' = 1e+30 is too large"
init_bad vocab_negative '{"vocab_size": -5}' "vocab_size = -5 must be at least 1"
init_bad params_over_2e40 '{"vocab_size": 16000000, "hidden_size": 1000000}' "parameters, more than the 1099511627776 (2^40)"
init_bad experts_1e6 '{"model_type": "mixtral", "num_local_experts": 1000000}' "num_local_experts = 1000000 is too large"
# Within every bound but far beyond this machine: refused before allocating (5.5e11 parameters).
init_bad beyond_memory '{"hidden_size": 32768, "intermediate_size": 131072, "num_hidden_layers": 32,
  "num_attention_heads": 64, "num_key_value_heads": 64}' "meshtrain init" "beyond_memory.json" "need at least" "of memory"

# ---- 2. nonsense values in config.json ------------------------------------------------------------
init_bad eps_negative '{"rms_norm_eps": -1e-5}' "rms_norm_eps = -1e-05 must be positive and finite"
init_bad eps_zero '{"rms_norm_eps": 0}' "rms_norm_eps = 0 must be positive"
init_bad rope_theta_zero '{"rope_theta": 0}' "rope_theta = 0 must be positive"
init_bad rope_theta_negative '{"rope_theta": -10000}' "rope_theta = -10000 must be positive"
init_bad rope_theta_beyond_f32 '{"rope_theta": 1e39}' "rope_theta = 1e+39 must be positive and finite in float32"
init_bad max_pos_zero '{"max_position_embeddings": 0}' "max_position_embeddings = 0 must be at least 1"
init_bad attention_dropout_1_5 '{"attention_dropout": 1.5}' "attention_dropout = 1.5 is a dropout probability"
init_bad residual_dropout_negative '{"mt_residual_dropout": -0.1}' "mt_residual_dropout = -0.1"
init_bad llama3_low_freq_zero '{"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 0,
  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}' "rope_scaling.low_freq_factor = 0 must be positive"
init_bad router_coef_negative '{"model_type": "mixtral", "router_aux_loss_coef": -1}' "router_aux_loss_coef = -1 must be >= 0"
init_bad bos_negative '{"bos_token_id": -7}' "bos_token_id = -7"
init_bad heads_not_dividing '{"num_attention_heads": 3, "num_key_value_heads": 3}' "hidden_size (128) is not divisible by num_attention_heads (3)"

# ---- 6. errors that name no field: initializer_range ---------------------------------------------
init_bad initializer_range_negative '{"initializer_range": -0.02}' "initializer_range = -0.02 must be >= 0"

# A bad config inside a checkpoint fails eval before any nonsense loss is printed.
c=$(ck_with eps_ck 'cfg_set(rms_norm_eps=-1e-6)')
bad_case "eval: checkpoint config rms_norm_eps < 0" "$c/config.json" "rms_norm_eps" -- \
  "$BIN" eval --hf "$c" --tokens "$WORK/tokens.txt"
c=$(ck_with theta_ck 'cfg_set(rope_theta=0)')
bad_case "eval: checkpoint config rope_theta 0" "$c/config.json" "rope_theta = 0" -- \
  "$BIN" eval --hf "$c" --tokens "$WORK/tokens.txt"
bad_case "eval: T beyond max_position_embeddings" "long.txt" "T = 1100" "max_position_embeddings = 1024" -- \
  "$BIN" eval --hf "$WORK/ck" --tokens "$WORK/long.txt"

# Integer bits are no weights: an I32 q_proj used to load as numbers (grad norm 429 instead of 7).
c=$(ck_with i32_ck 'retype("model.layers.0.self_attn.q_proj.weight", "I32")')
bad_case "eval: an integer tensor for a floating weight" "model.layers.0.self_attn.q_proj.weight' (in model.safetensors) is i32 in the checkpoint but f32" -- \
  "$BIN" eval --hf "$c" --tokens "$WORK/tokens.txt"

# ---- 1 and 6. tensor shapes in safetensors that overflow or are absurd ---------------------------
c=$(st_with st_2e62 '{"model.norm.weight":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}}' 0)
bad_case "safetensors: [2^62, 4] wraps to 0 elements" "model.safetensors" "model.norm.weight" "is too large" "overflows" -- \
  "$BIN" eval --hf "$c" --tokens "$WORK/tokens.txt"
c=$(st_with st_2e40 '{"model.norm.weight":{"dtype":"F32","shape":[1099511627776,3],"data_offsets":[0,12]}}' 12)
bad_case "safetensors: [2^40, 3] names bytes and elements" "model.norm.weight" \
  "shape [1099511627776, 3] of F32 needs 13194139533312 bytes" "3298534883328 elements" -- \
  "$BIN" eval --hf "$c" --tokens "$WORK/tokens.txt"
c=$(st_with st_2e64 '{"model.norm.weight":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,0]}}' 0)
bad_case "safetensors: a dim beyond uint64" "model.safetensors" "model.norm.weight" -- \
  "$BIN" eval --hf "$c" --tokens "$WORK/tokens.txt"

# ---- llm.c token shards with bounded header fields -----------------------------------------------
s=$(bin_shard huge_count.bin 20240520 1 2147483647 100)
train_bad "token shard count 2^31-1 with 100 tokens" "huge_count.bin" "header says 2147483647 tokens" -- --data "$s"
s=$(bin_shard negative_count.bin 20240520 1 -5 100)
train_bad "token shard negative count" "negative_count.bin" "negative token count -5" -- --data "$s"
s=$(bin_shard short.bin 20240520 1 10 10)
train_bad "token shard shorter than one batch" "--data $WORK/short.bin" "the corpus has 10 tokens" -- --data "$s"
s=$(bin_shard bad_magic.bin 7 1 100 100)
train_bad "token shard bad magic" "bad_magic.bin" "bad magic 7" -- --data "$s"

# ---- 1 and 2. flags -------------------------------------------------------------------------------
train_bad "--batch 2^62" "--batch $TWO62 is out of range" "16777216" -- --batch $TWO62
train_bad "--batch beyond int64" "--batch 99999999999999999999 is out of range" -- --batch 99999999999999999999
train_bad "--batch garbage" "--batch expects an integer, got '12abc'" -- --batch 12abc
train_bad "--batch negative" "--batch -3 is out of range" -- --batch -3
train_bad "--seq 0" "--seq 0 is out of range" -- --seq 0
train_bad "--seq beyond max_position_embeddings" "--seq 2048 is longer than max_position_embeddings = 1024" -- --seq 2048
train_bad "--accum 0" "--accum 0 is out of range" -- --accum 0
train_bad "--steps 0" "--steps 0 is out of range" -- --steps 0
train_bad "--steps 2^62" "--steps $TWO62 is out of range" -- --steps $TWO62
train_bad "--min-lr above --lr" "--min-lr 0.1 is above --lr 0.01" -- --lr 0.01 --min-lr 0.1
train_bad "--min-lr negative" "--min-lr -1e-4 is out of range" -- --min-lr -1e-4
train_bad "--lr 0" "--lr 0 must be positive" -- --lr 0
train_bad "--lr negative" "--lr -0.001 must be positive" -- --lr -0.001
train_bad "--lr nan" "--lr must be a finite number, got 'nan'" -- --lr nan
train_bad "--lr inf" "--lr must be a finite number, got 'inf'" -- --lr inf
train_bad "--lr 1e999" "--lr 1e999 is out of the range of a double" -- --lr 1e999
train_bad "--grad-clip -1" "--grad-clip -1 is out of range" -- --grad-clip -1
train_bad "--warmup -1" "--warmup -1 is out of range" -- --warmup -1
train_bad "--beta2 1" "--beta2 1 is out of range" "[0, 1)" -- --beta2 1
train_bad "--beta2 negative" "--beta2 -0.5 is out of range" -- --beta2 -0.5
train_bad "--weight-decay negative" "--weight-decay -0.1 is out of range" -- --weight-decay -0.1
train_bad "--dropout 1" "--dropout 1 is out of range" -- --dropout 1
train_bad "--seed -1" "--seed -1 is out of range" -- --seed -1
train_bad "--checkpoint-every -1" "--checkpoint-every -1 is out of range" -- --checkpoint-every -1
train_bad "--log-every 0" "--log-every 0 is out of range" -- --log-every 0
train_bad "--stop-at -1" "--stop-at -1 is out of range" -- --stop-at -1
train_bad "--bucket-mb 1e300" "--bucket-mb 1e300 is out of range" -- --bucket-mb 1e300
train_bad "batch x seq beyond the corpus" "--data (the embedded corpus)" "corpus has" "fewer than one global window" \
  -- --batch 16777216 --seq 1024
bad_case "plan: --world 2^62 (used to plan for ever)" --timeout 20 "--world $TWO62 is out of range" -- \
  "$BIN" plan --plan "$HERE/../../plans/llama_dp.plan" --world $TWO62
bad_case "init: --seed -1" --watch "$OUTS" "--seed -1 is out of range" -- "$BIN" init --config llama-tiny --seed -1 --out "$OUTS/ck"
# An initializer_range that overflows the output dtype (normal draws of std 3e4 pass f16's 65504):
# the file held +-inf and init exited 0 until 2026-12-07.
c=$(cfg big_init '{"initializer_range": 3e4}')
bad_case "init: weights that overflow --dtype f16" --watch "$OUTS" "meshtrain init: weight '" "would hold inf in f16" \
  "initializer_range 30000" "nothing written" -- "$BIN" init --config "$c" --dtype f16 --out "$OUTS/ck"
[ ! -e "$OUTS/ck" ] || fail "init wrote $OUTS/ck"
"$BIN" init --config "$c" --dtype f32 --out "$WORK/big_f32" >/dev/null 2>&1 \
  && pass "  the same config in f32 (no overflow) writes its file" || fail "init --dtype f32 of initializer_range 3e4"

# ---- 2. non-finite weights: eval/grad fail naming the tensor, train stops and saves nothing -------
c=$(ck_with nan_ck 'poke("model.layers.1.mlp.up_proj.weight", 5, float("nan"))')
bad_case "eval: nan weight" "meshtrain eval" "$c" "is nan" "tensor 'model.layers.1.mlp.up_proj.weight' holds nan at element 5" -- \
  "$BIN" eval --hf "$c" --tokens "$WORK/tokens.txt"
c=$(ck_with inf_ck 'poke("model.norm.weight", 0, float("inf"))')
bad_case "grad: inf weight, no gradient file" --watch "$OUTS" "meshtrain grad" "$c" "tensor 'model.norm.weight' holds inf" -- \
  "$BIN" grad --hf "$WORK/inf_ck" --tokens "$WORK/tokens.txt" --out "$OUTS/g.safetensors"
# Finite weights whose logits overflow f32: the loss is inf; the message says the weights are finite.
c=$(ck_with huge_ck 'for k in range(128): poke("lm_head.weight", 128 * 5 + k, -1e37)')
bad_case "eval: finite weights, forward overflow" "meshtrain eval" "is inf" "every weight is finite" -- \
  "$BIN" eval --hf "$c" --tokens "$WORK/tokens.txt"
train_bad "nan weights from --hf: refused before step 1, naming the tensor, saves nothing" "$WORK/nan_ck" \
  "weight 'model.layers.1.mlp.up_proj.weight' holds nan at element 5" "refusing to train from non-finite weights" \
  -- --hf "$WORK/nan_ck" --checkpoint-every 1 --metrics "$WORK/nan.jsonl"
train_bad "--lr 1e38: weights overflow in the step; the final save refuses them" "refusing to save step 1" \
  "holds" "after the optimizer step" -- --steps 1 --lr 1e38 --min-lr 0 --warmup 0 --metrics "$WORK/lr1.jsonl"
train_bad "--lr 1e38 with periodic saves: the first save refuses, nothing saved" "refusing to save step 1" -- \
  --steps 3 --lr 1e38 --min-lr 0 --warmup 0 --checkpoint-every 1 --metrics "$WORK/lr2.jsonl"
# A final norm gain of 1e21: the loss (~1e21) and the f64 gradient norm stay finite, but gradient
# elements beyond sqrt(FLT_MAX) made f32 second moments inf; 8-bit AdamW's inf block absmax then
# decoded its zero codes to nan, and the step-1 checkpoint already held the inf state (a reviewer,
# 2026-12-07). Unclipped, the run now stops before the optimizer step; clipped, it trains.
c=$(ck_with big_gain_ck 'for k in range(64): poke("model.norm.weight", k, 1e21)')
train_bad "gradient elements beyond sqrt(FLT_MAX), unclipped: stopped before the step, nothing saved" \
  "step 1: the gradient norm" "where a gradient element's square overflows the optimizer's f32 moments" -- \
  --hf "$c" --grad-clip 0 --optimizer adamw8bit --checkpoint-every 1 --metrics "$WORK/big.jsonl"
"$BIN" train --hf "$c" --steps 2 --batch 2 --seq 16 --optimizer adamw8bit --metrics "" >/dev/null 2>"$WORK/err" \
  && pass "the same weights train with --grad-clip (the default 1)" || fail "clipped big gains: $(tail -n 1 "$WORK/err")"

# ---- 6. a full disk -------------------------------------------------------------------------------
bad_case "train: metrics to /dev/full" --watch "$OUTS" "cannot write metrics file '/dev/full' at step 1" -- \
  "$BIN" train --steps 2 --batch 2 --seq 16 --metrics /dev/full
bad_case "train: step lines to a full stdout" --watch "$OUTS" "meshtrain train: cannot write the result to stdout" -- \
  bash -c '"$0" train --steps 1 --batch 2 --seq 16 --metrics "" >/dev/full' "$BIN"
bad_case "eval: result to a full stdout" "meshtrain eval: cannot write the result to stdout" -- \
  bash -c '"$0" eval --hf "$1" --tokens "$2" >/dev/full' "$BIN" "$WORK/ck" "$WORK/tokens.txt"

bad_input_done
