# Shared by the CLI tests that run `meshtrain parity` under mpirun (test_parity_cli.sh,
# test_pipeline_cli.sh, test_cp_cli.sh); source it after setting BIN, MPIRUN and PLANS. It makes a scratch WORK dir,
# pass/fail counting, mpi, SMALL (the run's size flags), report_within, parity and expect_error.
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
# reductions round differently), verdict pass; prints the worst of each kind. Both kinds must be
# there (the later ones only in a report of more than one step), unless a 4th argument `reference`
# says the reference came from files, which hold only some of them (a gradient file: step 1; a
# checkpoint: the final weights).
report_within() {
  python3 - "$1" "$2" "$3" "${4:-}" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); tol, dtol = float(sys.argv[2]), float(sys.argv[3])
from_files = sys.argv[4] == "reference"
tight, loose = [], []
for s in r["steps"]:
    for k in ("loss_rel", "grad_norm_rel"):
        if s[k] is not None:
            (tight if k == "loss_rel" or s["step"] == 1 else loose).append((float(s[k]), f"step {s['step']} {k}"))
for p in r["parameters"]:
    if "grad_step1" in p: tight.append((float(p["grad_step1"]["rel"]), f"step-1 grad {p['name']}"))
    for k in ("weight", "grad"):
        if k in p: loose.append((float(p[k]["rel"]), f"{k} {p['name']}"))
if from_files:
    assert tight or loose, "nothing compared"
else:
    assert tight, "no step-1 figures compared"
    assert loose or len(r["steps"]) <= 1, f"no figures after step 1 in a report of {len(r['steps'])} steps"
ok, msg = r["verdict"] == "pass", []
for name, xs, t in (("tol", tight, tol), ("drift-tol", loose, dtol)):
    if xs:
        w = max(xs); ok = ok and w[0] <= t
        msg.append(f"{len(xs)} within {name} {t:g}, worst {w[0]:.2e} ({w[1]})")
print("; ".join(msg) + f"; {len(r['steps'])} steps")
sys.exit(0 if ok else 1)
PY
}

# parity PLAN NP STEPS ACCUM TOL DTOL [extra flags]
# Under the sanitizers (MT_SANITIZER_RUN=1, tests/meson.build) at most 5 steps, as test_parity
# does: they look for memory errors in code that every step runs alike, and 20 steps of pp x FSDP
# at np 4 took minutes under ASan. The tolerances, set for the drift of 20 steps, cover fewer.
parity() {
  local plan=$1 np=$2 steps=$3 accum=$4 tol=$5 dtol=$6; shift 6
  [ "${MT_SANITIZER_RUN:-0}" = 1 ] && [ "$steps" -gt 5 ] && steps=5
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
