#!/usr/bin/env bash
# `strata plan` against one measured run of the main job (`strata bench finetune --model
# llama-2-70b --strategy both`): prints the Markdown table of docs/planner.md, "Predicted against
# measured", for Strata and the three labelled DeepSpeed configurations.
#
#   bash bench/planner_vs_measured.sh                # runs the main job (about 6 min), then plans
#   bash bench/planner_vs_measured.sh measured.json  # plans against a saved `--json` run
#   SAVE=DIR bash bench/planner_vs_measured.sh       # also keeps the run's, the disk's, the
#                                                    # copies', Adam's and the plans' JSON in DIR
#
# The plan gets what the run had: the scaled model (--scale/--layers, which also scales
# DeepSpeed's element-count knobs as the benchmark does), seq, batch, MFU and GPU preset of the
# run's modelled compute, no checkpointing (the run's modelled compute is 6 FLOPs per parameter
# and token), NVMe offload, Strata's pinned budget as its pool exactly (--pinned-budget, spent as
# the run spent it: its stream chunk and buffers and its optimizer sub-group, --stream-chunk,
# --stream-buffers, --sub-group-bytes) and as its RAM with no headroom, the run's device budget
# as the simulated device pool
# (--device-budget), two simulated warm-up steps (--warmup-steps 2: the plan measures the steady
# step), the disk as `strata bench io --mixed` measures it on the run's directory right after the
# run (the half-duplex drive that moves what the disk moved reading and writing at once, over two
# files each half the most NVMe bytes one of the run's steps read, the median of IO_ROUNDS rounds;
# NVME_RATES=READ/WRITE to give the rates instead), the device's copies as `strata bench copy`
# measures them (--pcie-efficiency; COPY_GBPS to give the rate) and the CPU Adam rate `strata
# bench adam` measures here (ADAM_GPARAMS to give it). A second Strata step-time row plans with
# the disk and the copies measured again beside CPU AdamW on every CPU (a step's transfers share
# the cores with its computing). The run has four steps (STEPS): its first starts
# from where loading left the pools and its second settles, so the table measures the steady
# steps, the third on (all but the first for a saved run of three). Benchmarks run under flock
# $LOCK so that they never overlap with another one. Strata's last row plans the step once more
# with the drive as the run's own transfers saw it while busy (its per-step busy times): the
# disk's drift between the run and the `--mixed` measurement taken out, the plan's model left.
set -euo pipefail
cd "$(dirname "$0")/.."
STRATA=${STRATA:-build/bin/strata}
MODEL=${MODEL:-llama-2-70b}
LOCK=${LOCK:-/tmp/strata-bench.lock}
NVME_DIR=${NVME_DIR:-${TMPDIR:-/tmp}}
work=$(mktemp -d)
save() { if [ -n "${SAVE:-}" ]; then mkdir -p "$SAVE" && cp "$work"/*.json "$SAVE"/; fi; }
trap 'save; rm -rf "$work"' EXIT

measured=${1:-}
if [ -z "$measured" ]; then
  measured=$work/measured.json
  flock "$LOCK" "$STRATA" bench finetune --model "$MODEL" --strategy both --nvme "$NVME_DIR" \
    --steps "${STEPS:-4}" --json >"$measured"
fi
if [ -z "${NVME_RATES:-}" ]; then
  # DeepSpeed's aio settings (1 MiB blocks, queue depth 8): its handle is within 4% (write) and
  # 11% (read) of Strata's engine there on this disk (docs/results.md). Both runtimes read and
  # write at once during a step, and the plan's drive is half duplex: --mixed gives the
  # half-duplex rates that move what the disk moved with both directions at once (solo rates
  # alone overstated this virtual disk by about 1.4x, docs/planner.md). Each file is half the
  # most bytes one of the run's steps read, rounded up to whole GiB, so a host cache behind the
  # disk holds as little of them as of the run's. Each rate is the median of IO_ROUNDS rounds
  # (3): on this virtual disk one round's write alone moved between 2.7 and 10 GB/s (a host
  # cache behind it that the run's last writes may or may not have filled).
  io_size=$(python3 -c '
import json, math, sys
j = json.load(open(sys.argv[1]))
strata = next(x for x in j["strategies"] if x["name"] == "strata")
per_step = max(s["runtime_nvme_read_bytes"] for s in strata["steps"])
print(max(1, math.ceil(per_step / 2 / 2**30)))' "$measured")
  flock "$LOCK" "$STRATA" bench io --path "$NVME_DIR" --size "${io_size}G" --block 1M --qd 8 \
    --rounds "${IO_ROUNDS:-3}" --mixed --json >"$work/io.json"
  { read -r NVME_RATES; read -r io_figures; } < <(python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
print("%.4f/%.4f" % (j["half_duplex_read_gbps"], j["half_duplex_write_gbps"]))
print("alone %.3f / %.3f, at once %.3f / %.3f GB/s read / write"
      % (j["read_gbps"], j["write_gbps"], j["mixed_read_gbps"], j["mixed_write_gbps"]))' "$work/io.json")
  NVME_SOURCE="strata bench io --size ${io_size}G --block 1M --qd 8 --mixed: $io_figures"
  # The disk and the device's copies once more while CPU AdamW (`strata bench adam`, one thread
  # per CPU, the main job's gradient and weight dtypes) keeps every CPU busy: on a machine with
  # few cores the drive's rate falls when the CPU computes (virtio and io_uring completions,
  # checksums and the runtime's copies share the cores with the optimizer), and so do the
  # emulated device's copies (memcpy), which the plan does not model. A second set of
  # independent figures: the drive and the device with no core to spare.
  flock "$LOCK" bash -c '
    (  # the load: Adam again and again until TERM, which ends the one running too
      trap '\''kill "$adam" 2>/dev/null; exit 0'\'' TERM
      while :; do
        "$1" bench adam --params 50M --steps 1000 --grad-dtype bf16 --param-out bf16 \
          --no-torch --json >/dev/null 2>&1 &
        adam=$!
        wait "$adam" || exit 1
      done ) &
    load=$!
    sleep 2  # the load past its start-up (allocating and touching its arrays)
    "$1" bench io --path "$2" --size "$3" --block 1M --qd 8 --rounds "$5" --mixed --json >"$4" &&
      "$1" bench copy --json >"$6"
    status=$?
    kill "$load" 2>/dev/null
    if ! wait "$load"; then echo "the CPU load (strata bench adam) failed" >&2; exit 1; fi
    exit $status' _ "$STRATA" "$NVME_DIR" "${io_size}G" "$work/io-loaded.json" "${IO_ROUNDS:-3}" \
    "$work/copy-loaded.json"
  read -r LOADED_RATES < <(python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
print("%.4f/%.4f" % (j["half_duplex_read_gbps"], j["half_duplex_write_gbps"]))' "$work/io-loaded.json")
fi
# The device the run had, its copies between pinned memory and device memory: `strata bench copy`
# (256 MiB each way in the runtime's 4 MiB stream chunks, both directions at once as in a step's
# backward; on a machine without a GPU the emulated device, a memcpy per copy stream). COPY_GBPS
# to give the rate instead. The plan takes it as --pcie-efficiency, its ratio to the host link of
# the run's GPU preset (the H100's 63 GB/s), so that it models the device the run copied to.
if [ -z "${COPY_GBPS:-}" ]; then
  flock "$LOCK" "$STRATA" bench copy --json >"$work/copy.json"
fi
if [ -z "${ADAM_GPARAMS:-}" ]; then
  flock "$LOCK" "$STRATA" bench adam --params 50M --grad-dtype bf16 \
    --param-out bf16 --no-torch --json >"$work/adam.json"
  ADAM_GPARAMS=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["strata_mparams_per_s"] / 1e3)' "$work/adam.json")
fi

read -r scale layers seq batch mfu gpu budget device_budget chunk buffers sub_group < <(python3 - "$measured" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
s, c = j["scaled"], j["config"]
strata = next(x for x in j["strategies"] if x["name"] == "strata")
# The budget the run's Strata worker had: the automatic one it sized (config 0) or the one set,
# and how it spent it (an automatic budget follows the drive, not the rule for one set exactly).
budget = c["strata_pinned_budget_bytes"] or strata["pinned_budget_bytes"]
split = strata.get("pinned_split", {})
print(s["scale"], s["layers"], c["seq"], c["batch"], c["mfu"], c["gpu"], budget,
      c["device_budget_bytes"], split.get("stream_chunk_bytes", 0), split.get("stream_buffers", 0),
      split.get("optimizer_sub_group_bytes", 0))
PY
)
split_options=()
[ "$chunk" != 0 ] && split_options+=(--stream-chunk "$chunk" --stream-buffers "$buffers")
[ "$sub_group" != 0 ] && split_options+=(--sub-group-bytes "$sub_group")
# A copy benchmark's rate, both directions at once (their harmonic mean: bytes over busy time, as
# the run's own rate below), over the host link of the run's GPU preset.
copy_efficiency() {
  python3 - "$1" "$gpu" runtime/model/presets/gpus.json <<'PY'
import json, sys
source, gpu, presets = sys.argv[1:4]
if source.endswith(".json"):
    j = json.load(open(source))
    a, b = j["at_once_host_to_device_gbps"], j["at_once_device_to_host_gbps"]
    rate = 2 / (1 / a + 1 / b)
else:
    rate = float(source)
link = json.load(open(presets))["gpus"][gpu]["host_link_gbps"]
print("%.6f %.3f" % (min(1.0, rate / link), rate))
PY
}
read -r copy_eff copy_rate < <(copy_efficiency "${COPY_GBPS:-$work/copy.json}")
plan_base=("$STRATA" plan --model "$MODEL" --scale "$scale" --layers "$layers" --method full
  --seq "$seq" --batch "$batch" --checkpointing none --gpu "$gpu" --mfu "$mfu" --offload nvme
  --nvme "$NVME_RATES" --adam-rate "$ADAM_GPARAMS" --host-ram "$budget" --host-headroom 0
  --host-reserve 0 --pinned-budget "$budget" --device-budget "$device_budget" --warmup-steps 2
  "${split_options[@]}")
# Each plan below sets the same options with its own disk and device copies.
with_rates() {  # NVME_RATES COPY_EFFICIENCY: the plan command with these two
  local i
  planned=("${plan_base[@]}" --pcie-efficiency "$2")
  for i in "${!planned[@]}"; do [ "${planned[$i]}" = --nvme ] && planned[i+1]=$1; done
  return 0
}
# Exit 3 (the plan does not fit the RAM given) still prints the plan: the table says why.
with_rates "$NVME_RATES" "$copy_eff"
plan_command=("${planned[@]}")
"${plan_command[@]}" --json >"$work/plan.json" || [ $? -eq 3 ]
copy_source="strata bench copy"
[ -n "${COPY_GBPS:-}" ] && copy_source="COPY_GBPS as given"
echo "disk: $NVME_RATES GB/s read/write as a half-duplex drive (${NVME_SOURCE:-NVME_RATES as given}); Adam: $ADAM_GPARAMS Gparam/s; device copies: $copy_rate GB/s each way at once ($copy_source), $copy_eff of the host link" >&2

# The same plan with the disk and the device's copies measured while CPU AdamW kept every CPU
# busy (above; not when NVME_RATES was given): a step's transfers share the cores with its
# computing for part of the step, not for none of it (the first plan) and not for all (this one).
loaded_figures=""
if [ -n "${LOADED_RATES:-}" ]; then
  read -r loaded_eff loaded_copy_rate < <(copy_efficiency "$work/copy-loaded.json")
  with_rates "$LOADED_RATES" "$loaded_eff"
  "${planned[@]}" --json >"$work/plan-loaded.json" || [ $? -eq 3 ]
  loaded_figures="$LOADED_RATES GB/s read/write half duplex; device copies $loaded_copy_rate GB/s"
  echo "beside CPU AdamW on every CPU: the disk $loaded_figures each way at once" >&2
fi

# The same plan with the drive as the run's own transfers saw it while busy (strata_stats'
# busy times, per step in the run's JSON): the half-duplex drive that, given the steady steps'
# bytes, is busy exactly as long as the run's drive was, each direction at the pace it kept
# while in flight (both scaled by one factor: the directions' busy times over the drive's).
# It takes the disk's variation between the run and the `--mixed` measurement out of the step
# time, so that what is left is the plan's model of the step; it is no independent prediction.
# Where the run reports its device copies too (`steps[].device_copies`), the plan gets their
# rate as well (--pcie-efficiency: that rate over the GPU preset's host link): the emulated
# device copies with memcpy, far below any PCIe preset.
run_drive=$(python3 - "$measured" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
strata = next((x for x in j["strategies"] if x["name"] == "strata"), None)
steps = strata["steps"] if strata else []
# The steady steps, by the rule of steady() in the table's script below (keep the two alike).
steps = steps[2:] if len(steps) >= 4 else steps[1:] if len(steps) > 1 else steps
if not steps or "nvme_busy_seconds" not in steps[0]:
    sys.exit(0)  # a run saved before the busy times: nothing to replay
read = sum(sum(s["nvme_read_by_kind"].values()) for s in steps)
written = sum(sum(s["nvme_written_by_kind"].values()) for s in steps)
busy = {k: sum(s["nvme_busy_seconds"][k] for s in steps) for k in ("read", "write", "either")}
if min(busy.values()) <= 0 or not read or not written:
    sys.exit(0)
k = (busy["read"] + busy["write"]) / busy["either"]
seconds = sum(s["seconds"] for s in steps)
copy_rate = 0.0  # GB/s, both directions: bytes over busy time
if all("device_copies" in s for s in steps):
    copied = sum(s["device_copies"]["host_to_device_bytes"] + s["device_copies"]["device_to_host_bytes"]
                 for s in steps)
    copy_busy = sum(s["device_copies"]["host_to_device_busy_seconds"]
                    + s["device_copies"]["device_to_host_busy_seconds"] for s in steps)
    if copied and copy_busy > 0:
        copy_rate = copied / copy_busy / 1e9
print("%.4f/%.4f %.4f %.4f %.4f %.6f" % (read / busy["read"] * k / 1e9, written / busy["write"] * k / 1e9,
                                          busy["either"] / seconds, read / busy["read"] / 1e9,
                                          written / busy["write"] / 1e9, copy_rate))
PY
)
run_rates="" run_busy="" run_solo=""
if [ -n "$run_drive" ]; then
  read -r run_rates run_busy run_read run_write run_copy_rate <<<"$run_drive"
  run_solo="$run_read/$run_write"
  copy_note=""
  if [ "$run_copy_rate" != 0.000000 ]; then
    read -r run_copy _ < <(copy_efficiency "$run_copy_rate")
    copy_note="; device copies at $run_copy of the host link"
  else
    run_copy=$copy_eff  # a run saved before its copies were counted: the benchmark's rate
  fi
  with_rates "$run_rates" "$run_copy"
  "${planned[@]}" --json >"$work/plan-run-drive.json" || [ $? -eq 3 ]
  echo "the drive as the run's transfers saw it: $run_rates GB/s read/write half duplex ($run_solo GB/s while each direction was in flight; busy $run_busy of the steady steps)$copy_note" >&2
fi

python3 - "$measured" "$work/plan.json" "${plan_command[*]}" "$run_rates" "$run_busy" \
  "$work/plan-run-drive.json" "${copy_note:+$run_copy}" "$loaded_figures" "$work/plan-loaded.json" <<'PY'
import json, sys
measured = json.load(open(sys.argv[1]))
plan = json.load(open(sys.argv[2]))
runs = {s["name"]: s for s in measured["strategies"] + measured.get("baselines", [])}
like = plan["like_for_like"]
predicted = {"strata": dict(plan["strata_nvme"], host_bytes_steps=plan["strata_nvme"]["host_bytes"],
                            pinned_bytes=plan["strata_nvme"]["peak_pinned_bytes"])}
for d in like["deepspeed"]:
    predicted[d["name"]] = d

def steady(run):
    # The steps compared with the plan's steady step: the first starts from where loading left
    # the pools and the second settles, so from the third on when there are four or more; all
    # but the first of a shorter run. (The run's drive above takes the same steps.)
    steps = run["steps"]
    return steps[2:] if len(steps) >= 4 else steps[1:] if len(steps) > 1 else steps

def mean(run, key):
    # Over the steady steps. Requests: what the worker asked its I/O to move (Strata: the
    # runtime's count; DeepSpeed: its aio handles'); nvme_*_bytes: /proc/self/io's.
    steps = steady(run)
    return sum(s[key] for s in steps) / len(steps)

rows = [
    ("host peak (steps)", "host_bytes_steps", lambda r: r["peak_host_bytes_during_steps"], 0.15, "GB"),
    # The plan models what the offload engine adds to a process; the process itself (code,
    # libraries, the benchmark's compute buffers) is what --host-reserve stands for. Each worker
    # reads it before its engine exists (process_base_bytes).
    ("host peak above the process base (steps)", "host_bytes_steps",
     lambda r: r["peak_host_bytes_during_steps"] - r["process_base_bytes"], 0.15, "GB"),
    ("process base (not planned)", None, lambda r: r["process_base_bytes"], None, "GB"),
    ("host peak (run)", "host_bytes", lambda r: r["peak_host_bytes"], None, "GB"),
    ("pinned peak (steps)", "pinned_bytes", lambda r: r["peak_pinned_bytes_during_steps"], None, "GB"),
    ("NVMe read / step, requests", "nvme_read_bytes_per_step", lambda r: mean(r, "runtime_nvme_read_bytes"), None, "GB"),
    ("NVMe written / step, requests", "nvme_write_bytes_per_step", lambda r: mean(r, "runtime_nvme_write_bytes"), 0.0, "GB"),
    ("NVMe written / step, /proc/self/io", "nvme_write_bytes_per_step", lambda r: mean(r, "nvme_write_bytes"), None, "GB"),
    ("step time", "step_seconds", lambda r: mean(r, "seconds"), 0.15, "s"),
]
counts = sorted({(len(r["steps"]), len(steady(r))) for r in runs.values()})
print(f"`{sys.argv[3]}` against the run's JSON, measured over steps "
      + ", ".join(f"{n - m + 1}-{n} of {n}" for n, m in counts) + "; load average "
      + ", ".join(f"{n} {r.get('load_average_start', '?'):.2f}-{r.get('load_average_end', '?'):.2f}"
                  for n, r in runs.items()))
print()
print("| strategy | quantity | predicted | measured | predicted / measured | target |")
print("| --- | --- | --- | --- | --- | --- |")
for name in ("strata", "deepspeed-defaults", "deepspeed-pinned", "deepspeed-tuned"):
    if name not in runs or name not in predicted:
        continue
    for label, key, get, target, unit in rows:
        if key is None:  # measured only
            m = float(get(runs[name]))
            print(f"| {name} | {label} | - | {m / 1e9:.3f} {unit} | - | - |")
            continue
        p = float(predicted[name][key])
        m = float(get(runs[name]))
        scale = 1e9 if unit == "GB" else 1.0
        ratio = p / m if m else float("nan")
        if target is None:
            verdict = "-"
        elif target == 0.0:
            verdict = "exact: " + ("met" if round(p) == round(m) else "missed")
        else:
            verdict = f"within {target:.0%}: " + ("met" if abs(ratio - 1) <= target else "missed")
        digits = 6 if "NVMe" in label else 3
        print(f"| {name} | {label} | {p / scale:.{digits}f} {unit} | {m / scale:.{digits}f} {unit} | {ratio:.6f} | {verdict} |")
    # The runtime's own count of bytes written moves between identical steps (which sub-groups
    # a step writes back depends on when its write-backs complete; docs/planner.md, "Traced to
    # the transfer"): the steady steps' range, to read the plan's one figure against.
    steps = steady(runs[name]) if runs[name].get("steps") else []
    if name == "strata" and len(steps) > 1:
        p = float(predicted[name]["nvme_write_bytes_per_step"])
        low, high = (f(s["runtime_nvme_write_bytes"] for s in steps) for f in (min, max))
        where = "inside" if low <= p <= high else "outside"
        print(f"| {name} | NVMe written / step, requests: the steps' range | {p / 1e9:.6f} GB "
              f"| {low / 1e9:.6f}-{high / 1e9:.6f} GB | {where} | - |")
    # Strata's NVMe bytes by tensor kind: the simulated step's and the runtime's own counts.
    if name != "strata" or not steps or "nvme_written_by_kind" not in steps[0]:
        continue
    groups = (("optimizer states", ("master_weight", "adam_m", "adam_v")),
              ("parameters", ("parameter",)), ("gradients", ("gradient",)))
    for direction, plan_key, run_key in (("read", "nvme_read_bytes_per_step_by_kind", "nvme_read_by_kind"),
                                         ("written", "nvme_write_bytes_per_step_by_kind", "nvme_written_by_kind")):
        for group, kinds in groups:
            p = float(sum(predicted[name][plan_key].get(k, 0) for k in kinds))
            m = sum(sum(s[run_key].get(k, 0) for k in kinds) for s in steps) / len(steps)
            ratio = p / m if m else float("nan")
            print(f"| {name} | NVMe {direction} / step: {group} | {p / 1e9:.6f} GB | {m / 1e9:.6f} GB | {ratio:.6f} | - |")
    # The step time again, planned with the disk and the device's copies measured beside CPU
    # AdamW on every CPU (above): the other end from the plain step time row.
    if name == "strata" and sys.argv[8]:
        loaded = json.load(open(sys.argv[9]))
        p = float(loaded["strata_nvme"]["step_seconds"])
        m = mean(runs[name], "seconds")
        verdict = "within 15%: " + ("met" if abs(p / m - 1) <= 0.15 else "missed")
        print(f"| {name} | step time, the plan given the disk and the device copies measured beside "
              f"CPU AdamW on every CPU ({sys.argv[8]}) | {p:.3f} s | {m:.3f} s | {p / m:.6f} "
              f"| {verdict} |")
    # The step time again, planned with the drive as this run's transfers saw it (above).
    if name == "strata" and sys.argv[4]:
        replay = json.load(open(sys.argv[6]))
        p = float(replay["strata_nvme"]["step_seconds"])
        m = mean(runs[name], "seconds")
        verdict = "within 15%: " + ("met" if abs(p / m - 1) <= 0.15 else "missed")
        copies = (f"; device copies at {float(sys.argv[7]):.4f} of the host link"
                  if sys.argv[7] else "")
        print(f"| {name} | step time, the plan given the drive as the run saw it "
              f"({sys.argv[4]} GB/s; busy {float(sys.argv[5]):.0%} of the step{copies}) | {p:.3f} s "
              f"| {m:.3f} s | {p / m:.6f} | {verdict} |")
print()
for name, r in runs.items():
    print(f"{name}: measured disk {r.get('nvme_read_gbps', 0):.3f} GB/s read, "
          f"{r.get('nvme_write_gbps', 0):.3f} GB/s write averaged over its steps")
PY
