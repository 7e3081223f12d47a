#!/usr/bin/env bash
# Bad inputs of issue 10, items 3 and 4: errors that one rank sees end the whole job within
# seconds, and checkpoint history is never destroyed without --overwrite. Each bad case asserts a
# non-zero exit, no hang or crash, the message naming the flag/file, and the checkpoint
# directories it watches unchanged byte for byte (bad_input_lib.sh). Positive cases check that
# --overwrite works, that stale temporaries are removed, and that training runs killed (-9) at
# random moments always leave a `latest` that --resume loads.
# usage: test_bad_input_checkpoints.sh MESHTRAIN_BINARY [MPIRUN PLANS_DIR]
set -u
BIN=$1
MPIRUN=${2:-}
PLANS=${3:-}
source "$(dirname "$0")/bad_input_lib.sh"
# A job ended by the collective deadline would not be "within seconds": make that deadline long.
export MT_COLLECTIVE_TIMEOUT_S=120
T=(train --batch 2 --seq 32 --warmup 1 --metrics "")
ls_temps() { find "$1" -maxdepth 1 \( -name '*.tmp.*' -o -name '*.old.*' \) | sort; }

# ---- fixtures: a checkpoint dir with step-2, step-4 and latest -> step-4; an HF checkpoint -----
"$BIN" "${T[@]}" --steps 4 --checkpoint-every 2 --checkpoint-dir "$WORK/ck" >/dev/null 2>&1 \
  && [ "$(cat "$WORK/ck/latest")" = step-00000004 ] || { echo "FAIL - fixture training run"; exit 1; }
"$BIN" init --config llama-tiny --out "$WORK/hf" >/dev/null || { echo "FAIL - fixture init"; exit 1; }
printf '1,2,3,4,5\n6,7,8,9,10\n' >"$WORK/tokens.txt"
touch "$WORK/afile"
copy_ck() { rm -rf "$WORK/$1"; cp -a "$WORK/ck" "$WORK/$1"; }

# ---- output paths, checked at start-up ---------------------------------------------------------
bad_case "checkpoint-dir names a file" --watch "$WORK/ck" "--checkpoint-dir $WORK/afile" "not a directory" -- \
  "$BIN" "${T[@]}" --steps 2 --checkpoint-dir "$WORK/afile"
bad_case "checkpoint-dir under a file" "--checkpoint-dir $WORK/afile/sub" "$WORK/afile is not a directory" -- \
  "$BIN" "${T[@]}" --steps 2 --checkpoint-dir "$WORK/afile/sub"
bad_case "checkpoint-dir in /proc" "--checkpoint-dir /proc/mt_ck" "cannot create files" -- \
  "$BIN" "${T[@]}" --steps 2 --checkpoint-dir /proc/mt_ck
bad_case "metrics in a missing directory" "--metrics /nonexistent_ro/m.jsonl" "does not exist" -- \
  "$BIN" "${T[@]}" --steps 2 --metrics /nonexistent_ro/m.jsonl
bad_case "metrics names a directory" --watch "$WORK/ck" "--metrics $WORK/ck" "is a directory" -- \
  "$BIN" "${T[@]}" --steps 2 --metrics "$WORK/ck"
bad_case "metrics in /proc" "--metrics /proc/m.jsonl" "cannot create files" -- \
  "$BIN" "${T[@]}" --steps 2 --metrics /proc/m.jsonl
bad_case "grad --out names a directory" --watch "$WORK/hf" "--out $WORK/hf" "is a directory" -- \
  "$BIN" grad --hf "$WORK/hf" --tokens "$WORK/tokens.txt" --out "$WORK/hf"
bad_case "init --out names a file" "--out $WORK/afile" "not a directory" -- \
  "$BIN" init --config llama-tiny --out "$WORK/afile"
# An output that is one of the command's inputs would destroy it (grad's gradients over the
# checkpoint's weights, the metrics over the token file): refused, naming both flags.
"$BIN" grad --hf "$WORK/hf" --tokens "$WORK/tokens.txt" --out "$WORK/g.safetensors" >/dev/null 2>&1
cp "$WORK/tokens.txt" "$WORK/tok_copy.txt"
bad_case "grad --out over the checkpoint's weights" --watch "$WORK/hf" "--out $WORK/hf/model.safetensors" \
  "is a checkpoint file of --hf $WORK/hf" "would destroy the input" -- \
  "$BIN" grad --hf "$WORK/hf" --tokens "$WORK/tokens.txt" --out "$WORK/hf/model.safetensors"
bad_case "grad --out over --tokens (another spelling)" --watch "$WORK/tok_copy.txt" "is the same file as --tokens" -- \
  "$BIN" grad --hf "$WORK/hf" --tokens "$WORK/tok_copy.txt" --out "$WORK/./tok_copy.txt"
bad_case "train --metrics over --data" --watch "$WORK/g.safetensors" "--metrics $WORK/g.safetensors" \
  "is the same file as --data" -- "$BIN" "${T[@]}" --steps 1 --data "$WORK/g.safetensors" --metrics "$WORK/g.safetensors"
# The checkpoint directory's `latest` and the files of its step directories are its inputs too (a
# metrics line appended to `latest` made the directory unresumable).
bad_case "train --metrics over the checkpoint's latest" --watch "$WORK/ck" "--metrics $WORK/ck/latest" \
  "is a checkpoint file of --checkpoint-dir" -- "$BIN" "${T[@]}" --steps 6 --resume --checkpoint-dir "$WORK/ck" \
  --metrics "$WORK/ck/latest"
# A fresh run too: its final save would rename `latest` over the metrics file.
mkdir -p "$WORK/fresh_ck"
bad_case "train --metrics as a fresh checkpoint directory's latest" --watch "$WORK/fresh_ck" \
  "--metrics $WORK/fresh_ck/latest" "is a checkpoint file of --checkpoint-dir" -- "$BIN" "${T[@]}" --steps 2 \
  --checkpoint-dir "$WORK/fresh_ck" --metrics "$WORK/fresh_ck/latest"
bad_case "train --profile into a step directory" --watch "$WORK/ck" "--profile $WORK/ck/step-00000004/trainer_state.json" \
  "is a checkpoint file of --checkpoint-dir" -- "$BIN" "${T[@]}" --steps 6 --resume --checkpoint-dir "$WORK/ck" \
  --profile "$WORK/ck/step-00000004/trainer_state.json"
# --metrics and --profile naming one file in two spellings (the trace replaced the metrics, exit 0,
# until 2026-12-07): refused, the existing metrics file untouched.
mkdir -p "$WORK/mp" && echo '{"step": 1}' > "$WORK/mp/m.jsonl"
bad_case "train --metrics and --profile the same file" --watch "$WORK/mp" "are the same file" -- \
  "$BIN" train --batch 2 --seq 32 --warmup 1 --steps 1 --metrics "$WORK/mp/m.jsonl" --profile "$WORK/mp/../mp/./m.jsonl"
cp "$WORK/g.safetensors" "$WORK/g2.safetensors"
bad_case "compare --json over B" --watch "$WORK/g2.safetensors" "--json" "is the same file as B" -- \
  "$BIN" compare "$WORK/g.safetensors" "$WORK/g2.safetensors" --json "$WORK/g2.safetensors"
# A --json that cannot be written is "no verdict" (exit 2) with no verdict printed; a device is
# written in place, never replaced by a renamed file (as root, that replaced /dev/full itself).
"$BIN" compare "$WORK/g.safetensors" "$WORK/g2.safetensors" --json /dev/full >"$WORK/out" 2>"$WORK/err"; rc=$?
[ $rc -eq 2 ] && ! grep -q "PASS" "$WORK/out" && grep -q -- "--json" "$WORK/err" && [ -c /dev/full ] \
  && pass "compare --json /dev/full: exit 2, no verdict printed, /dev/full still a device" \
  || fail "compare --json /dev/full: exit $rc, $(cat "$WORK/out" "$WORK/err" | tail -n 2)"
"$BIN" compare "$WORK/g.safetensors" "$WORK/g2.safetensors" --json /dev/null >/dev/null 2>&1 && [ -c /dev/null ] \
  && pass "compare --json /dev/null: exit 0, /dev/null still a device" || fail "compare --json /dev/null"
# A link is followed (the file it names is replaced, the link stays); /dev/stdout appended to a file
# by the shell is written in place, after what the file held.
echo old >"$WORK/real.json" && ln -sf "$WORK/real.json" "$WORK/link.json"
"$BIN" compare "$WORK/g.safetensors" "$WORK/g2.safetensors" --json "$WORK/link.json" >/dev/null 2>&1 \
  && [ -L "$WORK/link.json" ] && grep -q '"pass": true' "$WORK/real.json" \
  && pass "compare --json LINK: the linked file written, the link kept" || fail "compare --json through a link"
echo before >"$WORK/appended.txt"
"$BIN" compare "$WORK/g.safetensors" "$WORK/g2.safetensors" --json /dev/stdout >>"$WORK/appended.txt" 2>/dev/null \
  && [ -c /dev/null ] && [ "$(head -n 1 "$WORK/appended.txt")" = before ] && grep -q '"pass": true' "$WORK/appended.txt" \
  && pass "compare --json /dev/stdout >> FILE: appended in place" || fail "--json /dev/stdout >>: $(head -n 3 "$WORK/appended.txt")"
# ... and with `>`: the JSON goes through the process's own stdout, in order with the table (the
# two descriptors' offsets overwrote each other's text until 2026-12-08).
"$BIN" compare "$WORK/g.safetensors" "$WORK/g2.safetensors" --json /dev/stdout >"$WORK/truncated.txt" 2>/dev/null
python3 - "$WORK/truncated.txt" <<'PY' && pass "compare --json /dev/stdout > FILE: the table, then the whole JSON report" \
  || fail "--json /dev/stdout >: $(head -c 300 "$WORK/truncated.txt")"
import json, sys
text = open(sys.argv[1]).read()
start = text.index("{")
report, end = json.JSONDecoder().raw_decode(text[start:])
assert report["pass"] and report["tensors"], report
assert "PASS" in text[:start] + text[start + end:], text[-300:]
PY
# A link whose file is a checkpoint directory's is that file: refused as the file would be (grad's
# gradients replaced the weights of --hf through such a link until 2026-12-08), also a link to a
# file not written yet (the fresh run's `latest`).
ln -sf "$WORK/hf/model.safetensors" "$WORK/weights_link.safetensors"
bad_case "grad --out a link to the checkpoint's weights" --watch "$WORK/hf" "--out $WORK/weights_link.safetensors" \
  "is a checkpoint file of --hf $WORK/hf" -- \
  "$BIN" grad --hf "$WORK/hf" --tokens "$WORK/tokens.txt" --out "$WORK/weights_link.safetensors"
ln -sf "$WORK/fresh_ck/latest" "$WORK/latest_link.jsonl"
bad_case "train --metrics a link to a fresh checkpoint directory's latest" --watch "$WORK/fresh_ck" \
  "is a checkpoint file of --checkpoint-dir" -- "$BIN" "${T[@]}" --steps 2 --checkpoint-dir "$WORK/fresh_ck" \
  --metrics "$WORK/latest_link.jsonl"
bad_case "plan --calibrate --out in a missing directory: refused before measuring" "--out /nonexistent_ro/hw.json" \
  "does not exist" -- "$BIN" plan --calibrate --out /nonexistent_ro/hw.json
bad_case "--val-batches x --batch x --seq past 2^63" "--val-batches 1099511627776 x --batch 8388608 x --seq 2" -- \
  "$BIN" "${T[@]}" --steps 1 --batch 8388608 --seq 2 --val-data "$WORK/g.safetensors" --val-batches 1099511627776
bad_case "train --hf with --config" "give --config or --hf, not both" -- \
  "$BIN" "${T[@]}" --steps 1 --hf "$WORK/hf" --config mixtral-tiny
bad_case "eval --out (eval writes nothing)" "--out" -- \
  "$BIN" eval --hf "$WORK/hf" --tokens "$WORK/tokens.txt" --out "$WORK/never.safetensors"
[ ! -e "$WORK/never.safetensors" ] || fail "eval --out wrote a file"

# ---- history: nothing this run did not write is replaced without --overwrite --------------------
bad_case "resume with --steps below the checkpoint" --watch "$WORK/ck" "step-00000004 is at step 4" \
  "would stop at step 3" "nothing to train" -- "$BIN" "${T[@]}" --steps 3 --resume --checkpoint-dir "$WORK/ck"
bad_case "resume with --steps equal to the checkpoint" --watch "$WORK/ck" "is at step 4" "nothing to train" -- \
  "$BIN" "${T[@]}" --steps 4 --resume --checkpoint-dir "$WORK/ck"
bad_case "resume with --stop-at at the checkpoint" --watch "$WORK/ck" "would stop at step 4" -- \
  "$BIN" "${T[@]}" --steps 10 --stop-at 4 --resume --checkpoint-dir "$WORK/ck"
bad_case "resume --overwrite with nothing to train" --watch "$WORK/ck" "nothing to train" -- \
  "$BIN" "${T[@]}" --steps 2 --resume --overwrite --checkpoint-dir "$WORK/ck"
bad_case "fresh run into a checkpoint dir" --watch "$WORK/ck" "--checkpoint-dir $WORK/ck already holds checkpoints" \
  "--overwrite" -- "$BIN" "${T[@]}" --steps 4 --checkpoint-dir "$WORK/ck"
bad_case "resume with other settings" --watch "$WORK/ck" "--resume: this run's settings differ" \
  "--lr 1 (the checkpoint's: 3e-3)" "--dropout 0.3 (the checkpoint's: 0)" "--allow-changes" -- \
  "$BIN" "${T[@]}" --steps 6 --resume --checkpoint-dir "$WORK/ck" --lr 1 --dropout 0.3
copy_ck longset
python3 -c 'import json,sys; p=sys.argv[1]; j=json.load(open(p)); j["settings"]["lr"]="x"*100000; json.dump(j,open(p,"w"))' \
  "$WORK/longset/step-00000004/trainer_state.json"
bad_case "resume: a hostile recorded setting is cut short in the message" --watch "$WORK/longset" \
  "--lr 3e-3 (the checkpoint's: xxxxxxxxxx" "...)" -- "$BIN" "${T[@]}" --steps 6 --resume --checkpoint-dir "$WORK/longset"
[ "$(wc -c <"$WORK/case.err")" -lt 2000 ] && pass "  ... in under 2000 bytes of stderr" \
  || fail "a 100,000-character setting gave $(wc -c <"$WORK/case.err") bytes of stderr"
bad_case "resume with --config of another model" --watch "$WORK/ck" "--resume: --config mixtral-tiny is mixtral" \
  "holds llama with 4 layers" -- "$BIN" "${T[@]}" --steps 6 --resume --checkpoint-dir "$WORK/ck" --config mixtral-tiny
# The same shapes but another computation (RoPE base, the norm's eps): the run went on with the
# checkpoint's config and dropped --config without a word until 2026-12-07.
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); j["rope_theta"]=500000.0; j["rms_norm_eps"]=1e-6; json.dump(j,open(sys.argv[2],"w"))' \
  "$WORK/ck/step-00000004/config.json" "$WORK/rope.json"
bad_case "resume with --config of the same shapes, another RoPE and eps" --watch "$WORK/ck" \
  "--config $WORK/rope.json differs from the model" "rms_norm_eps 1e-06 (the checkpoint's: 1e-05)" \
  "rope_theta 500000 (the checkpoint's: 10000)" -- \
  "$BIN" "${T[@]}" --steps 6 --resume --checkpoint-dir "$WORK/ck" --config "$WORK/rope.json"
# --accum-dtype changes a bf16 run's gradient sums over micro-batches: a setting like --lr (it was
# not recorded until 2026-12-07, and a resume with the other dtype diverged silently).
"$BIN" "${T[@]}" --steps 2 --precision bf16 --accum 2 --checkpoint-dir "$WORK/bf16" >/dev/null 2>&1 \
  || fail "fixture: bf16 --accum 2 run"
bad_case "resume a bf16 --accum 2 run with another --accum-dtype" --watch "$WORK/bf16" \
  "--accum-dtype bf16 (the checkpoint's: f32)" "--allow-changes" -- \
  "$BIN" "${T[@]}" --steps 4 --precision bf16 --accum 2 --accum-dtype bf16 --resume --checkpoint-dir "$WORK/bf16"
python3 -c 'import struct,sys; open(sys.argv[1],"wb").write(struct.pack("<256i",20240520,1,300,*([0]*253))+struct.pack("<300H",*(i % 256 for i in range(300))))' \
  "$WORK/other.bin"
bad_case "resume on other data" --watch "$WORK/ck" "--data $WORK/other.bin (" "the checkpoint's: the embedded corpus" -- \
  "$BIN" "${T[@]}" --steps 6 --resume --checkpoint-dir "$WORK/ck" --data "$WORK/other.bin"
# Non-finite moments in a checkpoint (written before saves checked them, by an f32 overflow): every
# step trained and every save was refused, pointing back at this checkpoint. Refused at the resume.
copy_ck infstate
python3 - "$WORK/infstate/step-00000004/optimizer.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
h["__metadata__"].pop("mt.crc32", None)  # edited by hand: no CRC to check
lo = h["exp_avg_sq.model.layers.0.mlp.up_proj.weight"]["data_offsets"][0]
b[8 + n + lo + 20:8 + n + lo + 24] = struct.pack("<f", float("inf"))
hj = json.dumps(h, separators=(",", ":")).encode(); hj += b" " * (n - len(hj))
assert len(hj) == n
open(p, "wb").write(bytes(b[:8]) + hj + bytes(b[8 + n:]))
PY
bad_case "resume from non-finite optimizer state" --watch "$WORK/infstate" "--resume: $WORK/infstate/step-00000004:" \
  "optimizer state 'exp_avg_sq.model.layers.0.mlp.up_proj.weight' (element 5: inf)" "resume from an earlier step directory" -- \
  "$BIN" "${T[@]}" --steps 6 --resume --checkpoint-dir "$WORK/infstate"
copy_ck changes
"$BIN" "${T[@]}" --steps 6 --resume --checkpoint-dir "$WORK/changes" --lr 0.003 --lr 1e-3 --allow-changes \
  >"$WORK/out" 2>"$WORK/err" \
  && grep -q "resuming with changed settings (--allow-changes): --lr 1e-3 (the checkpoint's: 3e-3)" "$WORK/out" \
  && grep -q "the learning-rate schedule now spans 6 steps (the checkpoint's run: 4)" "$WORK/out" \
  && grep -q '"lr": "1e-3"' "$WORK/changes/step-00000006/trainer_state.json" \
  && pass "--allow-changes: the change is printed, trained with and recorded" || fail "--allow-changes: $(tail -n 2 "$WORK/err")"
copy_ck back; echo step-00000002 >"$WORK/back/latest"  # a save killed after its rename, before `latest`
bad_case "resume would rewrite an existing later step" --watch "$WORK/back" "$WORK/back/step-00000004 already exists" \
  "--overwrite" -- "$BIN" "${T[@]}" --steps 4 --resume --checkpoint-dir "$WORK/back"
bad_case "init --out onto a checkpoint" --watch "$WORK/hf" "--out $WORK/hf: already holds a checkpoint" -- \
  "$BIN" init --config llama-tiny --seed 9 --out "$WORK/hf"

# ---- invalid latest / trainer state: the error names the right file ------------------------------
copy_ck empty; : >"$WORK/empty/latest"
bad_case "empty latest" --watch "$WORK/empty" "$WORK/empty/latest: the file is empty" -- \
  "$BIN" "${T[@]}" --steps 6 --resume --checkpoint-dir "$WORK/empty"
copy_ck garbage; echo "../../etc" >"$WORK/garbage/latest"
bad_case "latest names no step directory" --watch "$WORK/garbage" "$WORK/garbage/latest: '../../etc' is not a step" -- \
  "$BIN" "${T[@]}" --steps 6 --resume --checkpoint-dir "$WORK/garbage"
copy_ck missing; echo step-00000009 >"$WORK/missing/latest"
bad_case "latest names a missing step" --watch "$WORK/missing" "$WORK/missing/latest: names" "does not exist" -- \
  "$BIN" "${T[@]}" --steps 12 --resume --checkpoint-dir "$WORK/missing"
copy_ck ldir; rm "$WORK/ldir/latest"; mkdir "$WORK/ldir/latest"
bad_case "latest is a directory" --watch "$WORK/ldir" "$WORK/ldir/latest is not a regular file" -- \
  "$BIN" "${T[@]}" --steps 6 --resume --checkpoint-dir "$WORK/ldir"
copy_ck lloop; rm "$WORK/lloop/latest"; ln -s latest "$WORK/lloop/latest"
bad_case "latest is a symbolic link loop" --watch "$WORK/lloop" "$WORK/lloop/latest is a symbolic link that does not resolve" -- \
  "$BIN" "${T[@]}" --steps 6 --resume --checkpoint-dir "$WORK/lloop"
set_state() {  # DIR KEY JSON_VALUE: edits step-4's trainer_state.json
  python3 -c 'import json,sys; p=sys.argv[1]; j=json.load(open(p)); j[sys.argv[2]]=json.loads(sys.argv[3]); json.dump(j,open(p,"w"))' \
    "$WORK/$1/step-00000004/trainer_state.json" "$2" "$3"
}
copy_ck neg; set_state neg step -3
bad_case "negative step" --watch "$WORK/neg" "$WORK/neg/step-00000004/trainer_state.json: field 'step' must be an integer >= 1, got -3" -- \
  "$BIN" "${T[@]}" --steps 6 --resume --checkpoint-dir "$WORK/neg"
copy_ck other; set_state other step 7
bad_case "step differs from its directory" --watch "$WORK/other" "trainer_state.json: field 'step' is 7 but the directory is step-00000004" -- \
  "$BIN" "${T[@]}" --steps 9 --resume --checkpoint-dir "$WORK/other"
copy_ck strstep; set_state strstep step '"4"'
bad_case "step not an integer" --watch "$WORK/strstep" "trainer_state.json: field 'step' must be an integer" -- \
  "$BIN" "${T[@]}" --steps 6 --resume --checkpoint-dir "$WORK/strstep"
copy_ck negpos; set_state negpos data_position -1
bad_case "negative data position" --watch "$WORK/negpos" "trainer_state.json: field 'data_position' must be an integer >= 0" -- \
  "$BIN" "${T[@]}" --steps 6 --resume --checkpoint-dir "$WORK/negpos"
copy_ck bigpos; set_state bigpos data_position 9223372036854775807  # used to overflow into a read before the data
bad_case "data position past the data" --watch "$WORK/bigpos" \
  "trainer_state.json: field 'data_position' 9223372036854775807 does not fit the data (the embedded corpus)" -- \
  "$BIN" "${T[@]}" --steps 6 --resume --checkpoint-dir "$WORK/bigpos"
copy_ck noseed; python3 -c 'import json,sys; p=sys.argv[1]; j=json.load(open(p)); del j["seed"]; json.dump(j,open(p,"w"))' \
  "$WORK/noseed/step-00000004/trainer_state.json"
bad_case "missing seed" --watch "$WORK/noseed" "trainer_state.json: field 'seed' is missing" -- \
  "$BIN" "${T[@]}" --steps 6 --resume --checkpoint-dir "$WORK/noseed"
copy_ck noweights; rm "$WORK/noweights/step-00000004/model.safetensors"
bad_case "step directory without its weights" --watch "$WORK/noweights" \
  "$WORK/noweights/step-00000004 holds neither index.json" "the step directory is incomplete" -- \
  "$BIN" "${T[@]}" --steps 6 --resume --checkpoint-dir "$WORK/noweights"

# ---- under mpirun: an error on one rank ends every rank within seconds ---------------------------
if [ -n "$MPIRUN" ]; then
  MP=("$MPIRUN" --oversubscribe --mca btl self,vader)
  P=(--batch 2 --seq 32 --steps 2 --plan "$PLANS/llama_dp.plan")
  bad_case "np 2: metrics in a missing directory" --mpi --timeout 30 "[rank 0/2] error: --metrics /nonexistent_ro/m.jsonl" -- \
    "${MP[@]}" -np 2 "$BIN" train "${P[@]}" --metrics /nonexistent_ro/m.jsonl
  bad_case "np 2: checkpoint-dir names a file" --mpi --timeout 30 --watch "$WORK/ck" "--checkpoint-dir $WORK/afile" -- \
    "${MP[@]}" -np 2 "$BIN" train "${P[@]}" --metrics "" --checkpoint-dir "$WORK/afile"
  bad_case "np 2: fresh run into a checkpoint dir" --mpi --timeout 30 --watch "$WORK/ck" "already holds checkpoints" -- \
    "${MP[@]}" -np 2 "$BIN" train "${P[@]}" --metrics "" --checkpoint-dir "$WORK/ck"
  # Different flags per rank (MPMD): the error exists on one rank only; the peer goes on into
  # communicator creation and collectives, and must be ended by the failing rank's MPI_Abort.
  bad_case "np 2: metrics error on rank 0 only" --mpi --timeout 30 "[rank 0/2] error: --metrics /nonexistent_ro/m.jsonl" -- \
    "${MP[@]}" -np 1 "$BIN" train "${P[@]}" --metrics /nonexistent_ro/m.jsonl : -np 1 "$BIN" train "${P[@]}" --metrics ""
  bad_case "np 2: checkpoint-dir error on rank 1 only" --mpi --timeout 30 "[rank 1/2] error: --checkpoint-dir $WORK/afile" -- \
    "${MP[@]}" -np 1 "$BIN" train "${P[@]}" --metrics "" : -np 1 "$BIN" train "${P[@]}" --metrics "" --checkpoint-dir "$WORK/afile"
  # After the world started (the token file is read after parallelize): the failing rank aborts.
  bad_case "np 2: data error on rank 0 only, world started" --mpi --timeout 30 "[rank 0/2] error:" "/nonexistent.bin" -- \
    "${MP[@]}" -np 1 "$BIN" train "${P[@]}" --metrics "" --data /nonexistent.bin : -np 1 "$BIN" train "${P[@]}" --metrics ""
  bad_case "np 2: data error on rank 1 only, world started" --mpi --timeout 30 "[rank 1/2] error:" "/nonexistent.bin" -- \
    "${MP[@]}" -np 1 "$BIN" train "${P[@]}" --metrics "" : -np 1 "$BIN" train "${P[@]}" --metrics "" --data /nonexistent.bin
  bad_case "np 2: init --out onto a checkpoint on rank 0 only" --mpi --timeout 30 --watch "$WORK/hf" "already holds a checkpoint" -- \
    "${MP[@]}" -np 1 "$BIN" init --config llama-tiny --out "$WORK/hf" --plan "$PLANS/llama_dp.plan" : \
    -np 1 "$BIN" init --config llama-tiny --out "$WORK/hf_other" --plan "$PLANS/llama_dp.plan"
fi

# ---- one run per checkpoint directory: a second run is refused while the first holds the lock ----
"$BIN" "${T[@]}" --steps 100000 --log-every 100000 --checkpoint-dir "$WORK/locked" >/dev/null 2>&1 &
holder=$!
for _ in $(seq 1 200); do grep -q "process $holder " "$WORK/locked/.meshtrain.lock" 2>/dev/null && break; sleep 0.05; done
bad_case "a second run in a directory in use" --watch "$WORK/locked" "--checkpoint-dir $WORK/locked is in use" \
  "process $holder on" "$WORK/locked/.meshtrain.lock" -- "$BIN" "${T[@]}" --steps 2 --overwrite --checkpoint-dir "$WORK/locked"
kill -9 "$holder" 2>/dev/null; wait "$holder" 2>/dev/null
"$BIN" "${T[@]}" --steps 2 --checkpoint-dir "$WORK/locked" >/dev/null 2>"$WORK/err" \
  && pass "the lock ends with its process (kill -9): the next run takes the directory" \
  || fail "after the holder died: $(tail -n 1 "$WORK/err")"

# ---- positive: --overwrite, stale temporaries, kill -9 at random moments ------------------------
copy_ck ow
"$BIN" "${T[@]}" --steps 4 --seed 7 --overwrite --checkpoint-dir "$WORK/ow" >/dev/null 2>"$WORK/err" \
  && ! cmp -s "$WORK/ck/step-00000004/model.safetensors" "$WORK/ow/step-00000004/model.safetensors" \
  && [ "$(cat "$WORK/ow/latest")" = step-00000004 ] && [ -z "$(ls_temps "$WORK/ow")" ] \
  && pass "fresh run --overwrite replaces step-4 in place, no temporaries left" || fail "--overwrite: $(tail -n 1 "$WORK/err")"
"$BIN" "${T[@]}" --steps 6 --resume --checkpoint-dir "$WORK/ow" >"$WORK/out" 2>"$WORK/err" \
  && grep -q "resumed from $WORK/ow/step-00000004 at step 4" "$WORK/out" && [ "$(cat "$WORK/ow/latest")" = step-00000006 ] \
  && pass "the replaced checkpoint resumes" || fail "resume after --overwrite: $(tail -n 1 "$WORK/err")"
# A run stopped between committing its first step directory and writing `latest` (a full disk): the
# newest step directory, complete by construction, is resumed, with a notice.
copy_ck nolatest; rm "$WORK/nolatest/latest"
"$BIN" "${T[@]}" --steps 6 --resume --checkpoint-dir "$WORK/nolatest" >"$WORK/out" 2>"$WORK/err" \
  && grep -q "resumed from $WORK/nolatest/step-00000004 at step 4" "$WORK/out" && [ "$(grep -c "notice: .*latest does not exist" "$WORK/err")" = 1 ] \
  && [ "$(cat "$WORK/nolatest/latest")" = step-00000006 ] \
  && pass "no latest: resumed from the newest step directory, with a notice" || fail "resume without latest: $(tail -n 1 "$WORK/err")"
"$BIN" "${T[@]}" --steps 4 --resume --overwrite --checkpoint-dir "$WORK/back" >/dev/null 2>"$WORK/err" \
  && cmp -s "$WORK/ck/step-00000004/model.safetensors" "$WORK/back/step-00000004/model.safetensors" \
  && [ "$(cat "$WORK/back/latest")" = step-00000004 ] \
  && pass "resume --overwrite rewrites the uncommitted step-4 with the same bits" || fail "resume --overwrite: $(tail -n 1 "$WORK/err")"
"$BIN" init --config llama-tiny --seed 9 --out "$WORK/hf" --overwrite >/dev/null 2>"$WORK/err" \
  && "$BIN" init --config llama-tiny --seed 9 --out "$WORK/hf9" >/dev/null && cmp -s "$WORK/hf/model.safetensors" "$WORK/hf9/model.safetensors" \
  && pass "init --overwrite replaces the checkpoint" || fail "init --overwrite: $(tail -n 1 "$WORK/err")"

# --keep prunes only this run's lineage: a fresh --overwrite run leaves another run's step
# directories alone (it removed them, and its own newer steps, before 2026-11-28); a resumed run
# prunes the steps it resumed from too.
copy_ck keepo; mkdir "$WORK/keepo/step-00000100"; echo other >"$WORK/keepo/step-00000100/notes"
"$BIN" "${T[@]}" --steps 3 --checkpoint-every 1 --keep 2 --overwrite --checkpoint-dir "$WORK/keepo" >/dev/null 2>"$WORK/err"
got=$(ls "$WORK/keepo" | tr '\n' ' ')
[ "$got" = "latest step-00000002 step-00000003 step-00000004 step-00000100 " ] && [ "$(cat "$WORK/keepo/latest")" = step-00000003 ] \
  && pass "--keep 2 --overwrite: this run's newest two kept, another run's step-4 and step-100 left: $got" \
  || fail "--keep with --overwrite left: $got $(tail -n 1 "$WORK/err")"
copy_ck keepr
"$BIN" "${T[@]}" --steps 6 --checkpoint-every 1 --keep 2 --resume --checkpoint-dir "$WORK/keepr" >/dev/null 2>"$WORK/err"
got=$(ls "$WORK/keepr" | tr '\n' ' ')
[ "$got" = "latest step-00000005 step-00000006 " ] && pass "--keep 2 on a resumed run prunes the steps it resumed from: $got" \
  || fail "--keep on a resumed run left: $got $(tail -n 1 "$WORK/err")"

# A run that died after its last checkpoint left metrics lines of steps it trains again on resume:
# they are dropped, so every step appears once (steps 7 and 8 used to appear twice).
"$BIN" train --batch 2 --seq 32 --warmup 1 --steps 8 --checkpoint-every 3 --checkpoint-dir "$WORK/met" \
  --metrics "$WORK/met.jsonl" >/dev/null 2>&1
# rewind_met: as if killed before saving step 8 (step 6 is the latest). resume_met: resume to step
# 8; $got is the metrics file's steps.
rewind_met() { rm -rf "$WORK/met/step-00000008"; echo step-00000006 >"$WORK/met/latest"; }
resume_met() {
  "$BIN" train --batch 2 --seq 32 --warmup 1 --steps 8 --resume --checkpoint-dir "$WORK/met" --metrics "$WORK/met.jsonl" \
    >"$WORK/out" 2>"$WORK/err"
  got=$(python3 -c 'import json,sys; print(" ".join(str(json.loads(l)["step"]) for l in open(sys.argv[1])))' "$WORK/met.jsonl" 2>&1)
}
rewind_met
resume_met
[ "$got" = "1 2 3 4 5 6 7 8" ] && grep -q "dropped 2 line(s) of steps after 6" "$WORK/out" \
  && pass "resume after a crash past the last checkpoint: metrics steps $got, each once" \
  || fail "metrics after resume: steps '$got' $(tail -n 1 "$WORK/err")"
# A full disk cut the last line mid-write: it is dropped, not glued to the resumed run's first line.
rewind_met
python3 - "$WORK/met.jsonl" <<'PY'
import sys
lines = open(sys.argv[1]).read().splitlines(True)
open(sys.argv[1], "w").write("".join(lines[:7]) + lines[7][:25])  # step 8's line cut after 25 bytes
PY
resume_met
[ "$got" = "1 2 3 4 5 6 7 8" ] && grep -q "met.jsonl: dropped 1 line(s) of steps after 6 .*; dropped its last line, cut short" "$WORK/out" \
  && pass "resume after a cut metrics line: steps $got, each once, valid JSON lines" \
  || fail "metrics after a cut line: '$got' $(grep met.jsonl "$WORK/out") $(tail -n 1 "$WORK/err")"
# The last line lost its newline and is a step after the checkpoint's: dropped as such, and the
# notice says only that.
rewind_met
python3 -c 'import sys; p=sys.argv[1]; t=open(p).read(); open(p,"w").write(t.rstrip("\n"))' "$WORK/met.jsonl"
resume_met
[ "$got" = "1 2 3 4 5 6 7 8" ] && [ "$(grep met.jsonl "$WORK/out")" = "--metrics $WORK/met.jsonl: dropped 2 line(s) of steps after 6 (written by a run that went on past its last checkpoint)" ] \
  && pass "resume after a lost newline on a dropped step: steps $got, one notice of the dropped lines" \
  || fail "metrics, lost newline on a dropped step: '$got' $(grep met.jsonl "$WORK/out") $(tail -n 1 "$WORK/err")"
# Only the newline was lost, after the checkpoint's own step: the line is kept and ended, and the
# notice says only that.
rewind_met
python3 - "$WORK/met.jsonl" <<'PY'
import sys
lines = open(sys.argv[1]).read().splitlines(True)
open(sys.argv[1], "w").write("".join(lines[:6]).rstrip("\n"))
PY
resume_met
[ "$got" = "1 2 3 4 5 6 7 8" ] && [ "$(grep met.jsonl "$WORK/out")" = "--metrics $WORK/met.jsonl: ended its last line, whose newline a failed write had cut" ] \
  && pass "resume after a lost newline: steps $got, the line kept, one notice that says so" \
  || fail "metrics after a lost newline: '$got' $(grep met.jsonl "$WORK/out") $(tail -n 1 "$WORK/err")"

copy_ck stale
sleep 30 & live=$!
mkdir -p "$WORK/stale/step-00000005.tmp.999999999" "$WORK/stale/step-00000005.tmp.999999998.tmp.999999998" \
  "$WORK/stale/step-00000004.old.999999997" "$WORK/stale/step-00000005.tmp.$live"
touch "$WORK/stale/latest.tmp.999999999" "$WORK/stale/notes.tmp.999999999"
"$BIN" "${T[@]}" --steps 6 --resume --checkpoint-dir "$WORK/stale" >/dev/null 2>"$WORK/err" \
  && [ "$(ls_temps "$WORK/stale")" = "$(printf '%s\n%s' "$WORK/stale/notes.tmp.999999999" "$WORK/stale/step-00000005.tmp.$live")" ] \
  && pass "stale temporaries of dead processes removed at the next save (a live one and other files kept)" \
  || fail "stale temporaries: $(ls_temps "$WORK/stale" | tr '\n' ' ') $(tail -n 1 "$WORK/err")"
kill "$live" 2>/dev/null; wait "$live" 2>/dev/null

# kill -9 at random moments of a run that saves every step; each time, --resume must load `latest`.
K=(train --batch 2 --seq 32 --warmup 1 --metrics "" --steps 1000 --checkpoint-every 1 --checkpoint-dir "$WORK/kill")
"$BIN" "${K[@]}" --stop-at 1 >/dev/null 2>&1 || fail "kill -9: first run"
loaded=0 broken=0 midsave=0
for i in $(seq 1 10); do
  "$BIN" "${K[@]}" --resume --overwrite >/dev/null 2>&1 &
  pid=$!
  sleep "$(python3 -c 'import random; print(round(random.uniform(0.3, 2.0), 2))')"
  kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  [ -n "$(ls_temps "$WORK/kill")" ] && midsave=$((midsave + 1))  # killed in the middle of a save
  step=$(sed 's/step-0*//' "$WORK/kill/latest")
  if "$BIN" "${K[@]}" --resume --overwrite --stop-at $((step + 1)) >"$WORK/out" 2>"$WORK/err" \
      && grep -q "resumed from $WORK/kill/step-.* at step $step" "$WORK/out" && [ -z "$(ls_temps "$WORK/kill")" ]; then
    loaded=$((loaded + 1))
  else
    broken=$((broken + 1)); echo "   after kill $i: $(tail -n 1 "$WORK/err") $(ls_temps "$WORK/kill" | tr '\n' ' ')"
  fi
done
[ $broken -eq 0 ] && [ $loaded -eq 10 ] && pass "kill -9 at 10 random moments ($midsave in the middle of a save): --resume loaded latest every time" \
  || fail "kill -9: $loaded loads, $broken broken"

bad_input_done
