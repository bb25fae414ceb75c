#!/usr/bin/env bash
# Measures a grid of pipeline layouts with `pipetrain bench`, then the layout `pipetrain plan`
# chooses, and prints both: the plan's measured samples/s against the best of the grid
# (goal >= 0.95) and its predicted samples/s against its measured (goal within 10%).
# For people, not CI: it takes minutes and its figures depend on the machine's load.
#
# Usage: scripts/plan-grid.sh [SUBJECT...]   SUBJECT = mlp | mlp-4 | cnn | gpt (default: all)
# Environment: PIPETRAIN (the binary, default build/pipetrain), REPEAT (runs per layout, medians;
# default 3), STEPS (timed steps per run, default 10), OUT (directory for the JSON lines).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${PIPETRAIN:-build/pipetrain}
REPEAT=${REPEAT:-3}
STEPS=${STEPS:-10}
OUT=${OUT:-$(mktemp -d /tmp/plan-grid.XXXXXX)}
mkdir -p "$OUT"
SUBJECTS=("$@")
[ ${#SUBJECTS[@]} -gt 0 ] || SUBJECTS=(mlp mlp-4 cnn gpt)

# The grid: "stages replicas schedule micro-batches" per line, by process count.
grid() {
  if [ "$1" = 4 ]; then
    printf '%s\n' "4 1 1f1b 8" "4 1 1f1b 16" "4 1 fill-drain 8" "4 1 zb-h1 8" "4 1 interleaved 8" "4 1 zb-v 8" \
      "2 2 1f1b 4" "2 2 1f1b 8" "2 2 zb-h1 8" "1 4 1f1b 1" "1 4 1f1b 2" "1 4 1f1b 4"
  else
    printf '%s\n' "2 1 1f1b 4" "2 1 1f1b 8" "2 1 1f1b 16" "2 1 fill-drain 8" "2 1 zb-h1 8" "2 1 zb-h1 16" \
      "2 1 interleaved 8" "2 1 zb-v 8" "1 2 1f1b 1" "1 2 1f1b 2" "1 2 1f1b 4" "1 2 1f1b 8"
  fi
}

subject_args() {
  case "$1" in
    mlp | mlp-4) echo "--workload $1" ;;
    *) echo "--example $1" ;;
  esac
}

json_field() { python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }

for s in "${SUBJECTS[@]}"; do
  args=$(subject_args "$s")
  procs=2
  [ "$s" = mlp-4 ] && procs=4
  echo "== $s: $procs processes, $REPEAT runs x $STEPS steps per layout (medians) =="
  best=0
  best_name=""
  while read -r st rep sched m; do
    line=$("$BIN" bench $args --stages "$st" --replicas "$rep" --schedule "$sched" --micro-batches "$m" \
      --steps "$STEPS" --repeat "$REPEAT" --skip-baseline --json 2>/dev/null | tail -1) || line=""
    if [ -z "$line" ]; then
      printf '  %-28s failed\n' "$st x $rep $sched M=$m"
      continue
    fi
    echo "$line" >>"$OUT/$s-grid.jsonl"
    sps=$(echo "$line" | json_field samples_per_s)
    printf '  %-28s %9.1f samples/s\n' "$st x $rep $sched M=$m" "$sps"
    if python3 -c "import sys; sys.exit(0 if $sps > $best else 1)"; then
      best=$sps
      best_name="$st x $rep $sched M=$m"
    fi
  done < <(grid "$procs")
  "$BIN" plan $args --processes "$procs" >"$OUT/$s-plan.txt"
  sed 's/^/  /' "$OUT/$s-plan.txt" | head -4
  line=$("$BIN" bench --plan "$OUT/$s-plan.txt" --steps "$STEPS" --repeat "$REPEAT" --json 2>/dev/null | tail -1)
  echo "$line" >>"$OUT/$s-plan.jsonl"
  python3 - "$line" "$best" "$best_name" "$s" <<'PY'
import json, sys
r = json.loads(sys.argv[1]); best = float(sys.argv[2]); name = sys.argv[3]; s = sys.argv[4]
meas, pred = r["samples_per_s"], r["predicted_samples_per_s"]
p = r["plan"]
ok1 = meas >= 0.95 * best; ok2 = abs(pred / meas - 1) <= 0.10
print(f"  plan {p['stages']} x {p['replicas']} {p['schedule']} M={p['micro_batches']} ckpt={p['checkpoint']} "
      f"balance {p['balance']}")
print(f"  {s}: plan measured {meas:.1f} samples/s = {meas / best:.3f} x best of grid {best:.1f} ({name}) "
      f"[{'ok' if ok1 else 'BELOW 0.95'}]; predicted {pred:.1f} = {100 * (pred / meas - 1):+.1f}% "
      f"[{'ok' if ok2 else 'OFF BY MORE THAN 10%'}]")
print(f"  memory per stage: predicted {[round(x, 1) for x in p['predicted_peak_memory_mb_per_stage']]} MiB, "
      f"measured {[round(x, 1) for x in r['peak_allocated_mb_per_stage']]} MiB")
PY
done
echo "JSON lines in $OUT"
