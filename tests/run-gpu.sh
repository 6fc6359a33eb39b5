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
#            (STRATA_TEST_DEVICE=cuda); each file with a 150 s limit
#   measure  the main job on the GPU (`strata bench finetune --strategy strata --compute gpu`)
#            and, right after it on the same directory, the disk (`strata bench io --mixed`), its
#            LoRA and QLoRA runs on the GPU, and the CPU Adam rate: what `bench/planner_vs_measured.sh` needs to plan the same shape
#            (run it with the saved JSON and NVME_RATES / ADAM_GPARAMS, docs/planner.md)
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

if wants measure; then
  measured=$OUT_DIR/finetune-gpu.json
  if timeout 200 "$BUILD/bin/strata" bench finetune --model llama-2-70b --strategy strata \
    --compute gpu --gpu "${GPU_PRESET:-h200}" --nvme "$scratch" --steps 4 --json \
    >"$measured" 2>"$OUT_DIR/finetune-gpu.log"; then
    record PASS finetune-gpu "$("$PYTHON" -c '
import json, sys
j = json.load(open(sys.argv[1]))
print("; ".join(s["name"] + " steps " + " ".join("%.2f" % x["seconds"] for x in s["steps"]) + " s"
                for s in j["strategies"]))' "$measured")"
    # The disk as bench/planner_vs_measured.sh measures it: two files, each half the most NVMe
    # bytes one of the run's steps read, in whole GiB.
    io_size=$("$PYTHON" -c '
import json, math, sys
j = json.load(open(sys.argv[1]))
strata = next(x for x in j["strategies"] if x["name"] == "strata")
print(max(1, math.ceil(max(s["runtime_nvme_read_bytes"] for s in strata["steps"]) / 2 / 2**30)))' \
      "$measured")
    if timeout 90 "$BUILD/bin/strata" bench io --path "$scratch" --size "${io_size}G" --block 1M \
      --qd 8 --rounds 1 --mixed --json >"$OUT_DIR/io.json" 2>"$OUT_DIR/io.log"; then
      record PASS bench-io "$("$PYTHON" -c '
import json, sys
j = json.load(open(sys.argv[1]))
print("NVME_RATES=%.4f/%.4f (alone %.3f / %.3f, at once %.3f / %.3f GB/s)" % (
    j["half_duplex_read_gbps"], j["half_duplex_write_gbps"], j["read_gbps"], j["write_gbps"],
    j["mixed_read_gbps"], j["mixed_write_gbps"]))' "$OUT_DIR/io.json")"
    else
      record FAIL bench-io "$(tail -2 "$OUT_DIR/io.log" | tr '\n' ' ')"
      failed=1
    fi
  else
    record FAIL finetune-gpu "$(tail -3 "$OUT_DIR/finetune-gpu.log" | tr '\n' ' ')"
    failed=1
  fi
  # LoRA and QLoRA on the GPU: a frozen base streamed from NVMe (QLoRA's in NF4, dequantized by
  # strata_nf4_dequantize_cuda on the compute stream), the adapters trained.
  for method in lora qlora; do
    if timeout 90 "$BUILD/bin/strata" bench finetune --model llama-2-70b --method "$method" \
      --compute gpu --gpu "${GPU_PRESET:-h200}" --nvme "$scratch" --steps 4 --json \
      >"$OUT_DIR/finetune-gpu-$method.json" 2>"$OUT_DIR/finetune-gpu-$method.log"; then
      record PASS "finetune-gpu-$method" "$("$PYTHON" -c '
import json, sys
j = json.load(open(sys.argv[1]))
print("; ".join(s["name"] + " steps " + " ".join("%.3f" % x["seconds"] for x in s["steps"])
                + " s, NVMe written " + " ".join("%.2f" % (x["runtime_nvme_write_bytes"] / 2**20)
                                                 for x in s["steps"]) + " MiB"
                for s in j["strategies"]))' "$OUT_DIR/finetune-gpu-$method.json")"
    else
      record FAIL "finetune-gpu-$method" "$(tail -3 "$OUT_DIR/finetune-gpu-$method.log" | tr '\n' ' ')"
      failed=1
    fi
  done
  if timeout 40 "$BUILD/bin/strata" bench adam --params 50M --grad-dtype bf16 --param-out bf16 \
    --no-torch --json >"$OUT_DIR/adam.json" 2>"$OUT_DIR/adam.log"; then
    record PASS bench-adam "ADAM_GPARAMS=$("$PYTHON" -c '
import json, sys
print(json.load(open(sys.argv[1]))["strata_mparams_per_s"] / 1e3)' "$OUT_DIR/adam.json")"
  else
    record FAIL bench-adam "$(tail -2 "$OUT_DIR/adam.log" | tr '\n' ' ')"
    failed=1
  fi
fi
echo "== summary ($OUT_DIR/summary.txt)"
cat "$summary"
exit "$failed"
