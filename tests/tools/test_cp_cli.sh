#!/usr/bin/env bash
# Context parallelism through the real binary under real mpirun (docs/context_parallel.md):
#   plan:   `meshtrain plan` prints the cp split (ZS, each rank's positions for --seq);
#   parity: llama_cp at np 2 and 4 and llama_dp_cp_tp at np 4 ([dp=1, cp=2, tp=2]) against one
#           device, 20 steps, --dropout 0.1 (attention dropout inside the ring, residual dropout on
#           sequence shards): every loss, step 1's grad norm and gradients within 1e-5 relative;
#           weights and gradients after the 20 AdamW steps within 5e-3 (AdamW magnifies rounding);
#   bad input: --seq not divisible by 2 x cp (names --seq and the plan line), a cp dim the mesh
#           lacks (names the plan line), --estimate of a cp plan (refused naming the entry).
# MODE fast (suite cli/mpi, about 20 s) or slow (np 4 runs and llama_dp_cp_tp: suite slow).
# usage: test_cp_cli.sh MESHTRAIN_BINARY MPIRUN PLANS_DIR [fast|slow]
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
  printf 'mesh dp=*\nplace model <in>:0 dp=S(0) cp=ZS(1)\n' > "$WORK/nocp.plan"
  expect_error "a cp dim the mesh lacks" "nocp.plan:2:28" "'cp=ZS(1)' names no mesh dim" -- \
    "$BIN" plan --plan "$WORK/nocp.plan" --world 2
  expect_error "--estimate of a cp plan" "llama_cp.plan:8:1" "--estimate does not model context parallelism" -- \
    "$BIN" plan --plan "$PLANS/llama_cp.plan" --world 2 --estimate
else
  parity "$PLANS/llama_cp.plan" 4 20 1 1e-5 5e-3
  parity "$PLANS/llama_dp_cp_tp.plan" 4 20 1 1e-5 5e-3
  # Two micro-batches: the ring and its dropout offsets per micro-batch.
  parity "$PLANS/llama_cp.plan" 2 5 2 1e-5 5e-3
fi

[ $fails -eq 0 ] && echo "all passed" || echo "$fails failed"
exit $((fails > 0))
