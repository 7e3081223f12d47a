#!/usr/bin/env bash
# `meshtrain train --profile` end to end (docs/profiler.md): llama-tiny for 2 steps writes a Chrome
# trace that parses, whose events carry name/ph/ts/dur, whose ops name their module (forward and
# backward), shapes, dtype, device, FLOPs and bytes, and whose op times sum to no more than each
# step's time; the table is printed; a bad path is refused naming the flag; bf16 ops say bf16; and
# under mpirun -np 2 with a plan each rank writes its trace with the gradient collectives.
# Usage: test_cli_profile.sh MESHTRAIN MPIRUN|"" REPO_ROOT
set -euo pipefail
bin=$1
mpirun=$2
root=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
export OMP_NUM_THREADS=1

"$bin" train --steps 2 --batch 2 --seq 32 --metrics "$tmp/m.jsonl" --profile "$tmp/trace.json" > "$tmp/out.txt" \
  || fail "train --profile failed: $(cat "$tmp/out.txt")"
grep -qE '^op \(kernel family\)' "$tmp/out.txt" || fail "no op table: $(cat "$tmp/out.txt")"
grep -qE '^matmul +[0-9]+ ' "$tmp/out.txt" || fail "no matmul row"
grep -qE '^model\.layers\.0\.' "$tmp/out.txt" || fail "no module row"
grep -qF "profile: trace written to $tmp/trace.json" "$tmp/out.txt" || fail "no trace line"

python3 - "$tmp/trace.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"]
assert ev, "no events"
for e in ev:
    for k in ("name", "ph", "ts", "dur", "pid", "tid", "cat"):
        assert k in e, f"event without {k}: {e}"
    assert e["dur"] >= 0 and e["ts"] >= 0, e
steps = [e for e in ev if e["cat"] == "region"]
assert [s["name"] for s in steps] == ["step 1", "step 2"], steps
ops = [e for e in ev if e["cat"] == "op"]
mods = {e["args"]["module"] for e in ops}
for m in ("model.embed_tokens", "model.layers.0.self_attn", "model.layers.1.mlp.down_proj", "lm_head"):
    assert m in mods, f"module {m} not in op events: {sorted(mods)[:20]}"
bwd = [e for e in ops if e["args"]["phase"] == "backward"]
assert any(e["args"]["module"].startswith("model.layers.0.") for e in bwd), "backward ops without their module"
assert {e["name"] for e in ev if e["cat"] == "module"} >= {"(root)", "model.layers.0", "lm_head"}
mm = [e for e in ops if e["name"] == "matmul"]
assert mm and all(e["args"]["flops"] > 0 and e["args"]["bytes"] > 0 for e in mm), "matmul without FLOPs/bytes"
assert all(e["args"]["dtype"] == "f32" and e["args"]["device"] == "cpu" for e in mm)
assert any(e["args"]["shapes"].startswith("[64,128] [128,") for e in mm)  # B*T rows, hidden 128, [e["args"]["shapes"] for e in mm[:5]]
assert any(e["name"] in ("adamw", "adamw_multi") for e in ops), "no optimizer ops"
for s in steps:
    inside = [e for e in ops if s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] + 1e-3]
    total = sum(e["dur"] for e in inside)
    assert inside and total <= s["dur"], f"{s['name']}: ops {total} us > step {s['dur']} us"
assert sum(e["dur"] for e in ops) <= sum(s["dur"] for s in steps)
PY

# bf16: the model's ops take bf16 operands (the CPU matmul itself widens them to f32: copies around it).
"$bin" train --steps 1 --batch 2 --seq 16 --precision bf16 --metrics "" --profile "$tmp/bf16.json" > /dev/null
python3 -c "
import json; ev = json.load(open('$tmp/bf16.json'))['traceEvents']
assert any(e['name'] == 'rms_norm' and e['args']['dtype'] == 'bf16' for e in ev if e['cat'] == 'op')"

# A path that cannot be written is refused before training, naming the flag.
if "$bin" train --steps 1 --metrics "" --profile "$tmp/no/such/dir/t.json" 2> "$tmp/err.txt"; then
  fail "unwritable --profile accepted"
fi
grep -qF -- "--profile" "$tmp/err.txt" || fail "error does not name --profile: $(cat "$tmp/err.txt")"

# Work between the steps (a validation loss) is in the trace but not in the tables, whose shares
# are of the steps' time (the op calls' share passed 100% until 2026-12-08).
python3 -c 'import struct, sys
t = [i % 200 for i in range(3000)]
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, len(t), *([0] * 253)) + struct.pack(f"<{len(t)}H", *t))' \
  "$tmp/val.bin"
"$bin" train --steps 2 --batch 2 --seq 16 --metrics "" --val-data "$tmp/val.bin" --val-every 1 --val-batches 20 \
  --profile "$tmp/val.json" > "$tmp/val.txt" || fail "--profile with --val-data failed"
python3 - "$tmp/val.txt" <<'PY' || fail "profile with validation: $(head -n 1 "$tmp/val.txt")"
import re, sys
line = next(l for l in open(sys.argv[1]) if l.startswith("profile: marked steps"))
share = float(re.search(r"\(([0-9.]+)%\)", line).group(1))
assert share <= 100, line
assert "between them left out" in line, line
PY

# Under a plan: every rank's trace, with the gradient all-reduces over dp.
if [ -n "$mpirun" ]; then
  "$mpirun" --oversubscribe -np 2 "$bin" train --plan "$root/plans/llama_dp.plan" --steps 1 --batch 2 --seq 16 \
    --metrics "" --profile "$tmp/dp.json" > "$tmp/dp.txt" || fail "--plan --profile failed: $(cat "$tmp/dp.txt")"
  for f in "$tmp/dp.json" "$tmp/dp.json.rank1"; do
    python3 - "$f" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
coll = [e for e in ev if e["cat"] == "collective"]
assert any(e["name"] == "all_reduce" and e["args"]["dims"] == "dp" and e["args"]["bytes"] > 0 for e in coll), \
    (sys.argv[1], coll[:3])
PY
  done
  # Rank 1's FILE.rank1 is checked at start-up like FILE: here it is the --data shard.
  cp "$tmp/val.bin" "$tmp/d.rank1"
  if "$mpirun" --oversubscribe -np 2 "$bin" train --plan "$root/plans/llama_dp.plan" --steps 1 --batch 2 --seq 16 \
      --metrics "" --data "$tmp/d.rank1" --profile "$tmp/d" > "$tmp/dr.txt" 2>&1; then
    fail "--profile whose rank-1 file is the --data shard accepted"
  fi
  grep -qF "rank 1's trace" "$tmp/dr.txt" && grep -qF "is the same file as --data" "$tmp/dr.txt" \
    || fail "rank-1 trace over --data: $(tail -n 2 "$tmp/dr.txt")"
  cmp -s "$tmp/val.bin" "$tmp/d.rank1" || fail "the --data shard was changed"
  # A device: rank 0 writes it in place, the others none (no /dev/null.rank1 is created).
  rm -f /dev/null.rank1 2>/dev/null || true
  "$mpirun" --oversubscribe -np 2 "$bin" train --plan "$root/plans/llama_dp.plan" --steps 1 --batch 2 --seq 16 \
    --metrics "" --profile /dev/null > "$tmp/dn.txt" 2>&1 || fail "--profile /dev/null under a plan: $(tail -n 2 "$tmp/dn.txt")"
  [ ! -e /dev/null.rank1 ] || fail "/dev/null.rank1 was created"
fi
echo "cli_profile: ok"
