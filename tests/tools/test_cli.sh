#!/usr/bin/env bash
# End-to-end tests of the meshtrain CLI contracts (init, eval, grad, train, resume) and of its
# errors on bad input: one clear line naming the file, a non-zero exit, nothing half-written.
# usage: test_cli.sh MESHTRAIN_BINARY
set -u
BIN=$1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=2
fails=0
pass() { echo "ok   - $1"; }
fail() { echo "FAIL - $1"; fails=$((fails + 1)); }
# json_field FILE_OR_STRING KEY: value of KEY in a one-line JSON object
json_loss() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])["loss"])' "$1"; }

# Expects failure: exit != 0, stderr's last line contains every given pattern.
expect_error() {
  local name=$1; shift
  local pats=()
  while [ "$1" != "--" ]; do pats+=("$1"); shift; done
  shift
  "$@" >"$WORK/out" 2>"$WORK/err"
  local rc=$?
  local last
  last=$(tail -n 1 "$WORK/err")
  if [ $rc -eq 0 ]; then fail "$name: exit code 0"; return; fi
  for p in "${pats[@]}"; do
    if ! grep -qF -- "$p" <<<"$last"; then fail "$name: '$p' not in: $last"; return; fi
  done
  pass "$name"
}

# ---- init / eval / grad ------------------------------------------------------------------------
"$BIN" init --config llama-tiny --seed 3 --out "$WORK/ck" >"$WORK/init.out" || fail "init exit"
[ -f "$WORK/ck/config.json" ] && [ -f "$WORK/ck/model.safetensors" ] && pass "init writes config.json + model.safetensors" || fail "init files"
ls "$WORK" | grep -q tmp && fail "init left a temporary" || pass "init leaves no temporaries"
"$BIN" init --config llama-tiny --seed 3 --out "$WORK/ck2" >/dev/null
cmp -s "$WORK/ck/model.safetensors" "$WORK/ck2/model.safetensors" && pass "init is deterministic per seed" || fail "init determinism"

python3 - "$WORK/tokens.txt" <<'PY'
import random, sys
random.seed(0)
with open(sys.argv[1], "w") as f:
    for _ in range(3):
        f.write(",".join(str(random.randrange(256)) for _ in range(17)) + "\n")
PY
"$BIN" eval --hf "$WORK/ck" --tokens "$WORK/tokens.txt" >"$WORK/eval.out" || fail "eval exit"
L=$(tail -n 1 "$WORK/eval.out")
LOSS=$(json_loss "$L") && pass "eval prints {\"loss\": ...} last: $L" || fail "eval last line: $L"
python3 -c "import math,sys; l=float(sys.argv[1]); sys.exit(0 if abs(l-math.log(256))<0.05 else 1)" "$LOSS" \
  && pass "fresh-init loss is near ln(256)" || fail "fresh-init loss $LOSS not near ln 256"

"$BIN" grad --hf "$WORK/ck" --tokens "$WORK/tokens.txt" --out "$WORK/g.safetensors" >"$WORK/grad.out" || fail "grad exit"
G=$(tail -n 1 "$WORK/grad.out")
[ "$(json_loss "$G")" = "$LOSS" ] && pass "grad prints the same loss as eval" || fail "grad loss $G vs eval $L"
python3 - "$WORK/g.safetensors" "$WORK/ck/model.safetensors" <<'PY' && pass "grad writes an f32 gradient for every parameter" || fail "grad file"
import json, struct, sys
def header(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None); return h
g, w = header(sys.argv[1]), header(sys.argv[2])
assert set(g) == set(w), (set(g) ^ set(w))
assert all(v["dtype"] == "F32" and v["shape"] == w[k]["shape"] for k, v in g.items())
PY

# grad agrees with a central finite difference of eval on the most sensitive final-norm weight.
python3 - "$BIN" "$WORK" <<'PY' && pass "grad matches a finite difference of eval" || fail "grad vs finite difference"
import json, shutil, struct, subprocess, sys
bin_, work = sys.argv[1], sys.argv[2]
def header(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
    return b, n, json.loads(b[8:8 + n])
gb, gn, gh = header(f"{work}/g.safetensors")
name = "model.norm.weight"
lo, hi = gh[name]["data_offsets"]
g = struct.unpack(f"<{(hi - lo) // 4}f", gb[8 + gn + lo:8 + gn + hi])
i = max(range(len(g)), key=lambda k: abs(g[k]))
assert abs(g[i]) > 1e-4, f"gradient of {name} is ~0: {g[i]}"
def loss_with(delta):
    d = f"{work}/fd"; shutil.rmtree(d, ignore_errors=True); shutil.copytree(f"{work}/ck", d)
    p = f"{d}/model.safetensors"; b, n, h = header(p)
    meta = h.get("__metadata__", {}); meta.pop("mt.crc32", None)  # we edit the data by hand
    off = 8 + n + h[name]["data_offsets"][0] + 4 * i
    x = struct.unpack("<f", b[off:off + 4])[0] + delta
    b = bytearray(b); b[off:off + 4] = struct.pack("<f", x)
    hj = json.dumps(h).encode(); hj += b" " * (-len(hj) % 8)
    open(p, "wb").write(struct.pack("<Q", len(hj)) + hj + bytes(b[8 + n:]))
    out = subprocess.run([bin_, "eval", "--hf", d, "--tokens", f"{work}/tokens.txt"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["loss"]
eps = 1e-2
fd = (loss_with(eps) - loss_with(-eps)) / (2 * eps)
print(f"{name}[{i}]: grad {g[i]:.6g}, finite difference {fd:.6g}")
assert abs(fd - g[i]) <= 2e-3 * max(1.0, abs(g[i])) + 0.02 * abs(g[i]), (fd, g[i])
PY

# ---- bad inputs ---------------------------------------------------------------------------------
expect_error "missing checkpoint dir" "$WORK/nope" -- "$BIN" eval --hf "$WORK/nope" --tokens "$WORK/tokens.txt"
cp -r "$WORK/ck" "$WORK/corrupt"
python3 -c "import sys; p=sys.argv[1]; b=open(p,'rb').read(); open(p,'wb').write(b[:len(b)//2])" "$WORK/corrupt/model.safetensors"
expect_error "truncated safetensors" "model.safetensors" -- "$BIN" eval --hf "$WORK/corrupt" --tokens "$WORK/tokens.txt"
cp -r "$WORK/ck" "$WORK/mismatch"
python3 -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); c['intermediate_size']+=8; json.dump(c,open(p,'w'))" "$WORK/mismatch/config.json"
expect_error "config does not match weights" "mlp" "shape" -- "$BIN" eval --hf "$WORK/mismatch" --tokens "$WORK/tokens.txt"
printf '1,2,3\n4,5,999\n' >"$WORK/range.txt"
expect_error "token id out of range" "range.txt" "999" -- "$BIN" eval --hf "$WORK/ck" --tokens "$WORK/range.txt"
printf '1,2,3\n4,5\n' >"$WORK/ragged.txt"
expect_error "ragged token lines" "ragged.txt" "line 2" -- "$BIN" eval --hf "$WORK/ck" --tokens "$WORK/ragged.txt"
printf '1,x,3\n' >"$WORK/nonint.txt"
expect_error "non-integer token" "nonint.txt" -- "$BIN" eval --hf "$WORK/ck" --tokens "$WORK/nonint.txt"
touch "$WORK/afile"
expect_error "unwritable grad output" "$WORK/afile/g.safetensors" -- "$BIN" grad --hf "$WORK/ck" --tokens "$WORK/tokens.txt" --out "$WORK/afile/g.safetensors"
expect_error "unwritable init output" "$WORK/afile/out" -- "$BIN" init --config llama-tiny --out "$WORK/afile/out"
expect_error "unknown config name" "llama-huge" -- "$BIN" init --config llama-huge --out "$WORK/x"
[ ! -e "$WORK/x" ] && pass "failed init writes nothing" || fail "failed init left $WORK/x"
expect_error "unknown flag" "--bogus" -- "$BIN" train --bogus 1
# The process environment (docs/cli.md, "Environment"): an absurd OpenMP thread count crashed inside
# the OpenMP runtime; a pipe as --data blocked forever; a closed stdout handed its number to the
# metrics file, which got the step lines; `| head` killed the run by SIGPIPE.
expect_error "absurd OMP_NUM_THREADS" "OMP_NUM_THREADS asks for 100000 threads" -- \
  env OMP_NUM_THREADS=100000 "$BIN" train --steps 1 --seq 32 --batch 2 --metrics ""
mkfifo "$WORK/fifo"
expect_error "a pipe as --data" "--data $WORK/fifo: is not a regular file" -- \
  timeout 20 "$BIN" train --steps 1 --seq 32 --batch 2 --metrics "" --data "$WORK/fifo"
# Several shards (docs/data.md, "Several shards"): a glob pattern reads the matching shards, mapped,
# in name order, as one stream: the losses of the same tokens in one file, bit for bit, with
# windows across the shard boundaries and a wrap (3 steps of 2 x 32 + 1 tokens over 170 tokens).
mkdir -p "$WORK/shards"
python3 - "$WORK/shards" <<'PY'
import struct, sys
toks = [(i * 7919) % 256 for i in range(170)]
def shard(path, t):
    open(path, "wb").write(struct.pack("<256i", 20240520, 1, len(t), *([0] * 253)) + struct.pack(f"<{len(t)}H", *t))
shard(sys.argv[1] + "/all.bin", toks)
for k, (a, b) in enumerate([(0, 50), (50, 51), (51, 170)]):
    shard(f"{sys.argv[1]}/part_{k}.bin", toks[a:b])
PY
S=(train --steps 6 --seq 32 --batch 2 --warmup 1 --seed 3)
"$BIN" "${S[@]}" --data "$WORK/shards/all.bin" --metrics "$WORK/one.jsonl" >/dev/null 2>"$WORK/err" \
  && "$BIN" "${S[@]}" --data "$WORK/shards/part_*.bin" --metrics "$WORK/three.jsonl" --checkpoint-dir "$WORK/shck" \
       --stop-at 3 >"$WORK/out" 2>"$WORK/err" \
  && "$BIN" "${S[@]}" --data "$WORK/shards/part_*.bin" --metrics "$WORK/three.jsonl" --checkpoint-dir "$WORK/shck" \
       --resume >/dev/null 2>"$WORK/err" \
  && grep -q "), 170 tokens (unigram entropy" "$WORK/out" \
  && python3 - "$WORK/one.jsonl" "$WORK/three.jsonl" <<'PY' \
  && pass "--data 'part_*.bin': three shards (one of 1 token) train as the one file, bit for bit, resumed at step 3" \
  || fail "--data with a pattern: $(tail -n 1 "$WORK/err")"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:])
assert len(a) == 6 and a == b, (a, b)
PY
mv "$WORK/shards/part_2.bin" "$WORK/shards/part_9.bin"
expect_error "resume with the shards renamed" "settings differ from those" \
  "--data $WORK/shards/part_*.bin (3 files, 3412 bytes, crc32" -- \
  "$BIN" "${S[@]}" --steps 8 --data "$WORK/shards/part_*.bin" --metrics "" --checkpoint-dir "$WORK/shck" --resume
expect_error "a pattern that matches nothing" "--val-data $WORK/shards/none_*.bin: no file matches the pattern" -- \
  "$BIN" "${S[@]}" --val-data "$WORK/shards/none_*.bin" --metrics ""
expect_error "a pattern under a missing directory" "--data $WORK/nodir/*.bin: no file matches the pattern" -- \
  "$BIN" "${S[@]}" --data "$WORK/nodir/*.bin" --metrics ""
mkdir -p "$WORK/shards/part_5.bin"
expect_error "a pattern matching a directory names the pattern" \
  "--data $WORK/shards/part_*.bin: read_token_file: '$WORK/shards/part_5.bin' is a directory, not a file" -- \
  "$BIN" "${S[@]}" --data "$WORK/shards/part_*.bin" --metrics ""
rmdir "$WORK/shards/part_5.bin"
expect_error "parity with an empty --data" "meshtrain parity: --data is empty" -- \
  "$BIN" parity --plan "$(dirname "$0")/../../plans/llama_dp.plan" --data "" --steps 1
python3 -c 'import struct,sys; open(sys.argv[1],"wb").write(struct.pack("<256i",20240520,1,1,*([0]*253))+struct.pack("<H",300))' \
  "$WORK/shards/part_1.bin"
expect_error "an id beyond the vocabulary, named by file and position" \
  "--data $WORK/shards/part_*.bin: token id 300 (at $WORK/shards/part_1.bin position 0) is out of range for vocab_size 256" -- \
  "$BIN" "${S[@]}" --data "$WORK/shards/part_*.bin" --metrics ""
# The fingerprint of a single file samples 32 blocks over it: a same-size change in the middle of a
# 3 MB shard is caught (the first and last MiB alone missed it); a checkpoint that recorded the
# older form (its first and last MiB) still resumes.
python3 - "$WORK/big.bin" <<'PY'
import struct, sys
n = 1_500_000
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)) + struct.pack(f"<{n}H", *(i % 251 for i in range(n))))
PY
B1=(train --steps 3 --seq 32 --batch 2 --warmup 1 --data "$WORK/big.bin" --metrics "" --checkpoint-dir "$WORK/bigck")
"$BIN" "${B1[@]}" --stop-at 1 >/dev/null 2>"$WORK/err" || fail "training on a 3 MB shard: $(tail -n 1 "$WORK/err")"
cp -r "$WORK/bigck" "$WORK/bigck2"  # as written: the new fingerprint
python3 - "$WORK/big.bin" "$WORK/bigck/step-00000001/trainer_state.json" <<'PY'
import json, sys, zlib
data = open(sys.argv[1], "rb").read()
mib = 1 << 20
crc = zlib.crc32(data[-mib:], zlib.crc32(data[:mib]))
p = sys.argv[2]; j = json.load(open(p))
j["settings"]["data"] = f"{len(data)} bytes, crc32 {crc:08x} of the first and last MiB"
json.dump(j, open(p, "w"))
PY
"$BIN" "${B1[@]}" --stop-at 2 --resume >"$WORK/out" 2>"$WORK/err" && grep -q "resumed from .* at step 1" "$WORK/out" \
  && pass "a checkpoint that recorded the first and last MiB of its data resumes on the same file" \
  || fail "resume with the older data fingerprint: $(tail -n 1 "$WORK/err")"
python3 - "$WORK/big.bin" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read())
part = 1 << 16; at = (len(b) - part) * 16 // 31 + 100  # inside the 17th sampled block, far from both ends
b[at] ^= 1
open(p, "wb").write(bytes(b))
PY
expect_error "a same-size change in the middle of a 3 MB shard" "settings differ from those" \
  "of 32 blocks of 64 KiB over the file; the checkpoint's:" -- \
  "$BIN" "${B1[@]}" --checkpoint-dir "$WORK/bigck2" --resume
# Flags that would be ignored are refused; a missing shard says so.
expect_error "an empty --data" "--data is empty; give a token shard" -- "$BIN" "${S[@]}" --data "" --metrics ""
expect_error "--val-every without --val-data" "--val-every applies to the validation loss of --val-data" -- \
  "$BIN" "${S[@]}" --val-every 1 --metrics ""
expect_error "--sample-tokens without --sample-every" "--sample-tokens applies to the samples of --sample-every N" -- \
  "$BIN" "${S[@]}" --sample-tokens 5 --metrics ""
expect_error "a missing --data file" "file '$WORK/shards/nosuch.bin' does not exist" -- \
  "$BIN" "${S[@]}" --data "$WORK/shards/nosuch.bin" --metrics ""
expect_error "a directory as --data" "'$WORK/shards' is a directory, not a file" -- \
  "$BIN" "${S[@]}" --data "$WORK/shards" --metrics ""
"$BIN" train --steps 2 --seq 32 --batch 2 --metrics "$WORK/closed.jsonl" >&- 2>"$WORK/err"; rc=$?
[ $rc -eq 1 ] && grep -q "stdout" "$WORK/err" && python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' \
  "$WORK/closed.jsonl" && pass "closed stdout: exit 1 naming stdout, the metrics file holds JSON lines only" \
  || fail "closed stdout: exit $rc, $(tail -n 1 "$WORK/err")"
"$BIN" train --steps 3 --seq 32 --batch 2 --metrics "" --checkpoint-dir "$WORK/piped" 2>"$WORK/err" | head -n 1 >/dev/null
rc=${PIPESTATUS[0]}
[ $rc -eq 1 ] && [ "$(cat "$WORK/piped/latest" 2>/dev/null)" = step-00000003 ] && grep -q "Broken pipe" "$WORK/err" \
  && pass "train | head: the run finishes and saves, then exit 1 (Broken pipe)" \
  || fail "train | head: exit $rc, latest '$(cat "$WORK/piped/latest" 2>/dev/null)', $(tail -n 1 "$WORK/err")"

# ---- train: resume equals an uninterrupted run ----------------------------------------------------
T="--batch 2 --seq 32 --steps 20 --lr 3e-3 --warmup 2 --dropout 0.1 --metrics"
# The test setups set MT_PEAK_TFLOPS (tests/meson.build); this run measures the MFU reference.
env -u MT_PEAK_TFLOPS "$BIN" train $T "$WORK/full.jsonl" --checkpoint-dir "$WORK/full" >"$WORK/full.out" || fail "train (full) exit"
"$BIN" train $T "$WORK/part.jsonl" --stop-at 10 --checkpoint-dir "$WORK/part" >/dev/null || fail "train (part 1) exit"
"$BIN" train $T "$WORK/part.jsonl" --resume --checkpoint-dir "$WORK/part" >"$WORK/part.out" || fail "train (resume) exit"
cmp -s "$WORK/full/step-00000020/model.safetensors" "$WORK/part/step-00000020/model.safetensors" \
  && pass "10 steps + resume + 10 steps == 20 steps (weights bit for bit)" || fail "resume weights differ"
cmp -s "$WORK/full/step-00000020/optimizer.safetensors" "$WORK/part/step-00000020/optimizer.safetensors" \
  && pass "resume: optimizer state bit for bit" || fail "resume optimizer state differs"
diff <(python3 -c "import json,sys; [print(json.loads(l)['step'], repr(json.loads(l)['loss'])) for l in open(sys.argv[1])]" "$WORK/full.jsonl") \
     <(python3 -c "import json,sys; [print(json.loads(l)['step'], repr(json.loads(l)['loss'])) for l in open(sys.argv[1])]" "$WORK/part.jsonl") >/dev/null \
  && pass "resume: every step's loss equal" || fail "resume losses differ"
# The resumed run holds what the uninterrupted one holds: the checkpoint's copies of the weights and
# moments are let go once loaded (they stayed for the whole run until 2026-12-07: +12 bytes per
# parameter, 35 MiB against 26 here). At 4 x 128 tokens the steps' activations set the peak, not
# the moment of loading.
M="--batch 4 --seq 128 --steps 3 --warmup 1 --metrics"
"$BIN" train $M "$WORK/m_full.jsonl" >/dev/null 2>&1 || fail "train 4 x 128"
"$BIN" train $M "$WORK/m_part.jsonl" --stop-at 1 --checkpoint-dir "$WORK/m_ck" >/dev/null 2>&1 || fail "train --stop-at 1"
"$BIN" train $M "$WORK/m_part.jsonl" --checkpoint-dir "$WORK/m_ck" --resume >/dev/null 2>&1 || fail "train --resume"
mem=$(python3 -c "import json,sys; print(*[[json.loads(l) for l in open(f)][-1]['mem_peak_mib'] for f in sys.argv[1:]])" \
  "$WORK/m_full.jsonl" "$WORK/m_part.jsonl")
python3 -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if b <= a + 0.5 else 1)" $mem \
  && pass "resume: the peak memory of the uninterrupted run ($mem MiB)" \
  || fail "resume: peak memory above the uninterrupted run's: $mem MiB"
grep -q "grad norm" "$WORK/full.out" && grep -q "tok/s" "$WORK/full.out" && grep -q "MFU" "$WORK/full.out" && grep -q "MiB" "$WORK/full.out" \
  && pass "train prints loss, grad norm, lr, tok/s, MFU, memory" || fail "train step line"
"$BIN" train $T "$WORK/bf.jsonl" --precision bf16 --steps 4 >/dev/null && pass "bf16 mixed precision trains" || fail "bf16 train"

# ---- train: MT_PEAK_TFLOPS, the MFU reference given instead of measured ---------------------------
# MFU = tokens/s x FLOPs per token / peak: per token/s, it scales as 1 / MT_PEAK_TFLOPS.
P="--batch 2 --seq 32 --steps 2 --warmup 1 --metrics"
MT_PEAK_TFLOPS=0.05 "$BIN" train $P "$WORK/peak1.jsonl" >/dev/null 2>&1 || fail "MT_PEAK_TFLOPS=0.05 train"
MT_PEAK_TFLOPS=2e-1 "$BIN" train $P "$WORK/peak2.jsonl" >/dev/null 2>&1 || fail "MT_PEAK_TFLOPS=2e-1 train"
python3 - "$WORK/peak1.jsonl" "$WORK/peak2.jsonl" <<'PY' && pass "MT_PEAK_TFLOPS: MFU per token/s scales as 1 / peak" || fail "MT_PEAK_TFLOPS: MFU"
import json, sys
r = [[json.loads(l) for l in open(f)][-1] for f in sys.argv[1:]]
k = [x["mfu"] / x["tokens_per_s"] for x in r]  # FLOPs per token / peak
sys.exit(0 if abs(k[0] / k[1] - 4.0) < 1e-6 else 1)
PY
for v in 0 -1 abc 1e400 nan 1e7 "5 "; do
  expect_error "MT_PEAK_TFLOPS='$v': exit 1 naming the variable" "MT_PEAK_TFLOPS='$v'" "TFLOP/s" -- \
    env MT_PEAK_TFLOPS="$v" "$BIN" train $P "$WORK/peak_bad.jsonl"
done

# ---- train: a --data shard truncated under the run -------------------------------------------------
# The next read of a lost page of the mapped shard is a SIGBUS: the process still ends by it (no
# step could go on), but first says what it most likely means (the shell's "Bus error" alone until
# 2026-12-07).
python3 -c 'import struct,sys; n=200000; open(sys.argv[1],"wb").write(struct.pack("<256i",20240520,1,n,*([0]*253))+struct.pack("<%dH" % n,*(i % 251 for i in range(n))))' \
  "$WORK/bus.bin"
"$BIN" train --data "$WORK/bus.bin" --steps 5000 --seq 32 --batch 2 --warmup 1 --metrics "$WORK/bus.jsonl" \
  >"$WORK/bus.out" 2>"$WORK/bus.err" &
pid=$!
for _ in $(seq 200); do [ "$(wc -l <"$WORK/bus.jsonl" 2>/dev/null || echo 0)" -ge 2 ] && break; sleep 0.1; done
python3 -c 'import os,sys; os.truncate(sys.argv[1], 1024 + 200)' "$WORK/bus.bin"
wait $pid
rc=$?
[ $rc -eq 135 ] && grep -q "SIGBUS (bus error) reading a memory-mapped file: a --data or --val-data shard was most likely truncated" "$WORK/bus.err" \
  && pass "a --data shard truncated under the run: SIGBUS, with a message saying what it means" \
  || fail "a truncated --data shard: exit $rc, $(tail -n 2 "$WORK/bus.err")"
# A SIGBUS sent with kill has no faulting read to repeat: the handler raises it again itself (before
# 2026-12-07 the run went on training).
"$BIN" train --steps 5000 --seq 32 --batch 2 --metrics "$WORK/kbus.jsonl" >/dev/null 2>"$WORK/kbus.err" &
pid=$!
for _ in $(seq 200); do [ "$(wc -l <"$WORK/kbus.jsonl" 2>/dev/null || echo 0)" -ge 1 ] && break; sleep 0.1; done
kill -BUS $pid
wait $pid
rc=$?
[ $rc -eq 135 ] && grep -q "SIGBUS (bus error)" "$WORK/kbus.err" && pass "kill -BUS ends the run (exit 135) after the message" \
  || { kill $pid 2>/dev/null; fail "kill -BUS: exit $rc, $(tail -n 2 "$WORK/kbus.err")"; }

# ---- train: SIGTERM / SIGINT finish the step, save it, exit 128 + signal; the resume is exact --------
# A script's background job inherits SIGINT ignored (and meshtrain keeps it so, below): the runs
# are started with the default disposition, as from a terminal.
with_default_int() { exec python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])' "$@"; }
for sig in TERM INT; do
  rm -rf "$WORK/sig_$sig" "$WORK/sig_$sig.jsonl"
  with_default_int "$BIN" train --steps 5000 --seq 32 --batch 2 --checkpoint-dir "$WORK/sig_$sig" --metrics "$WORK/sig_$sig.jsonl" \
    >"$WORK/sig.out" 2>"$WORK/sig.err" &
  pid=$!
  for _ in $(seq 200); do [ "$(wc -l <"$WORK/sig_$sig.jsonl" 2>/dev/null || echo 0)" -ge 3 ] && break; sleep 0.1; done
  kill -"$sig" $pid
  wait $pid; rc=$?
  want=$((128 + $(kill -l "$sig")))
  n=$(sed 's/step-0*//' "$WORK/sig_$sig/latest" 2>/dev/null)
  if [ $rc -eq $want ] && [ -n "$n" ] && [ "$n" = "$(tail -n 1 "$WORK/sig_$sig.jsonl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])')" ] \
      && grep -q "stopped by SIG$sig after step $n of 5000" "$WORK/sig.out"; then
    pass "SIG$sig: exit $rc after step $n, its checkpoint saved and named by latest"
    stop=$((n + 3))
    "$BIN" train --steps 5000 --stop-at $stop --seq 32 --batch 2 --checkpoint-dir "$WORK/sig_$sig" --resume \
      --metrics "$WORK/sig_$sig.jsonl" >/dev/null 2>&1
    "$BIN" train --steps 5000 --stop-at $stop --seq 32 --batch 2 --metrics "$WORK/sig_ref.jsonl" >/dev/null 2>&1
    cmp -s <(python3 -c 'import json,sys; [print(json.loads(l)["step"], json.loads(l)["loss"], json.loads(l)["grad_norm"]) for l in open(sys.argv[1])]' "$WORK/sig_$sig.jsonl") \
           <(python3 -c 'import json,sys; [print(json.loads(l)["step"], json.loads(l)["loss"], json.loads(l)["grad_norm"]) for l in open(sys.argv[1])]' "$WORK/sig_ref.jsonl") \
      && pass "SIG$sig: resumed to step $stop, losses and norms equal an uninterrupted run bit for bit" \
      || fail "SIG$sig: the resumed run differs from an uninterrupted one"
  else
    fail "SIG$sig: exit $rc (want $want), latest '$n', $(tail -n 1 "$WORK/sig.out") $(tail -n 1 "$WORK/sig.err")"
  fi
done
# An inherited SIG_IGN stays: a background job of a script is not stopped by SIGINT.
rm -rf "$WORK/sig_ign"
"$BIN" train --steps 5000 --seq 32 --batch 2 --checkpoint-dir "$WORK/sig_ign" --metrics "" >/dev/null 2>&1 &
pid=$!
sleep 1
kill -INT $pid 2>/dev/null
sleep 1
if kill -0 $pid 2>/dev/null; then
  kill -TERM $pid; wait $pid; rc=$?
  [ $rc -eq 143 ] && pass "SIGINT ignored when inherited so; SIGTERM still stops (exit 143)" || fail "SIGTERM after ignored INT: exit $rc"
else
  wait $pid; fail "an inherited-ignored SIGINT stopped the run (exit $?)"
fi

# ---- train: --optimizer adamw8bit and muon resume bit for bit -------------------------------------
for opt in adamw8bit muon; do
  O="--batch 2 --seq 32 --steps 6 --lr 3e-3 --warmup 2 --optimizer $opt --metrics"
  "$BIN" train $O "$WORK/${opt}_full.jsonl" --checkpoint-dir "$WORK/${opt}_full" >/dev/null || fail "$opt train (full) exit"
  "$BIN" train $O "$WORK/${opt}_part.jsonl" --stop-at 3 --checkpoint-dir "$WORK/${opt}_part" >/dev/null || fail "$opt part 1"
  "$BIN" train $O "$WORK/${opt}_part.jsonl" --resume --checkpoint-dir "$WORK/${opt}_part" >/dev/null || fail "$opt resume"
  cmp -s "$WORK/${opt}_full/step-00000006/model.safetensors" "$WORK/${opt}_part/step-00000006/model.safetensors" \
    && cmp -s "$WORK/${opt}_full/step-00000006/optimizer.safetensors" "$WORK/${opt}_part/step-00000006/optimizer.safetensors" \
    && pass "--optimizer $opt: 3 steps + resume + 3 steps == 6 steps (weights and optimizer state bit for bit)" \
    || fail "--optimizer $opt resume differs"
done
"$BIN" train $T "$WORK/bf8.jsonl" --precision bf16 --steps 2 --optimizer adamw8bit >/dev/null \
  && pass "adamw8bit with bf16 trains" || fail "adamw8bit bf16 train"
expect_error "unknown optimizer" "--optimizer must be adamw, adamw8bit or muon" -- "$BIN" train --optimizer sgd --steps 1
expect_error "resume with another optimizer, even with --allow-changes" "--optimizer muon" "trained with adamw8bit" \
  "state cannot become muon's" -- "$BIN" train --batch 2 --seq 32 --steps 8 --lr 3e-3 --warmup 2 --optimizer muon \
  --metrics "" --resume --allow-changes --checkpoint-dir "$WORK/adamw8bit_part"

# ---- train: the schedule of a resumed run, and --min-lr's default --------------------------------
# A run of 4 steps with --warmup 10 warms up over its 4 steps; resumed with --steps 12 it keeps that
# warmup (step 5 is the cosine's first step at --lr), instead of warming up again to step 10.
W="--batch 2 --seq 16 --warmup 10 --lr 1e-3 --metrics"
"$BIN" train $W "$WORK/wu.jsonl" --steps 4 --checkpoint-dir "$WORK/wu" >/dev/null \
  && "$BIN" train $W "$WORK/wu.jsonl" --steps 12 --resume --checkpoint-dir "$WORK/wu" >/dev/null \
  && python3 - "$WORK/wu.jsonl" <<'PY' && pass "a resumed run keeps its warmup; --min-lr defaults to --lr / 10" || fail "resumed schedule: $(cat "$WORK/wu.jsonl")"
import json, math, sys
lr = {j["step"]: j["lr"] for j in map(json.loads, open(sys.argv[1]))}
want = lambda s: 1e-4 + (1e-3 - 1e-4) * 0.5 * (1 + math.cos(math.pi * (s - 4) / 8))  # warmup 4, total 12
ok = abs(lr[4] - 1e-3) < 1e-12 and all(abs(lr[s + 1] - want(s)) < 1e-12 for s in range(4, 12))
sys.exit(0 if ok and len(lr) == 12 else 1)
PY
"$BIN" train --batch 2 --seq 16 --steps 2 --lr 1e-4 --metrics "" >/dev/null && pass "--lr 1e-4 without --min-lr" \
  || fail "--lr 1e-4 without --min-lr"
# The default --min-lr is recorded as its double (3e-3 / 10 = 0.00030000000000000003): a resume
# given --min-lr 3e-4 names that rate, takes the recorded bits, and ends bit for bit where the
# uninterrupted run does (refused as a change until 2026-12-07).
M="--batch 2 --seq 16 --steps 4 --lr 3e-3 --warmup 1 --metrics"
"$BIN" train $M "" --checkpoint-dir "$WORK/mlr_full" >/dev/null \
  && "$BIN" train $M "" --stop-at 2 --checkpoint-dir "$WORK/mlr" >/dev/null \
  && "$BIN" train $M "" --min-lr 3e-4 --resume --checkpoint-dir "$WORK/mlr" >/dev/null \
  && "$BIN" compare "$WORK/mlr" "$WORK/mlr_full" --tol 0 >/dev/null \
  && pass "resume with --min-lr 3e-4 where the checkpoint recorded --lr 3e-3 / 10: bit for bit" \
  || fail "resume with --min-lr 3e-4 against the recorded default"
# A checkpoint written before these rules (min-lr recorded as the old default 3e-4, no
# warmup_steps) resumes without --min-lr, keeping 3e-4 (and, as before, warmup min(10, 14)): the
# last step's rate is 3e-4 + (1e-3 - 3e-4) (1 + cos(pi 3/4)) / 2.
cp -r "$WORK/wu" "$WORK/wu_old"
python3 - "$WORK/wu_old/$(cat "$WORK/wu_old/latest")/trainer_state.json" <<'PY'
import json, sys
p = sys.argv[1]; j = json.load(open(p))
j["settings"]["min-lr"] = "3e-4"; del j["warmup_steps"]
json.dump(j, open(p, "w"))
PY
"$BIN" train $W "$WORK/wu_old.jsonl" --steps 14 --resume --checkpoint-dir "$WORK/wu_old" >/dev/null 2>"$WORK/err" \
  && python3 -c 'import json,math,sys; l=[json.loads(x) for x in open(sys.argv[1])]; sys.exit(0 if l[-1]["step"] == 14 and abs(l[-1]["lr"] - (3e-4 + 7e-4 * 0.5 * (1 + math.cos(math.pi * 0.75)))) < 1e-12 else 1)' "$WORK/wu_old.jsonl" \
  && pass "an older checkpoint resumes without --min-lr, keeping its 3e-4" || fail "old checkpoint min-lr: $(tail -n 1 "$WORK/err")"

# ---- train: --recompute full / selective give the same bits with less memory -----------------------
# 6 steps with dropout (masks replayed from the checkpoint's generator state): the weights after the
# last step equal the run that keeps every activation, byte for byte, and the peak memory is lower.
R="--batch 4 --seq 64 --steps 6 --lr 3e-3 --warmup 2 --dropout 0.1 --metrics"
for mode in none full selective; do
  "$BIN" train $R "$WORK/rc_$mode.jsonl" --recompute $mode --checkpoint-dir "$WORK/rc_$mode" >/dev/null \
    || fail "--recompute $mode train exit"
done
for mode in full selective; do
  cmp -s "$WORK/rc_none/step-00000006/model.safetensors" "$WORK/rc_$mode/step-00000006/model.safetensors" \
    && pass "--recompute $mode: weights after 6 steps bit for bit those of --recompute none" \
    || fail "--recompute $mode: weights differ from --recompute none"
  python3 - "$WORK/rc_none.jsonl" "$WORK/rc_$mode.jsonl" <<'PY' && pass "--recompute $mode: lower peak memory" || fail "--recompute $mode: peak memory not lower"
import json, sys
peak = [max(json.loads(l)["mem_peak_mib"] for l in open(f)) for f in sys.argv[1:]]
print(f"  peak memory: none {peak[0]:.2f} MiB, recompute {peak[1]:.2f} MiB")
sys.exit(0 if peak[1] < peak[0] else 1)
PY
done
expect_error "unknown --recompute" "--recompute" "expected none, full" -- "$BIN" train --recompute some --steps 1

# ---- train from a Hugging Face checkpoint ---------------------------------------------------------
"$BIN" train --hf "$WORK/ck" --steps 3 --batch 2 --seq 32 --metrics "" --checkpoint-dir "$WORK/fromhf" >"$WORK/fromhf.out" \
  && [ -f "$WORK/fromhf/step-00000003/model.safetensors" ] && pass "train --hf starts from a checkpoint" || fail "train --hf"

# ---- gradient accumulation: 2 micro-batches of 1 == one batch of 2 (same data, to rounding) --------
A="--seq 32 --steps 3 --warmup 1 --lr 1e-3"
"$BIN" train $A --batch 2 --accum 1 --metrics "$WORK/b2.jsonl" >/dev/null || fail "train batch 2"
"$BIN" train $A --batch 1 --accum 2 --metrics "$WORK/a2.jsonl" >/dev/null || fail "train accum 2"
python3 - "$WORK/b2.jsonl" "$WORK/a2.jsonl" <<'PY' && pass "accum 2 x batch 1 matches batch 2 (losses within 1e-5)" || fail "gradient accumulation"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 3
for x, y in zip(a, b):
    assert abs(x["loss"] - y["loss"]) < 1e-5 and abs(x["grad_norm"] - y["grad_norm"]) < 1e-4 * max(1, x["grad_norm"]), (x, y)
PY

# bf16 sums the micro-batches' gradients in f32 unless --accum-dtype bf16 (tests/models/test_llama.cpp
# measures the error of each against f32 compute); an f32 run is the same with either value.
"$BIN" train $A --batch 1 --accum 4 --precision bf16 --metrics "$WORK/a4f.jsonl" >/dev/null || fail "bf16 accum 4"
"$BIN" train $A --batch 1 --accum 4 --precision bf16 --accum-dtype bf16 --metrics "$WORK/a4b.jsonl" >/dev/null \
  || fail "bf16 accum 4, --accum-dtype bf16"
"$BIN" train $A --batch 1 --accum 2 --accum-dtype bf16 --metrics "$WORK/a2b.jsonl" >/dev/null || fail "f32 --accum-dtype bf16"
python3 - "$WORK/a2.jsonl" "$WORK/a2b.jsonl" "$WORK/a4f.jsonl" "$WORK/a4b.jsonl" <<'PY' \
  && pass "--accum-dtype: bf16 runs differ with it, f32 runs do not" || fail "--accum-dtype has no effect, or one on f32"
import json, sys
k = lambda f: [(r["loss"], r["grad_norm"]) for r in map(json.loads, open(f))]
f32, f32b, b16f, b16b = map(k, sys.argv[1:])
assert f32 == f32b, (f32, f32b)
assert len(b16f) == len(b16b) == 3 and b16f != b16b, (b16f, b16b)
PY
expect_error "--accum-dtype f16" "--accum-dtype" "f32 or bf16" -- "$BIN" train --steps 1 --accum-dtype f16

# ---- Mixtral: expert rows in the step line and metrics, router-loss flags ------------------------
"$BIN" train --config mixtral-tiny --steps 2 --batch 2 --seq 16 --moe-aux-loss 0.02 --moe-z-loss 0.001 \
  --metrics "$WORK/moe.jsonl" >"$WORK/moe.out" || fail "mixtral train with router losses"
grep -qE "expert rows [0-9]+-[0-9]+$" "$WORK/moe.out" && pass "mixtral step line ends with expert rows" || fail "no expert rows: $(tail -1 "$WORK/moe.out")"
python3 - "$WORK/moe.jsonl" <<'PY' && pass "metrics hold expert_rows_min/max (2 x 16 tokens x top-2 over 4 experts)" || fail "expert rows in metrics"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 2
for r in rows:
    assert 0 <= r["expert_rows_min"] <= r["expert_rows_max"] <= 32, r
PY
"$BIN" train --config mixtral-tiny --steps 1 --batch 2 --seq 16 --moe-capacity-factor 0.5 --metrics "$WORK/moe_cf.jsonl" \
  >"$WORK/moe_cf.out" || fail "mixtral train with a capacity factor"
grep -qE "expert rows [0-9]+-[0-9]+, [1-9][0-9]* dropped$" "$WORK/moe_cf.out" && pass "capacity factor 0.5 drops rows (step line)" \
  || fail "no dropped rows: $(tail -1 "$WORK/moe_cf.out")"
python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).readline()); sys.exit(0 if r["expert_rows_dropped"] > 0 else 1)' \
  "$WORK/moe_cf.jsonl" && pass "expert_rows_dropped in the metrics" || fail "expert_rows_dropped"
# Resume: the checkpoint's config carries the MoE settings its run trained with, so a resume
# without the flags keeps them and is no change (it was refused as one until 2026-12-07); a flag
# given with another value is a change.
MOE_RUN=(train --config mixtral-tiny --steps 2 --batch 2 --seq 16 --metrics "" --checkpoint-dir "$WORK/moe_ck")
"$BIN" "${MOE_RUN[@]}" --stop-at 1 --moe-aux-loss 0.1 --moe-z-loss 0.01 --moe-capacity-factor 0.5 >/dev/null \
  || fail "mixtral run with the MoE flags, saved at step 1"
expect_error "resume with another capacity factor" "--moe-capacity-factor 1 (the checkpoint's: 0.5)" "--allow-changes" -- \
  "$BIN" "${MOE_RUN[@]}" --resume --moe-capacity-factor 1
if "$BIN" "${MOE_RUN[@]}" --resume >"$WORK/moe_res.out" 2>&1 && ! grep -q "changed settings" "$WORK/moe_res.out" \
    && grep -qE "^step +2/2 .*, [1-9][0-9]* dropped$" "$WORK/moe_res.out"; then
  pass "resume without the MoE flags keeps the checkpoint's (rows still dropped), no change reported"
else
  fail "resume without the MoE flags: $(tail -n 2 "$WORK/moe_res.out")"
fi
expect_error "router loss flag on a dense model" "--moe-z-loss" "mixture-of-experts" -- "$BIN" train --config llama-tiny --steps 1 --moe-z-loss 0.1
# HF's router jitter (training noise on the router's input) is not applied: said, not silent.
"$BIN" init --config mixtral-tiny --out "$WORK/jit" >/dev/null 2>&1
python3 -c 'import json,sys; p=sys.argv[1]; c=json.load(open(p)); c["router_jitter_noise"]=0.1; json.dump(c,open(p,"w"))' "$WORK/jit/config.json"
"$BIN" train --hf "$WORK/jit" --steps 1 --batch 2 --seq 16 --metrics "" 2>&1 \
  | grep -qF "note: $WORK/jit/config.json: router_jitter_noise 0.1 is not applied" \
  && pass "train --hf with router_jitter_noise 0.1 says it is not applied" || fail "no note for router_jitter_noise"
"$BIN" train --config "$WORK/jit" --steps 1 --batch 2 --seq 16 --metrics "" 2>&1 \
  | grep -qF "note: $WORK/jit/config.json: router_jitter_noise 0.1 is not applied" \
  && pass "train --config DIR with router_jitter_noise 0.1 says it too" || fail "no note for --config DIR's router_jitter_noise"
expect_error "negative router loss coefficient" "--moe-aux-loss" ">= 0" -- "$BIN" train --config mixtral-tiny --steps 1 --moe-aux-loss -1
expect_error "router loss coefficient beyond f32" "--moe-z-loss 1e39" "at most 3.4e38" -- "$BIN" train --config mixtral-tiny --steps 1 --moe-z-loss 1e39

# Flags with nothing to apply to are refused, naming the flag and what it needs (they were
# accepted and did nothing until 2026-12-08).
for spec in "--keep 1:--checkpoint-dir" "--checkpoint-every 1:--checkpoint-dir" "--overwrite:--checkpoint-dir" \
    "--allow-changes:--resume" "--no-fuse:--plan" "--bucket-mb 1:--plan"; do
  flags=${spec%%:*}
  expect_error "train $flags alone" "meshtrain train: ${flags%% *} applies to" "${spec##*:}" -- \
    "$BIN" train --steps 1 --batch 2 --seq 16 --metrics "" $flags
done
"$BIN" train --steps 1 --batch 2 --seq 16 --metrics "" --overwrite=false --no-fuse=false >/dev/null 2>"$WORK/err" \
  && pass "switches turned off (--overwrite=false) ask for nothing" || fail "--overwrite=false: $(tail -n 1 "$WORK/err")"
"$BIN" init --config llama-tiny --out "$WORK/pt_ck" >/dev/null 2>&1
printf '1,2,3,4,5\n6,7,8,9,10\n' > "$WORK/pt_tokens.txt"
expect_error "parity --tokens with --batch" "--batch does not go with --tokens" -- \
  "$BIN" parity --plan "$(dirname "$0")/../../plans/llama_dp.plan" --hf "$WORK/pt_ck" --tokens "$WORK/pt_tokens.txt" --batch 4
expect_error "plan --memory-gb without --sweep" "--memory-gb is the budget of --sweep" -- \
  "$BIN" plan --plan "$(dirname "$0")/../../plans/llama_dp.plan" --world 2 --estimate --memory-gb 1
expect_error "plan --estimate --fsdp-layout" "--fsdp-layout prints the plan's FSDP buffer layouts" -- \
  "$BIN" plan --plan "$(dirname "$0")/../../plans/llama_fsdp.plan" --world 2 --estimate --fsdp-layout
# smoke's failure is an error line and exit 2 (it printed "LOSS DID NOT FALL" for a loss that fell).
"$BIN" smoke --steps 2 >"$WORK/out" 2>"$WORK/err"; rc=$?
[ $rc -eq 2 ] && grep -q "not below half of the first step's" "$WORK/err" \
  && pass "smoke --steps 2: exit 2, the error names the halving it checks" || fail "smoke --steps 2: exit $rc, $(tail -n 1 "$WORK/err")"
"$BIN" smoke >"$WORK/out" 2>&1 && grep -q ": ok$" "$WORK/out" && pass "smoke: ok" || fail "smoke: $(tail -n 1 "$WORK/out")"

# A train --checkpoint-dir given as --hf: the error names a step directory to give instead.
"$BIN" train --steps 1 --batch 2 --seq 16 --metrics "" --checkpoint-dir "$WORK/hf_ckdir" >/dev/null || fail "train for --hf"
expect_error "generate --hf of a checkpoint directory" "is a train --checkpoint-dir" "its latest: $WORK/hf_ckdir/step-00000001" -- \
  "$BIN" generate --hf "$WORK/hf_ckdir" --prompt-ids 1,2 --max-new-tokens 1

# ---- usage -------------------------------------------------------------------------------------------
# No command: the usage on stderr, exit 2 (a bare `meshtrain` trained for 300 steps and truncated
# ./metrics.jsonl until 2026-12-07); the --help of commands that take arguments before their
# flags shows them; `checkpoint inspect --help` is help, not an error.
(bin_abs=$(realpath "$BIN"); cd "$WORK" && "$bin_abs" >"$WORK/noarg.out" 2>"$WORK/noarg.err"; echo $? >"$WORK/noarg.rc")
[ "$(cat "$WORK/noarg.rc")" = 2 ] && grep -q "^usage: meshtrain COMMAND" "$WORK/noarg.err" && [ ! -e "$WORK/metrics.jsonl" ] \
  && pass "meshtrain without a command: the usage, exit 2, nothing written" || fail "meshtrain without a command: rc $(cat "$WORK/noarg.rc")"
for c in "tokenize|INPUT..." "compare|A B" "checkpoint inspect|DIR"; do
  # shellcheck disable=SC2086
  out=$("$BIN" ${c%%|*} --help 2>&1) && grep -qF "usage: meshtrain ${c%%|*} ${c##*|} [flags]" <<<"$out" \
    && pass "${c%%|*} --help names its arguments" || fail "${c%%|*} --help: $(head -n 1 <<<"$out")"
done

# ---- train: llama-tiny on the embedded corpus learns more than unigram statistics -----------------
# Skipped in the sanitizer build (MT_SANITIZER_RUN=1, tests/meson.build): 150 steps of pure compute
# under ASan cost minutes and check learning, which the regular build checks; the shorter train,
# resume and bf16 runs above exercise the same code under the sanitizers.
if [ "${MT_SANITIZER_RUN:-0}" = 1 ]; then
  echo "skip: llama-tiny convergence run (sanitizer build)"
else
"$BIN" train --steps 150 --batch 8 --seq 64 --metrics "$WORK/tiny.jsonl" >"$WORK/tiny.out" || fail "tiny train exit"
python3 - "$WORK/tiny.out" "$WORK/tiny.jsonl" <<'PY' && pass "llama-tiny loss falls well below the unigram entropy" || fail "llama-tiny did not beat unigram entropy"
import json, re, sys
H = float(re.search(r"unigram entropy ([0-9.]+)", open(sys.argv[1]).read()).group(1))
losses = [json.loads(l)["loss"] for l in open(sys.argv[2])]
last = sum(losses[-10:]) / 10
print(f"unigram entropy {H:.3f} nats, mean loss of the last 10 steps {last:.3f}")
sys.exit(0 if last < H - 0.3 else 1)
PY
fi

echo "cli: $fails failed"
[ $fails -eq 0 ]
