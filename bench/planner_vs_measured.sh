#!/usr/bin/env bash
# `strata plan` against a measured `strata bench finetune` run of the same shape: prints the
# Markdown table of docs/planner.md, "Predicted against measured".
#
#   bash bench/planner_vs_measured.sh                # runs the main job (about 5 min), then plans
#   bash bench/planner_vs_measured.sh measured.json  # plans against a saved `--json` run
#
# The plan gets what the run had: the scaled model (--scale/--layers), seq, batch, MFU and GPU
# preset of the run's modelled compute, no checkpointing (the run's modelled compute is 6 FLOPs
# per parameter and token), NVMe offload, Strata's pinned budget as its RAM with no headroom, the
# disk's rates (NVME_RATES, default 0.9/0.9 GB/s: docs/results.md's dd figure for this machine)
# and the CPU Adam rate `strata bench adam` measures here. Benchmarks run under
# flock /tmp/strata-bench.lock so that they never overlap with another one.
set -euo pipefail
cd "$(dirname "$0")/.."
STRATA=${STRATA:-build/bin/strata}
NVME_RATES=${NVME_RATES:-0.9/0.9}
MODEL=${MODEL:-llama-2-70b}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

measured=${1:-}
if [ -z "$measured" ]; then
  measured=$work/measured.json
  # Strata alone, its optimizer after backward: the order the planner's simulator steps in. (The
  # planner's ZeRO-Infinity estimate is its own older model, not the labelled DeepSpeed
  # configurations the main job now measures, so it has no measured row to meet here.)
  flock /tmp/strata-bench.lock "$STRATA" bench finetune --model "$MODEL" --strategy strata \
    --optimizer-overlap off --json >"$measured"
fi
if [ -z "${ADAM_GPARAMS:-}" ]; then
  flock /tmp/strata-bench.lock "$STRATA" bench adam --params 50M --grad-dtype bf16 \
    --param-out bf16 --no-torch --json >"$work/adam.json"
  ADAM_GPARAMS=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["strata_mparams_per_s"] / 1e3)' "$work/adam.json")
fi

read -r scale layers seq batch mfu gpu budget < <(python3 - "$measured" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
s, c = j["scaled"], j["config"]
print(s["scale"], s["layers"], c["seq"], c["batch"], c["mfu"], c["gpu"], c["strata_pinned_budget_bytes"])
PY
)
plan_command=("$STRATA" plan --model "$MODEL" --scale "$scale" --layers "$layers" --method full
  --seq "$seq" --batch "$batch" --checkpointing none --gpu "$gpu" --mfu "$mfu" --offload nvme
  --nvme "$NVME_RATES" --adam-rate "$ADAM_GPARAMS" --host-ram "$budget" --host-headroom 0
  --host-reserve 0)
# Exit 3 (the plan does not fit the RAM given) still prints the plan: the table says why.
"${plan_command[@]}" --json >"$work/plan.json" || [ $? -eq 3 ]

python3 - "$measured" "$work/plan.json" "${plan_command[*]}" <<'PY'
import json, sys
measured = json.load(open(sys.argv[1]))
plan = json.load(open(sys.argv[2]))
runs = {s["name"]: s for s in measured["strategies"]}
predicted = {"strata": plan["strata_nvme"]}

def per_step(run, key):
    return run[key] / max(run["measured_steps"], 1)

rows = [
    ("host peak (steps)", "host_bytes", lambda r: r["peak_host_bytes_during_steps"], 0.15, "GB"),
    ("pinned peak (steps)", "peak_pinned_bytes", lambda r: r["peak_pinned_bytes_during_steps"], None, "GB"),
    ("NVMe read / step", "nvme_read_bytes_per_step", lambda r: per_step(r, "nvme_read_bytes"), None, "GB"),
    ("NVMe written / step", "nvme_write_bytes_per_step", lambda r: per_step(r, "nvme_write_bytes"), 0.0, "GB"),
    ("step time", "step_seconds", lambda r: r["step_seconds"], 0.15, "s"),
]
print(f"`{sys.argv[3]}` against the run's JSON; load average "
      + ", ".join(f"{n} {r.get('load_average_start', '?')}-{r.get('load_average_end', '?')}" for n, r in runs.items()))
print()
print("| strategy | quantity | predicted | measured | predicted / measured | target |")
print("| --- | --- | --- | --- | --- | --- |")
for name in ("strata",):
    if name not in runs:
        continue
    for label, key, get, target, unit in rows:
        p = float(predicted[name][key])
        m = float(get(runs[name]))
        scale = 1e9 if unit == "GB" else 1.0
        ratio = p / m if m else float("nan")
        if target is None:
            verdict = "-"
        elif target == 0.0:
            verdict = "exact: " + ("met" if p == m else "missed")
        else:
            verdict = f"within {target:.0%}: " + ("met" if abs(ratio - 1) <= target else "missed")
        print(f"| {name} | {label} | {p / scale:.3f} {unit} | {m / scale:.3f} {unit} | {ratio:.3f} | {verdict} |")
PY
