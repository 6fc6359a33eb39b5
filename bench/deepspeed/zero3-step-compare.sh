#!/usr/bin/env bash
# zero3-step-compare.sh: Strata's optimizer step against DeepSpeed's as ZeRO-3 runs it for a
# 16-bit model with the optimizer offloaded to the CPU, both on this machine, alternating.
#
#   bash bench/deepspeed/zero3-step-compare.sh STRATA_BIN [--params N] [--threads T] [--reps R]
#        [--steps S] [--dtype bf16|fp16] [--strata-grad fp32|bf16|fp16]
#
# DeepSpeed's side (ds_zero3_step.cpp beside this script) is its unmodified CPU Adam kernel with
# the two torch operations ZeRO-3 runs around it for every sub-group: the gradient's unscale
# (fp32_grad.mul_) before and the 16-bit weight copy (fp16_flat.copy_(fp32_flat)) after
# (deepspeed/runtime/zero/stage3.py:2117-2123 at 0.16.5, cited line by line in the .cpp).
# Strata's side is `STRATA_BIN bench adam --grad-dtype G --param-out D`: one pass that reads the
# 16-bit gradient and writes the master, the states and the 16-bit weights (docs/optimizer.md).
# Both sides produce the same things from the same inputs: the updated fp32 master, exp_avg and
# exp_avg_sq, and the model-dtype weights the next forward reads.
#
# DeepSpeed's sources and build helpers come from ../shared/tools/deepspeed (DS_TOOLS to point
# elsewhere): the same unmodified files, checksums and flags as adam-compare.sh there. Without
# them this script exits 1 and says so. Last line of stdout: one JSON object (ratios > 1: Strata
# faster; each ratio is the median of the per-rep paired ratios).
if [ -z "${BASH_VERSION:-}" ]; then exec bash "$0" "$@"; fi
set -euo pipefail

HERE=$(cd "$(dirname "$(readlink -f "$0")")" && pwd -P)
DS_TOOLS=${DS_TOOLS:-$HERE/../../../shared/tools/deepspeed}
if [[ ! -f "$DS_TOOLS/harness/common.sh" || ! -d "$DS_TOOLS/src/csrc/adam" ]]; then
  echo "zero3-step-compare: DeepSpeed's sources and build helpers are not at $DS_TOOLS" \
    "(../shared/tools/deepspeed beside the checkout; set DS_TOOLS to their folder)" >&2
  exit 1
fi
# shellcheck disable=SC2034 # DS_TOOL names this tool in common.sh's messages
DS_TOOL=zero3-step-compare
DS_ROOT=$(cd "$DS_TOOLS" && pwd -P)
# shellcheck source=/dev/null
. "$DS_ROOT/harness/common.sh"

usage() {
  cat <<EOF
usage: $0 STRATA_BIN [--params N] [--threads T] [--reps R] [--steps S] [--dtype D] [--strata-grad G]

Builds DeepSpeed $(ds_version_field version)'s CPU Adam with ZeRO-3's per-sub-group step around it
(once, cached) and alternates R times with STRATA_BIN bench adam.

  --params N        parameters per step, decimal K/M/G suffixes like Strata's (default 32M)
  --threads T       threads for both sides (OMP_NUM_THREADS and torch's for DeepSpeed; default 1)
  --reps R          alternations (default 3)
  --steps S         timed steps per run after 2 warm-up steps (default 10)
  --dtype D         the model's 16-bit dtype, bf16 or fp16: the weights both sides write (default bf16)
  --strata-grad G   the gradient Strata reads: the model dtype (default), or fp32 (what DeepSpeed's
                    kernel reads after its backward up-casts each gradient)
EOF
}

[[ $# -ge 1 ]] || { usage >&2; exit 2; }
case "$1" in -h | --help) usage; exit 0 ;; esac
STRATA=$1
shift
PARAMS_ARG=32M THREADS=1 REPS=3 STEPS=10 DTYPE=bf16 STRATA_GRAD=""
while [[ $# -gt 0 ]]; do
  opt=$1 val=""
  case "$opt" in
    -h | --help) usage; exit 0 ;;
    --*=*) val=${opt#*=}; opt=${opt%%=*} ;;
    --*) [[ $# -ge 2 ]] || ds_die "$opt needs a value"; val=$2; shift ;;
    *) ds_die "unexpected argument '$opt' (see --help)" ;;
  esac
  shift
  case "$opt" in
    --params) PARAMS_ARG=$val ;;
    --threads) THREADS=$val ;;
    --reps) REPS=$val ;;
    --steps) STEPS=$val ;;
    --dtype) DTYPE=$val ;;
    --strata-grad) STRATA_GRAD=$val ;;
    *) ds_die "unknown option $opt (see --help)" ;;
  esac
done
PARAMS=$(awk -v s="$PARAMS_ARG" 'BEGIN {
  if (s !~ /^[0-9]+(\.[0-9]+)?[kKmMgG]?$/) exit 1
  m = 1; u = substr(s, length(s), 1)
  if (u ~ /[kK]/) m = 1e3; else if (u ~ /[mM]/) m = 1e6; else if (u ~ /[gG]/) m = 1e9
  if (m > 1) s = substr(s, 1, length(s) - 1)
  n = int(s * m + 0.5); if (n < 1) exit 1; printf "%d\n", n }') ||
  ds_die "--params must be a positive number with an optional K/M/G suffix, got '$PARAMS_ARG'"
[[ "$THREADS" =~ ^[1-9][0-9]*$ ]] || ds_die "--threads must be a positive integer, got '$THREADS'"
[[ "$REPS" =~ ^[1-9][0-9]*$ ]] || ds_die "--reps must be a positive integer, got '$REPS'"
if ! [[ "$STEPS" =~ ^[1-9][0-9]*$ ]] || ((STEPS > 1000)); then
  ds_die "--steps must be an integer from 1 to 1000, got '$STEPS'"
fi
[[ "$DTYPE" == bf16 || "$DTYPE" == fp16 ]] || ds_die "--dtype must be bf16 or fp16, got '$DTYPE'"
STRATA_GRAD=${STRATA_GRAD:-$DTYPE}
[[ "$STRATA_GRAD" == fp32 || "$STRATA_GRAD" == "$DTYPE" ]] ||
  ds_die "--strata-grad must be fp32 or the model dtype $DTYPE, got '$STRATA_GRAD'"
[[ "$STRATA" == */* ]] || STRATA=$(command -v "$STRATA" || printf '%s' "$STRATA")
[[ -x "$STRATA" && ! -d "$STRATA" ]] || ds_die "STRATA_BIN '$STRATA' is not an executable file"
mem_avail=$(($(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo) * 1024))
((mem_avail >= 48 * PARAMS)) ||
  ds_die "$PARAMS parameters need about $((48 * PARAMS >> 20)) MiB free; $((mem_avail >> 20)) MiB available"

ds_require_pkgs g++ libtorch-dev jq
ds_check_sources
ds_check_strata "$STRATA" adam --params --threads --steps --no-torch --grad-dtype --param-out --json
STRATA_ARGS=(bench adam --params "$PARAMS" --threads "$THREADS" --steps "$STEPS" --no-torch
  --grad-dtype "$STRATA_GRAD" --param-out "$DTYPE" --json)

# adam-compare.sh's flags: DeepSpeed's CPU op builder's, plus -D__DISABLE_CUDA__ and -std=c++17.
DS_CXXFLAGS=(-O3 -std=c++17 -g -Wno-reorder -march=native -fopenmp "$(ds_simd_flag)"
  -D__DISABLE_CUDA__ -I"$DS_HARNESS/shim" -I"$DS_SRC/csrc/includes" -I"$DS_TORCH_INCLUDE")
build_step() {
  local out=$1
  ds_compile "$out" "$DS_SRC/csrc/adam/cpu_adam_impl.cpp:" "$HERE/ds_zero3_step.cpp:" &&
    g++ -o "$out/ds_zero3_step" "$out/cpu_adam_impl.o" "$out/ds_zero3_step.o" \
      -ltorch -ltorch_cpu -lc10 -fopenmp >>"$out/build.log" 2>&1 &&
    OMP_NUM_THREADS=1 "$out/ds_zero3_step" 1000 1 bf16 >>"$out/build.log" 2>&1
}
ds_cached_build zero3-step \
  "$(ds_build_key zero3-step "${DS_CXXFLAGS[@]}" "$(sha256sum "$HERE/ds_zero3_step.cpp")")" build_step
DS_BIN=$DS_BUILD_DIR/ds_zero3_step

WORK=$(mktemp -d "${TMPDIR:-/tmp}/strata-zero3-step.XXXXXX")
DS_CLEANUP_PATHS+=("$WORK")
LOAD_START=$(ds_loadavg)
ds_note "$PARAMS params, $THREADS thread(s), $DTYPE model, Strata reads $STRATA_GRAD gradients," \
  "$STEPS steps, $REPS rep(s); load average $LOAD_START"

run_side() {  # SIDE REP
  local side=$1 rep=$2 out="$WORK/$1.$2.json" err="$WORK/$1.$2.err"
  if [[ "$side" == strata ]]; then
    ds_run "$out" "$err" "$STRATA" "${STRATA_ARGS[@]}" ||
      ds_die "'$STRATA ${STRATA_ARGS[*]}' failed (exit $?): $(tail -n 5 "$err")"
  else
    ds_run "$out" "$err" env OMP_NUM_THREADS="$THREADS" "$DS_BIN" "$PARAMS" "$STEPS" "$DTYPE" ||
      ds_die "DeepSpeed's step failed (exit $?): $(tail -n 5 "$err")"
  fi
}

declare -a R_DS R_KERNEL R_STRATA Q_STEP Q_KERNEL LOADS
for ((rep = 1; rep <= REPS; rep++)); do
  LOADS+=("$(ds_loadavg)")
  if ((rep % 2)); then order=(deepspeed strata); else order=(strata deepspeed); fi
  for side in "${order[@]}"; do run_side "$side" "$rep"; done
  ds=$(ds_json "$WORK/deepspeed.$rep.json" .mparams_per_s)
  kernel=$(ds_json "$WORK/deepspeed.$rep.json" .kernel_mparams_per_s)
  strata=$(ds_json "$WORK/strata.$rep.json" .strata_mparams_per_s)
  R_DS+=("$ds") R_KERNEL+=("$kernel") R_STRATA+=("$strata")
  Q_STEP+=("$(ds_ratio "$strata" "$ds")") Q_KERNEL+=("$(ds_ratio "$strata" "$kernel")")
  ds_note "rep $rep/$REPS: DeepSpeed step $(ds_fmt "$ds" 0) (its kernel $(ds_fmt "$kernel" 0))," \
    "Strata $(ds_fmt "$strata" 0) Mparams/s"
done
LOAD_END=$(ds_loadavg)
M_DS=$(ds_median "${R_DS[@]}")
M_KERNEL=$(ds_median "${R_KERNEL[@]}")
M_STRATA=$(ds_median "${R_STRATA[@]}")
M_Q_STEP=$(ds_median "${Q_STEP[@]}")
M_Q_KERNEL=$(ds_median "${Q_KERNEL[@]}")
first=$WORK/deepspeed.1.json
split=$(jq -r 'def ms: . * 1e4 | round / 10 | tostring + " ms";
  "unscale \(.unscale_median_s | ms), kernel \(.kernel_median_s | ms), copy \(.copy_median_s | ms), first rep"' "$first")

printf '\nDeepSpeed %s (%s) ZeRO-3 CPU step vs %s bench adam\n' "$(ds_version_field version)" \
  "$(ds_version_field commit | cut -c1-9)" "$STRATA"
printf '%s params, %s thread(s), %s model; DeepSpeed: mul_ + CPU Adam (%s) + copy_ to %s (%s);\n' \
  "$PARAMS" "$THREADS" "$DTYPE" "$(jq -r .simd "$first")" "$DTYPE" "$split"
printf 'Strata: one pass, %s gradients in, %s weights out (%s); median of %s steps, %s reps\n\n' \
  "$STRATA_GRAD" "$DTYPE" "$(jq -r '.simd // "?"' "$WORK/strata.1.json")" "$STEPS" "$REPS"
printf '%-6s %5s  %13s %15s %11s   %14s %16s\n' rep load 'DS step Mp/s' 'DS kernel Mp/s' \
  'Strata Mp/s' 'Strata/DS step' 'Strata/DS kernel'
row() {
  printf '%-6s %5s  %13s %15s %11s   %14s %16s\n' "$1" "$2" "$(ds_fmt "$3" 0)" "$(ds_fmt "$4" 0)" \
    "$(ds_fmt "$5" 0)" "$(ds_fmt "$6" 2)" "$(ds_fmt "$7" 2)"
}
for ((i = 0; i < REPS; i++)); do
  row "$((i + 1))" "${LOADS[i]}" "${R_DS[i]}" "${R_KERNEL[i]}" "${R_STRATA[i]}" "${Q_STEP[i]}" "${Q_KERNEL[i]}"
done
row median '' "$M_DS" "$M_KERNEL" "$M_STRATA" "$M_Q_STEP" "$M_Q_KERNEL"
printf '\nRatios > 1: Strata is faster. "DS kernel" is the kernel part of DeepSpeed'"'"'s step alone.\n'
printf 'load average %s at start, %s at end (%s CPUs)\n' "$LOAD_START" "$LOAD_END" "$(nproc)"
ds_load_warning "$LOAD_START"
printf '\n'
jq -cn --argjson params "$PARAMS" --argjson threads "$THREADS" --argjson reps "$REPS" \
  --argjson steps "$STEPS" --arg dtype "$DTYPE" --arg strata_grad "$STRATA_GRAD" \
  --argjson ds "$M_DS" --argjson kernel "$M_KERNEL" --argjson strata "$M_STRATA" \
  --argjson q_step "$M_Q_STEP" --argjson q_kernel "$M_Q_KERNEL" \
  --argjson load "$LOAD_START" --argjson load_end "$LOAD_END" \
  --arg ds_version "$(ds_version_field version)" --arg ds_commit "$(ds_version_field commit)" \
  '{params: $params, threads: $threads, reps: $reps, steps: $steps, dtype: $dtype,
    strata_grad_dtype: $strata_grad, deepspeed_step_mparams_per_s: $ds,
    deepspeed_kernel_mparams_per_s: $kernel, strata_mparams_per_s: $strata,
    strata_over_deepspeed_step: $q_step, strata_over_deepspeed_kernel: $q_kernel,
    load_average: $load, load_average_end: $load_end,
    deepspeed_version: $ds_version, deepspeed_commit: $ds_commit}'
