#!/usr/bin/env bash
# `meshtrain generate` end to end (docs/generate.md): a model trained to memorize one sentence
# continues its prompt with that sentence (greedy, with and without the KV cache, f32 and bf16);
# a checkpoint written by `init` and `--config --init-seed` give the same tokens; sampling is
# fixed by its seed; a tokenizer.json next to the checkpoint turns ids into text; bad flags are one
# error line naming the flag.
# `train --sample-every` prints samples without changing the run's losses.
# usage: test_generate_cli.sh MESHTRAIN_BINARY PLANS_DIR
set -u
BIN=$1
PLANS=$2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=2
fails=0
pass() { echo "ok   - $1"; }
fail() { echo "FAIL - $1"; fails=$((fails + 1)); }
field() { python3 -c 'import json,sys; v=json.loads(sys.argv[1])[sys.argv[2]]; print(v if isinstance(v, str) else json.dumps(v))' "$1" "$2"; }
expect_error() {  # NAME PATTERN -- COMMAND...: exit != 0 and the last stderr line contains PATTERN
  local name=$1 pat=$2; shift 3
  "$@" >"$WORK/out" 2>"$WORK/err"
  local rc=$? last
  last=$(tail -n 1 "$WORK/err")
  if [ $rc -eq 0 ]; then fail "$name: exit code 0"; return; fi
  grep -qF -- "$pat" <<<"$last" && pass "$name" || fail "$name: '$pat' not in: $last"
}

# ---- a memorized sentence ----------------------------------------------------------------------------
python3 - "$WORK/rep.bin" <<'PY'
import struct, sys
text = b"the quick brown fox jumps over the lazy dog. " * 400
header = [20240520, 1, len(text)] + [0] * 253
open(sys.argv[1], "wb").write(struct.pack("<256i", *header) + struct.pack(f"<{len(text)}H", *text))
PY
"$BIN" train --data "$WORK/rep.bin" --batch 4 --seq 64 --steps 60 --warmup 5 --checkpoint-dir "$WORK/ck" \
  --metrics "" --log-every 60 >"$WORK/train.out" 2>&1 || fail "train: $(tail -n 1 "$WORK/train.out")"
CK="$WORK/ck/step-00000060"
WANT="brown fox jumps over the lazy dog. the quick brown fox"
for mode in "" "--no-cache" "--precision bf16"; do
  out=$("$BIN" generate --hf "$CK" --prompt "the quick " --max-new-tokens 54 --temperature 0 $mode 2>"$WORK/err")
  text=$(field "$(tail -n 1 <<<"$out")" text)
  [ "$text" = "$WANT" ] && [ "$(head -n 1 <<<"$out")" = "$WANT" ] \
    && pass "greedy ${mode:-with the KV cache} continues the memorized sentence" \
    || fail "greedy ${mode:-with the KV cache}: '$text' (stderr: $(tail -n 1 "$WORK/err"))"
done
t_cache=$("$BIN" generate --hf "$CK" --prompt "the" --max-new-tokens 40 --temperature 0 2>/dev/null | tail -n 1)
t_full=$("$BIN" generate --hf "$CK" --prompt "the" --max-new-tokens 40 --temperature 0 --no-cache 2>/dev/null | tail -n 1)
[ "$t_cache" = "$t_full" ] && pass "the KV cache and the whole-prefix recompute choose the same tokens" \
  || fail "cache vs no cache: $t_cache vs $t_full"

# ---- train --sample-every: samples while training, the same losses ------------------------------------
# The memorized model trains on with dropout, twice: the run that samples has the losses of the run
# that does not, bit for bit, and its greedy samples still continue the sentence.
T2="train --hf $CK --data $WORK/rep.bin --batch 4 --seq 64 --steps 12 --warmup 2 --dropout 0.1 --log-every 12"
"$BIN" $T2 --metrics "$WORK/plain.jsonl" >/dev/null 2>&1 || fail "train with dropout"
"$BIN" $T2 --metrics "$WORK/sampled.jsonl" --sample-every 4 --sample-tokens 30 --sample-prompt "the quick " \
  --sample-temperature 0 >"$WORK/sampled.out" 2>&1 || fail "train --sample-every: $(tail -n 1 "$WORK/sampled.out")"
python3 - "$WORK/plain.jsonl" "$WORK/sampled.jsonl" <<'PY' && pass "train --sample-every 4 (dropout 0.1): the losses of a run without samples, bit for bit; a sample at steps 4, 8, 12" || fail "train --sample-every changed the run or missed samples"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 12 and all(x["loss"] == y["loss"] for x, y in zip(a, b))
assert [r["step"] for r in b if "sample" in r] == [4, 8, 12]
assert all(len(r["sample_tokens"]) == 30 for r in b if "sample" in r)
PY
grep -A1 "step    12/12 | sample (30 tokens):" "$WORK/sampled.out" | tail -n 1 | grep -qx "brown fox jumps over the lazy " \
  && pass "the step-12 sample (greedy) continues the memorized sentence" || fail "step-12 sample: $(tail -n 3 "$WORK/sampled.out")"
# Sampled (temperature 1) samples draw from the run's seed + step: a resumed run's seed is its
# checkpoint's, so it samples what the uninterrupted run sampled (until 2026-12-07 it drew from
# --seed's default instead).
T3="train --data $WORK/rep.bin --batch 2 --seq 16 --steps 4 --warmup 1 --seed 5 --sample-every 1 --sample-tokens 6"
"$BIN" $T3 --metrics "$WORK/s_full.jsonl" >/dev/null 2>&1 || fail "train --seed 5 --sample-every 1"
"$BIN" $T3 --stop-at 2 --metrics "$WORK/s_part.jsonl" --checkpoint-dir "$WORK/s_ck" >/dev/null 2>&1 || fail "train --stop-at 2"
"$BIN" ${T3/--seed 5 /} --metrics "$WORK/s_part.jsonl" --checkpoint-dir "$WORK/s_ck" --resume >/dev/null 2>&1 \
  || fail "train --resume (no --seed)"
python3 - "$WORK/s_full.jsonl" "$WORK/s_part.jsonl" <<'PY' && pass "a resumed run (no --seed) samples what the uninterrupted --seed 5 run sampled" || fail "resumed samples differ"
import json, sys
a = [json.loads(l)["sample_tokens"] for l in open(sys.argv[1])]
b = [json.loads(l)["sample_tokens"] for l in open(sys.argv[2])]
assert len(a) == len(b) == 4 and a == b, (a, b)
PY
expect_error "--sample-every under --plan" "--sample-every runs on one device, not under --plan" -- \
  "$BIN" train --plan "$PLANS/llama_dp.plan" --steps 2 --sample-every 1 --metrics ""

# ---- sampling: fixed by the seed ---------------------------------------------------------------------
"$BIN" init --config llama-tiny --seed 4 --out "$WORK/init" >/dev/null || fail "init"
S1=$("$BIN" generate --hf "$WORK/init" --prompt "Once" --max-new-tokens 48 --seed 9 2>/dev/null | tail -n 1)
S2=$("$BIN" generate --hf "$WORK/init" --prompt "Once" --max-new-tokens 48 --seed 9 2>/dev/null | tail -n 1)
S3=$("$BIN" generate --hf "$WORK/init" --prompt "Once" --max-new-tokens 48 --seed 10 2>/dev/null | tail -n 1)
[ -n "$S1" ] && [ "$S1" = "$S2" ] && pass "sampling with one seed gives the same tokens twice" || fail "seed 9 twice: $S1 vs $S2"
[ "$S1" != "$S3" ] && pass "another seed gives other tokens" || fail "seeds 9 and 10 agree: $S1"
C=$("$BIN" generate --config llama-tiny --init-seed 4 --prompt "Once" --max-new-tokens 48 --seed 9 2>/dev/null | tail -n 1)
[ "$C" = "$S1" ] && pass "--config --init-seed 4 is init --seed 4's model" || fail "--config vs init: $C vs $S1"
N=$(field "$("$BIN" generate --hf "$WORK/init" --prompt-ids 1,2,3 --max-new-tokens 7 --top-k 5 --top-p 0.9 --temperature 0.7 2>/dev/null | tail -n 1)" tokens)
python3 -c 'import json,sys; t=json.loads(sys.argv[1]); sys.exit(0 if len(t)==7 and all(0<=x<256 for x in t) else 1)' "$N" \
  && pass "--prompt-ids with top-k, top-p and temperature: 7 tokens" || fail "top-k/top-p run: $N"

# ---- a tokenizer.json: ids to text for a vocabulary other than bytes ---------------------------------
python3 - "$WORK/small.json" "$WORK/tok" <<'PY'
import json, os, sys
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 8, "hidden_size": 16,
       "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
       "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
       "bos_token_id": 0, "eos_token_id": 7}
json.dump(cfg, open(sys.argv[1], "w"))
vocab = {"a": 1, "\u0120b": 2, "c": 3, "\u010a": 4, "d": 5, "e": 6}
tok = {"added_tokens": [{"id": 0, "content": "<s>", "special": True}, {"id": 7, "content": "</s>", "special": True}],
       "decoder": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": vocab, "merges": []}}
os.makedirs(sys.argv[2], exist_ok=True)
json.dump(tok, open(os.path.join(sys.argv[2], "tokenizer.json"), "w"))
PY
"$BIN" init --config "$WORK/small.json" --seed 1 --out "$WORK/small" >/dev/null || fail "init small"
ids_only=$("$BIN" generate --hf "$WORK/small" --prompt-ids 0,1 --max-new-tokens 12 --temperature 0 --eos none 2>"$WORK/err")
[ "$(wc -l <<<"$ids_only")" = 1 ] && [ "$(field "$ids_only" tokens | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')" = 12 ] \
  && grep -q "no tokenizer: token ids only" "$WORK/err" && pass "without tokenizer.json: the token ids only" \
  || fail "ids only: $ids_only / $(cat "$WORK/err")"
cp "$WORK/tok/tokenizer.json" "$WORK/small/"
with_text=$("$BIN" generate --hf "$WORK/small" --prompt-ids 0,1 --max-new-tokens 12 --temperature 0 --eos none 2>/dev/null)
python3 - "$(tail -n 1 <<<"$with_text")" <<'PY' && pass "with tokenizer.json: the text of the generated ids" || fail "tokenizer.json text: $with_text"
import json, sys
j = json.loads(sys.argv[1])
piece = {1: "a", 2: " b", 3: "c", 4: "\n", 5: "d", 6: "e", 0: "", 7: ""}
sys.exit(0 if j["text"] == "".join(piece[t] for t in j["tokens"]) and len(j["tokens"]) == 12 else 1)
PY
# --eos: the run above without a stop ends at the first occurrence of its third token when that
# token is the eos, given as a flag or (auto) as the config's eos_token_id.
FREE=$(field "$(tail -n 1 <<<"$with_text")" tokens)
STOP=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])[2])' "$FREE")
WANT_N=$(python3 -c 'import json,sys; t=json.loads(sys.argv[1]); print(t.index(t[2]) + 1)' "$FREE")
E1=$(field "$("$BIN" generate --hf "$WORK/small" --prompt-ids 0,1 --max-new-tokens 12 --temperature 0 --eos "$STOP" 2>/dev/null | tail -n 1)" tokens)
python3 - "$WORK/small/config.json" "$STOP" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["eos_token_id"] = int(sys.argv[2]); json.dump(c, open(sys.argv[1], "w"))
PY
E2=$(field "$("$BIN" generate --hf "$WORK/small" --prompt-ids 0,1 --max-new-tokens 12 --temperature 0 2>/dev/null | tail -n 1)" tokens)
n1=$(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])))' "$E1")
n2=$(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])))' "$E2")
[ "$n1" = "$WANT_N" ] && [ "$E1" = "$E2" ] \
  && pass "--eos $STOP and --eos auto (config eos_token_id $STOP) stop after $WANT_N tokens" \
  || fail "eos: --eos gave $E1, auto gave $E2, want $WANT_N tokens of $FREE"
# A model vocabulary padded past the tokenizer's (ids 3..7 undefined here): those ids are left out
# of the text, as the tokenizers library does, with a notice that counts them.
python3 - "$WORK/small/tokenizer.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
t["model"]["vocab"] = {k: v for k, v in t["model"]["vocab"].items() if v < 3}
t["added_tokens"] = [a for a in t["added_tokens"] if a["id"] < 3]
json.dump(t, open(sys.argv[1], "w"))
PY
padded=$("$BIN" generate --hf "$WORK/small" --prompt-ids 0,1 --max-new-tokens 12 --temperature 0 --eos none 2>"$WORK/err")
python3 - "$(tail -n 1 <<<"$padded")" "$(cat "$WORK/err")" <<'PY' && pass "ids tokenizer.json does not define: left out of the text, counted" \
  || fail "padded vocabulary: $padded / $(cat "$WORK/err")"
import json, sys
j = json.loads(sys.argv[1])
piece = {1: "a", 2: " b", 0: ""}
n = sum(t >= 3 for t in j["tokens"])
ok = j["text"] == "".join(piece.get(t, "") for t in j["tokens"]) and n > 0
sys.exit(0 if ok and f"notice: {n} of the ids are not defined by" in sys.argv[2] else 1)
PY
cp "$WORK/tok/tokenizer.json" "$WORK/small/"

# ---- --prompt text encoded by a tokenizer.json (the Llama 3 fixture of tests/models/test_hf_encoder.cpp,
# whose ids the tokenizers library computed) -----------------------------------------------------------
FIX="$(dirname "$0")/../models/tokenizers"
python3 - "$WORK/small.json" "$WORK/v600.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["vocab_size"] = 600; c["bos_token_id"] = 0; c["eos_token_id"] = 1
json.dump(c, open(sys.argv[2], "w"))
PY
"$BIN" init --config "$WORK/v600.json" --seed 1 --out "$WORK/v600" >/dev/null || fail "init v600"
cp "$FIX/llama3.json" "$WORK/v600/tokenizer.json"
enc=$("$BIN" generate --hf "$WORK/v600" --prompt $'tabs\tand\nnewlines\r\n\n  spaces   here ' --max-new-tokens 2 --temperature 0 --eos none 2>/dev/null | tail -n 1)
raw=$("$BIN" generate --hf "$WORK/v600" --prompt "Hello world" --no-special-tokens --max-new-tokens 2 --temperature 0 --eos none 2>/dev/null | tail -n 1)
python3 - "$enc" "$raw" "$FIX/expected.json" <<'PY' && pass "--prompt text: the tokenizers library's ids (with BOS; --no-special-tokens without)" \
  || fail "--prompt encoding: $enc / $raw"
import json, sys
e = {c["text"]: c for c in json.load(open(sys.argv[3]))["llama3"]}
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert a["prompt"] == e["tabs\tand\nnewlines\r\n\n  spaces   here "]["ids"], a["prompt"]
assert b["prompt"] == e["Hello world"]["ids_no_special"], b["prompt"]
assert len(a["tokens"]) == 2 and "text" in a, a
PY
"$BIN" train --hf "$WORK/v600" --seq 16 --batch 2 --steps 1 --sample-every 1 --sample-prompt "Hello world" --sample-tokens 3 \
  --metrics "" >"$WORK/sample.out" 2>&1 && grep -q "sample" "$WORK/sample.out" \
  && pass "train --sample-prompt text encoded by --hf's tokenizer.json" || fail "sample prompt: $(tail -3 "$WORK/sample.out")"

# ---- tokenize: text documents to a token shard with the same tokenizer, then train on it -------------
python3 - "$FIX/expected.json" "$WORK/docs.jsonl" <<'PY'
import json, sys
with open(sys.argv[2], "w") as f:
    for c in json.load(open(sys.argv[1]))["llama3"]:
        f.write(json.dumps({"text": c["text"]}) + "\n")
PY
"$BIN" tokenize "$WORK/docs.jsonl" --format jsonl --tokenizer "$WORK/v600" --out "$WORK/docs.bin" >"$WORK/tok.out" \
  || fail "tokenize: $(cat "$WORK/tok.out")"
python3 - "$FIX/expected.json" "$WORK/docs.bin" <<'PY' && pass "tokenize --format jsonl: the tokenizers library's ids, BOS per document" \
  || fail "tokenize shard"
import json, struct, sys
want = [i for c in json.load(open(sys.argv[1]))["llama3"] for i in c["ids"]]
b = open(sys.argv[2], "rb").read()
magic, version, n = struct.unpack("<3i", b[:12])
got = list(struct.unpack(f"<{n}H", b[1024:]))
assert (magic, version) == (20240520, 1) and got == want, (magic, version, got[:20], want[:20])
PY
"$BIN" train --hf "$WORK/v600" --data "$WORK/docs.bin" --steps 2 --batch 2 --seq 16 --metrics "" >"$WORK/tok_train.out" 2>&1 \
  && pass "train --hf --data on the tokenized shard" || fail "train on the shard: $(tail -2 "$WORK/tok_train.out")"
expect_error "tokenize a jsonl line without the field" "docs.jsonl line 1: no string field 'body'" -- \
  "$BIN" tokenize "$WORK/docs.jsonl" --format jsonl --text-field body --tokenizer "$WORK/v600" --out "$WORK/x.bin"
printf '{"text": "a \\ud800 b"}\n[1, 2]\n' >"$WORK/bad1.jsonl"
expect_error "tokenize a jsonl line with a lone surrogate escape" "bad1.jsonl line 1: not valid JSON: " -- \
  "$BIN" tokenize "$WORK/bad1.jsonl" --format jsonl --tokenizer "$WORK/v600" --out "$WORK/x.bin"
tail -n 1 "$WORK/bad1.jsonl" >"$WORK/bad2.jsonl"
expect_error "tokenize a jsonl line that is an array" "bad2.jsonl line 1: not a JSON object (a array)" -- \
  "$BIN" tokenize "$WORK/bad2.jsonl" --format jsonl --tokenizer "$WORK/v600" --out "$WORK/x.bin"
expect_error "tokenize --text-field without jsonl" "--text-field applies to --format jsonl, not lines" -- \
  "$BIN" tokenize "$WORK/docs.jsonl" --format lines --text-field body --tokenizer "$WORK/v600" --out "$WORK/x.bin"
expect_error "tokenize onto its input" "same file as an input" -- \
  "$BIN" tokenize "$WORK/docs.jsonl" --tokenizer "$WORK/v600" --out "$WORK/docs.jsonl"
# Onto the weights of the checkpoint directory given as --tokenizer (written over until
# 2026-12-07): refused, the weights unchanged.
cp "$WORK/v600/model.safetensors" "$WORK/v600_weights.bak"
expect_error "tokenize onto the --tokenizer directory's weights" "is a checkpoint file of --tokenizer" -- \
  "$BIN" tokenize "$WORK/docs.jsonl" --tokenizer "$WORK/v600" --out "$WORK/v600/model.safetensors"
cmp -s "$WORK/v600/model.safetensors" "$WORK/v600_weights.bak" && pass "the --tokenizer directory's weights unchanged" \
  || fail "tokenize changed the --tokenizer directory's weights"

# ---- 256 ids with a tokenizer.json: the tokenizer's, not bytes -------------------------------------------
# A byte-level BPE of exactly 256 tokens, id = (byte + 1) mod 256 and no merges, beside a 256-id
# checkpoint: --prompt is encoded and the output decoded by it (they were taken as bytes until
# 2026-12-08, silently, whenever a vocabulary had 256 ids).
python3 - "$FIX/gpt2.json" "$WORK/tok256.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
def byte_chars():  # GPT-2's byte-to-character table (the ByteLevel pre-tokenizer's alphabet)
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}
chars = byte_chars()
j["model"]["vocab"] = {chars[b]: (b + 1) % 256 for b in range(256)}
j["model"]["merges"] = []
j["added_tokens"] = []
json.dump(j, open(sys.argv[2], "w"))
PY
"$BIN" init --config llama-tiny --seed 2 --out "$WORK/v256" >/dev/null || fail "init v256"
cp "$WORK/tok256.json" "$WORK/v256/tokenizer.json"
out=$("$BIN" generate --hf "$WORK/v256" --prompt "ab" --max-new-tokens 3 --temperature 0 --eos none 2>"$WORK/err")
python3 - "$(tail -n 1 <<<"$out")" <<'PY' && pass "256 ids with a tokenizer.json: --prompt encoded and the text decoded by it" \
  || fail "256 ids with a tokenizer.json: $out $(tail -n 1 "$WORK/err")"
import json, sys
j = json.loads(sys.argv[1])
assert j["prompt"] == [98, 99], j["prompt"]
assert j["text"] == "".join(chr((t - 1) % 256) for t in j["tokens"]), j
PY

# ---- bad input --------------------------------------------------------------------------------------
expect_error "--prompt text without a tokenizer.json" "needs a tokenizer.json (--config has none: use --hf DIR)" -- \
  "$BIN" generate --config "$WORK/small.json" --prompt "hello"
expect_error "--no-special-tokens with --prompt-ids" "applies to a --prompt encoded by a tokenizer.json" -- \
  "$BIN" generate --hf "$WORK/small" --prompt-ids 0 --no-special-tokens
expect_error "a prompt id outside the vocabulary" "prompt token 8 (position 1) is outside the vocabulary [0, 8)" -- \
  "$BIN" generate --hf "$WORK/small" --prompt-ids 0,8
expect_error "a malformed --prompt-ids" "item 2 ('x') is not a token id" -- \
  "$BIN" generate --hf "$WORK/small" --prompt-ids 1,x
expect_error "--top-p 0" "top_p 0 must be in (0, 1]" -- "$BIN" generate --hf "$CK" --prompt a --top-p 0
expect_error "a negative temperature" "temperature -1 must be a finite number >= 0" -- \
  "$BIN" generate --hf "$CK" --prompt a --temperature -1
expect_error "both --hf and --config" "one of the two" -- "$BIN" generate --hf "$CK" --config llama-tiny --prompt a
expect_error "--init-seed with --hf" "--init-seed sets the random weights of --config" -- \
  "$BIN" generate --hf "$CK" --init-seed 9 --prompt a
expect_error "no prompt" "--prompt TEXT or --prompt-ids" -- "$BIN" generate --hf "$CK"
expect_error "past max_position_embeddings" "which pass the model's max_position_embeddings of 64" -- \
  "$BIN" generate --hf "$WORK/small" --prompt-ids 0,1,2 --max-new-tokens 63
# The last new token is never fed back: 3 + 62 tokens run positions 0..63, which fit.
"$BIN" generate --hf "$WORK/small" --prompt-ids 0,1,2 --max-new-tokens 62 --eos none >"$WORK/out" 2>"$WORK/err" \
  && pass "3 prompt tokens + 62 new ones fit 64 positions" || fail "3 + 62 tokens: $(tail -n 1 "$WORK/err")"
expect_error "a missing checkpoint" "$WORK/nothing" -- "$BIN" generate --hf "$WORK/nothing" --prompt a
expect_error "train --sample-prompt text without a tokenizer.json" "needs a tokenizer.json in the --hf directory (there is no --hf)" -- \
  "$BIN" train --config "$WORK/small.json" --seq 16 --batch 2 --steps 1 --sample-every 1 --sample-prompt hi --metrics ""
expect_error "--eos outside the vocabulary" "--eos 9 is out of range" -- \
  "$BIN" generate --hf "$WORK/small" --prompt-ids 0 --max-new-tokens 4 --eos 9
# Flags are checked before the checkpoint is read: a broken checkpoint does not hide them.
mkdir -p "$WORK/broken" && cp "$WORK/small/config.json" "$WORK/broken/" && head -c 100 "$WORK/small/model.safetensors" \
  > "$WORK/broken/model.safetensors"
expect_error "a malformed --prompt-ids before the checkpoint" "item 2 ('') is not a token id" -- \
  "$BIN" generate --hf "$WORK/broken" --prompt-ids "1,,2"
expect_error "--no-special-tokens without --prompt before the checkpoint" "applies to a --prompt" -- \
  "$BIN" generate --hf "$WORK/broken" --prompt-ids 1 --no-special-tokens
expect_error "a switch with a value it does not take" "--no-cache is a switch" -- \
  "$BIN" generate --hf "$CK" --prompt a --no-cache=maybe
expect_error "generate under mpirun -np 2 (the launcher's size)" "runs in one process, but mpirun started 2" -- \
  env OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 "$BIN" generate --hf "$CK" --prompt a
# A subnormal number is a number (it was "out of the range of a double").
"$BIN" generate --hf "$CK" --prompt a --max-new-tokens 2 --temperature 1e-320 >/dev/null 2>"$WORK/err" \
  && pass "--temperature 1e-320 is taken" || fail "--temperature 1e-320: $(tail -n 1 "$WORK/err")"
# tokenize: inputs after the flags get the hint; its result line is checked as written.
expect_error "tokenize with the inputs after the flags" "give the input files before the flags" -- \
  "$BIN" tokenize --tokenizer "$FIX/llama3.json" --out "$WORK/t.bin" "$WORK/rep.bin"
printf 'hello world\n' > "$WORK/hello.txt"
"$BIN" tokenize "$WORK/hello.txt" --tokenizer "$FIX/llama3.json" --out "$WORK/hello.bin" >/dev/full 2>"$WORK/err"
[ $? -ne 0 ] && grep -q "cannot write the result to stdout" "$WORK/err" \
  && pass "tokenize > /dev/full: an error, not exit 0" || fail "tokenize > /dev/full: $(tail -n 1 "$WORK/err")"

echo "failures: $fails"
[ $fails -eq 0 ]
