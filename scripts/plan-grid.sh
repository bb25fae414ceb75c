#!/usr/bin/env bash
# Measures a grid of pipeline layouts with `pipetrain bench`, then the layout `pipetrain plan`
# chooses, and prints both: the plan's measured samples/s against the best of the grid
# (goal >= 0.95) and its predicted samples/s against its measured (goal within 10%).
# For people, not CI: it takes minutes and its figures depend on the machine's load. The
# layouts run round-robin, REPEAT rounds, each a fresh `bench` of one run, and the medians are
# compared, so a change in load hits every layout alike instead of whichever ran then.
#
# Usage: scripts/plan-grid.sh [SUBJECT...]   SUBJECT = mlp | mlp-4 | cnn | gpt (default: all)
# Environment: PIPETRAIN (the binary, default build/pipetrain), REPEAT (rounds, default 3),
# STEPS (timed steps per run, default 8), OUT (directory for the JSON lines).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${PIPETRAIN:-build/pipetrain}
REPEAT=${REPEAT:-3}
STEPS=${STEPS:-8}
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
    printf '%s\n' "2 1 1f1b 2" "2 1 1f1b 4" "2 1 1f1b 8" "2 1 1f1b 16" "2 1 fill-drain 4" "2 1 fill-drain 8" \
      "2 1 zb-h1 4" "2 1 zb-h1 8" "2 1 interleaved 8" "2 1 zb-v 8" "1 2 1f1b 1" "1 2 1f1b 4"
  fi
}

subject_args() {  # fills the array args with the flags that name subject $1
  case "$1" in
    mlp | mlp-4) args=(--workload "$1") ;;
    *) args=(--example "$1") ;;
  esac
}

for s in "${SUBJECTS[@]}"; do
  subject_args "$s"
  procs=2
  [ "$s" = mlp-4 ] && procs=4
  echo "== $s: $procs processes, $REPEAT rounds x $STEPS steps per layout (medians) =="
  "$BIN" plan "${args[@]}" --processes "$procs" >"$OUT/$s-plan.txt"
  sed 's/^/  /' "$OUT/$s-plan.txt" | sed -n '1,4p'
  mapfile -t layouts < <(grid "$procs")
  : >"$OUT/$s-runs.jsonl"
  for ((r = 1; r <= REPEAT; r++)); do
    for layout in "${layouts[@]}" plan; do
      if [ "$layout" = plan ]; then
        line=$("$BIN" bench --plan "$OUT/$s-plan.txt" --steps "$STEPS" --warmup 2 --json 2>/dev/null | tail -1) || line=""
      else
        read -r st rep sched m <<<"$layout"
        line=$("$BIN" bench "${args[@]}" --stages "$st" --replicas "$rep" --schedule "$sched" --micro-batches "$m" \
          --steps "$STEPS" --warmup 2 --skip-baseline --json 2>/dev/null | tail -1) || line=""
      fi
      [ -n "$line" ] && echo "{\"layout\": \"$layout\", \"run\": $line}" >>"$OUT/$s-runs.jsonl"
    done
  done
  python3 - "$OUT/$s-runs.jsonl" "$s" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in runs:
    by.setdefault(r["layout"], []).append(r["run"])
med = {k: statistics.median(x["samples_per_s"] for x in v) for k, v in by.items()}
grid = {k: v for k, v in med.items() if k != "plan"}
for k, v in grid.items():
    st, rep, sched, m = k.split()
    print(f"  {st} x {rep} {sched:12s} M={m:3s} {v:9.1f} samples/s")
best = max(grid, key=grid.get)
p = by["plan"][0]["plan"]
meas = med["plan"]
pred = p["predicted_samples_per_s"]
ok1 = meas >= 0.95 * grid[best]
ok2 = abs(pred / meas - 1) <= 0.10
print(f"  plan {p['stages']} x {p['replicas']} {p['schedule']} M={p['micro_batches']} chunks={p['chunks']} "
      f"ckpt={p['checkpoint']} balance {p['balance']}: {meas:.1f} samples/s")
print(f"  {sys.argv[2]}: plan measured {meas:.1f} = {meas / grid[best]:.3f} x best of grid {grid[best]:.1f} ({best}) "
      f"[{'ok' if ok1 else 'BELOW 0.95'}]; predicted {pred:.1f} = {100 * (pred / meas - 1):+.1f}% "
      f"[{'ok' if ok2 else 'OFF BY MORE THAN 10%'}]")
print(f"  memory per stage: predicted {[round(x, 1) for x in p['predicted_peak_memory_mb_per_stage']]} MiB, "
      f"measured {[round(x, 1) for x in by['plan'][0]['peak_allocated_mb_per_stage']]} MiB")
PY
done
echo "JSON lines in $OUT"
