#!/usr/bin/env bash
# The checks that need a GPU, run on a machine that has one (CI has none; DEVELOPERS.md).
#
#   bash tests/run-gpu.sh [BUILD_DIR [OUT_DIR]]     # defaults: build, gpu-check
#   GPU_CHECK_STAGES="tests python" bash tests/run-gpu.sh   # some stages only
#
# BUILD_DIR is a build with CUDA (-DSTRATA_CUDA=ON or AUTO with nvcc found): bin/strata,
# runtime/libstrata.so and the test programs under tests/. Stages:
#   facts    the GPU, torch, the CPUs and the scratch file system, as this run saw them
#   tests    the GoogleTest cases that skip themselves without a GPU (the CUDA device backend,
#            pinned memory registered with the device, the CUDA AdamW and NF4 kernels, the torch
#            allocator ABI, the release's default stream), each program with a 150 s limit
#   python   every tests/python file under this machine's python3 and torch, where test_torch.py
#            and the allocator's test compute on the GPU; then the files whose training tests
#            take conftest's DEVICE (LoRA, QLoRA, activation offload) once more on the GPU
#            (STRATA_TEST_DEVICE=cuda); each file with a 150 s limit; and the bytes a training
#            step saves per layer under this torch against the plan (lora_offload.py saved-bytes)
#   measure  the main job on the GPU (`strata bench finetune --strategy strata --compute gpu`),
#            then bench/planner_vs_measured.sh on its JSON: the disk (`strata bench io --mixed`),
#            the copies over PCIe (`strata bench copy`) and the CPU Adam rate measured right
#            after it, each once more beside CPU AdamW on every core, and the plan of the same
#            shape against the run (docs/planner.md); then LoRA and QLoRA on the GPU; then
#            activation offload's step time against the plan's (lora_offload.py copy-time), and
#            its chunks spilled to NVMe and read back under a small pinned budget (spill)
# tests and python run side by side; measure runs alone after them. Logs and JSON go to OUT_DIR;
# the last lines printed are one line per check: PASS or FAIL and the tallies. Exit 1 when a check
# failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
BUILD=$(realpath "${1:-build}")
OUT_DIR=$(realpath -m "${2:-gpu-check}")
STAGES=${GPU_CHECK_STAGES:-facts tests python measure}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
summary=$OUT_DIR/summary.txt
: >"$summary"
record() { echo "$1 $2${3:+: $3}" | tee -a "$summary"; }
wants() { [[ " $STAGES " == *" $1 "* ]]; }

# Swap files need O_DIRECT, which tmpfs refuses: the first candidate on a disk file system.
scratch=
for dir in ${GPU_CHECK_SCRATCH:-} /var/tmp /tmp "$PWD"; do
  case $(stat -f -c %T "$dir" 2>/dev/null) in
    ext2/ext3 | xfs | btrfs | f2fs) scratch=$dir/strata-gpu-check.$$ && break ;;
  esac
done
scratch=${scratch:-$PWD/strata-gpu-check.$$}
mkdir -p "$scratch"
trap 'rm -rf "$scratch"' EXIT

if wants facts; then
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max --format=csv
    "$PYTHON" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
          "cuda", torch.version.cuda, "gpu", torch.cuda.is_available() and torch.cuda.get_device_name())'
    echo "cpus $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
    grep -E 'MemTotal|MemAvailable' /proc/meminfo
    echo "scratch $scratch on $(stat -f -c %T "$scratch"), $(df -h --output=avail "$scratch" | tail -1) free"
    lsblk -d -o NAME,MODEL,SIZE,ROTA 2>/dev/null
    "$BUILD/bin/strata" doctor --path "$scratch" 2>&1
  } >"$OUT_DIR/facts.txt" 2>&1
  cat "$OUT_DIR/facts.txt"
fi

# GoogleTest programs and the cases in them that need a GPU (the rest run in CI).
gtests=(
  "memory/memory_test:*"
  "optim/optim_test:*Cuda*"
  "quant/quant_test:*Cuda*:*cuda*"
  "api/torch_memory_test:*"
  "memory/memory_torch_c_abi_test:*"
  "api/device_stream_test:*"
)
pids=()
if wants tests; then
  for entry in "${gtests[@]}"; do
    program=${entry%%:*}
    filter=${entry#*:}
    name=$(basename "$program")
    (
      # The build's own RUNPATH names where it was built; a copied build finds libstrata here.
      cd "$scratch" && export LD_LIBRARY_PATH=$BUILD/runtime${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} &&
        timeout 150 "$BUILD/tests/$program" --gtest_filter="$filter" >"$OUT_DIR/gtest-$name.log" 2>&1
    ) &
    pids+=("$!:gtest-$name")
  done
fi
if wants python; then
  mkdir -p "$scratch/python"
  # Every file as CI runs it, then the files whose training tests take conftest's DEVICE once
  # more with STRATA_TEST_DEVICE=cuda (CI runs them on the CPU).
  runs=()
  for file in tests/python/test_*.py; do
    runs+=("cpu:$file")
    grep -q "from conftest import .*DEVICE" "$file" && runs+=("cuda:$file")
  done
  for run in "${runs[@]}"; do
    device=${run%%:*}
    file=${run#*:}
    name=$(basename "$file" .py)
    [ "$device" = cuda ] && name=cuda-$name
    # Sixteen files at once: two torch threads each keep the CPUs from thrashing.
    OMP_NUM_THREADS=2 STRATA_LIBRARY=$BUILD/runtime/libstrata.so STRATA_TEST_DEVICE=$device \
      STRATA_TEST_DIR=$scratch/python timeout 150 "$PYTHON" -m pytest -q -p no:cacheprovider -rs \
      "$file" >"$OUT_DIR/python-$name.log" 2>&1 &
    pids+=("$!:python-$name")
  done
  # The bytes autograd saves per layer in one step under this machine's torch (2.x), beside the
  # plan's formula for the same shapes (docs/planner.md, "Activations measured"; on the CPU).
  for method in full lora; do
    OMP_NUM_THREADS=2 STRATA_LIBRARY=$BUILD/runtime/libstrata.so timeout 150 "$PYTHON" \
      bindings/python/examples/lora_offload.py saved-bytes --method "$method" --dtype bf16 \
      --hidden 256 --layers 3 --seq 256 --pinned-mib 256 --nvme "$scratch/python" \
      --strata "$BUILD/bin/strata" \
      >"$OUT_DIR/saved-bytes-$method.log" 2>&1 &
    pids+=("$!:saved-bytes-$method")
  done
fi
failed=0
for entry in "${pids[@]}"; do
  pid=${entry%%:*}
  name=${entry#*:}
  wait "$pid"
  rc=$?
  log=$OUT_DIR/$name.log
  # The last summary line of each: gtest's "[  PASSED  ] N tests." / "[  FAILED  ]", pytest's
  # "N passed, M skipped in Ts".
  tally=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test|[0-9]+ (passed|failed|errors?)\b' "$log" |
    tr '\n' ' ')
  case $name in saved-bytes-*)
    tally=$("$PYTHON" -c '
import json, sys
d = json.loads(open(sys.argv[1]).read().splitlines()[-1])
print("torch", d["torch"], "; ".join("seq %d: measured %d, planned %d, planned + this torch'"'"'s extra - measured %+d"
      % (r["seq"], r["measured_per_layer"], r["planned_per_layer"],
         r["planned_with_this_torch_minus_measured"]) for r in d["rows"]))' "$log" 2>/dev/null ||
      tail -2 "$log" | tr '\n' ' ') ;;
  esac
  if [ "$rc" -eq 0 ]; then
    record PASS "$name" "$tally"
  else
    [ "$rc" -eq 124 ] && tally="timed out; $tally"
    record FAIL "$name" "exit $rc; $tally"
    failed=1
  fi
done
# Which GPU cases ran and which skipped themselves, by name.
if wants tests; then
  grep -h -E '^\[ +(OK|FAILED|SKIPPED) +\].*(Cuda|cuda|Gpu|Torch|Registers)' "$OUT_DIR"/gtest-*.log |
    sort -u >"$OUT_DIR/gtest-gpu-cases.txt" || true
  cat "$OUT_DIR/gtest-gpu-cases.txt"
fi

# One `strata bench finetune` on the GPU, into OUT_DIR/NAME.json; records each worker's steps.
finetune() {
  local name=$1
  shift
  if timeout 200 "$BUILD/bin/strata" bench finetune --model llama-2-70b --compute gpu \
    --gpu "${GPU_PRESET:-h200}" --nvme "$scratch" --steps 4 --json "$@" \
    >"$OUT_DIR/$name.json" 2>"$OUT_DIR/$name.log"; then
    record PASS "$name" "$("$PYTHON" -c '
import json, sys
j = json.load(open(sys.argv[1]))
print("; ".join(s["name"] + " steps " + " ".join("%.3f" % x["seconds"] for x in s["steps"])
                + " s, NVMe written " + " ".join("%.2f" % (x["runtime_nvme_write_bytes"] / 2**20)
                                                 for x in s["steps"]) + " MiB"
                for s in j["strategies"]))' "$OUT_DIR/$name.json")"
  else
    record FAIL "$name" "$(tail -3 "$OUT_DIR/$name.log" | tr '\n' ' ')"
    failed=1
    return 1
  fi
}

if wants measure; then
  if finetune finetune-gpu --strategy strata; then
    # The disk (bench io --mixed, sized from the run; one round each, for the device's time),
    # the PCIe copies and Adam measured right after the run on the same directory, and the plan
    # of the same shape against it: the script of docs/planner.md, which keeps io.json,
    # copy.json, adam.json and plan.json in OUT_DIR.
    if IO_ROUNDS=1 STRATA=$BUILD/bin/strata NVME_DIR=$scratch LOCK=$scratch/bench.lock SAVE=$OUT_DIR \
      timeout 200 bash bench/planner_vs_measured.sh "$OUT_DIR/finetune-gpu.json" \
      >"$OUT_DIR/planner_vs_measured.md" 2>"$OUT_DIR/planner_vs_measured.log"; then
      record PASS planner-vs-measured "$(grep -h -E '^disk: |\| strata \| step time ' \
        "$OUT_DIR/planner_vs_measured.log" "$OUT_DIR/planner_vs_measured.md" | tr '\n' ' ')"
    else
      record FAIL planner-vs-measured "$(tail -3 "$OUT_DIR/planner_vs_measured.log" | tr '\n' ' ')"
      failed=1
    fi
  fi
  # LoRA and QLoRA on the GPU: a frozen base streamed from NVMe (QLoRA's in NF4, dequantized by
  # strata_nf4_dequantize_cuda on the compute stream), the adapters trained.
  for method in lora qlora; do
    finetune "finetune-gpu-$method" --method "$method" || true
  done
  # Activation offload's copies on the GPU: the step's extra time with it against the plan's
  # (packed bytes over each one-way rate of `strata bench copy`, added to compute's time:
  # docs/planner.md, "Activation offload"). An extra_over_planned near 1 confirms that the
  # copies block the compute stream; near 0, that they overlap it.
  if timeout 60 "$BUILD/bin/strata" bench copy --backend cuda --json >"$OUT_DIR/copy-cuda.json" \
    2>"$OUT_DIR/copy-cuda.log" &&
    rates=$("$PYTHON" -c 'import json, sys; d = json.load(open(sys.argv[1]))
print("%s,%s" % (d["device_to_host_gbps"], d["host_to_device_gbps"]))' "$OUT_DIR/copy-cuda.json") &&
    STRATA_LIBRARY=$BUILD/runtime/libstrata.so timeout 150 "$PYTHON" \
      bindings/python/examples/lora_offload.py copy-time --device cuda --dtype bf16 \
      --hidden 1024 --layers 8 --seq 2048 --pinned-mib 8192 --nvme "$scratch" \
      --copy-gbps "$rates" >"$OUT_DIR/copy-time.log" 2>&1; then
    record PASS activation-copy-time "$(tail -1 "$OUT_DIR/copy-time.log")"
  else
    record FAIL activation-copy-time "$(tail -2 "$OUT_DIR/copy-time.log" "$OUT_DIR/copy-cuda.log" \
      2>/dev/null | tr '\n' ' ')"
    failed=1
  fi
  # Activation offload to NVMe on the GPU under a pinned budget smaller than a step's saved
  # activations: what the drive wrote and read back (read <= written + shared, as on the CPU:
  # docs/scheduling.md), and the step's median time.
  if STRATA_LIBRARY=$BUILD/runtime/libstrata.so timeout 150 "$PYTHON" \
    bindings/python/examples/lora_offload.py spill --device cuda --preset tinyllama-1.1b \
    --hidden 512 --layers 4 --batch 4 --seq 512 --steps 4 --pinned-mib 64 --nvme "$scratch" \
    >"$OUT_DIR/spill.log" 2>&1 &&
    "$PYTHON" -c 'import json, sys; d = json.loads(open(sys.argv[1]).read().splitlines()[-1])
sys.exit(0 if 0 < d["nvme_read_bytes"] <= d["nvme_written_bytes"] + d["shared_bytes"] else 1)' \
      "$OUT_DIR/spill.log"; then
    record PASS activation-spill "$(tail -1 "$OUT_DIR/spill.log")"
  else
    record FAIL activation-spill "$(tail -2 "$OUT_DIR/spill.log" 2>/dev/null | tr '\n' ' ')"
    failed=1
  fi
fi
echo "== summary ($OUT_DIR/summary.txt)"
cat "$summary"
exit "$failed"
