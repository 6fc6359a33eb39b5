#!/usr/bin/env bash
# bench/deepspeed/zero3-step-compare.sh end to end on a small step: it builds DeepSpeed's kernel
# with ZeRO-3's step around it, runs both sides, and DeepSpeed's side checks its own result (the
# master against a double-precision AdamW, the 16-bit copy against the rounded master: exit 3
# otherwise, which the script reports as a failure). No timing is checked. Misuse exits 1 with a
# message before anything is built.
#
#   zero3_step_compare_check.sh STRATA_BIN
#
# Exit 77 (skipped) where DeepSpeed's sources (../shared/tools/deepspeed) or Debian's
# libtorch-dev are missing: the script would install 1.5 GB of packages, which a test must not.
set -euo pipefail
strata=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
script=$root/bench/deepspeed/zero3-step-compare.sh
tools=${DS_TOOLS:-$root/../shared/tools/deepspeed}
if [[ ! -f "$tools/harness/common.sh" ]]; then
  echo "SKIP: DeepSpeed's sources are not at $tools (../shared/tools/deepspeed beside the checkout)"
  exit 77
fi
if [[ "$(dpkg-query -W -f='${Status}' libtorch-dev 2>/dev/null)" != "install ok installed" ]] ||
  ! command -v jq >/dev/null; then
  echo "SKIP: libtorch-dev or jq is not installed (the comparison would apt-get them)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export STRATA_DS_TOOLS_CACHE=${STRATA_DS_TOOLS_CACHE:-/var/tmp/strata-ds-tools}

fail() { echo "FAIL: $*" >&2; exit 1; }

# Misuse: a clear message and exit 1, nothing run.
expect_misuse() {  # EXPECTED_TEXT ARGS...
  local want=$1 rc=0
  shift
  bash "$script" "$strata" "$@" >"$work/out" 2>"$work/err" || rc=$?
  [[ $rc -eq 1 ]] || fail "$* exited $rc, not 1"
  grep -q -- "$want" "$work/err" || fail "$*: no '$want' in: $(cat "$work/err")"
}
expect_misuse "--dtype must be bf16 or fp16" --dtype fp32
expect_misuse "--strata-grad must be fp32 or the model dtype bf16" --strata-grad fp16
expect_misuse "--params must be a positive number" --params -5
bash "$script" "$work/no-such-strata" >/dev/null 2>"$work/err" && fail "ran without STRATA_BIN"
grep -q "is not an executable file" "$work/err" || fail "no message for a missing STRATA_BIN"
DS_TOOLS=$work/none bash "$script" "$strata" >/dev/null 2>"$work/err" && fail "ran without DS_TOOLS"
grep -q "DeepSpeed's sources and build helpers are not at" "$work/err" ||
  fail "no message for missing sources: $(cat "$work/err")"

for dtype in bf16 fp16; do
  for grad in "$dtype" fp32; do
    bash "$script" "$strata" --params 300K --threads 1 --reps 2 --steps 1 --dtype "$dtype" \
      --strata-grad "$grad" >"$work/out" 2>"$work/err" ||
      fail "--dtype $dtype --strata-grad $grad exited $?: $(tail -n 5 "$work/err")"
    tail -n 1 "$work/out" >"$work/json"
    jq -e --arg d "$dtype" --arg g "$grad" '.params == 300000 and .threads == 1 and .reps == 2
      and .dtype == $d and .strata_grad_dtype == $g and .deepspeed_step_mparams_per_s > 0
      and .deepspeed_kernel_mparams_per_s > .deepspeed_step_mparams_per_s
      and .strata_mparams_per_s > 0 and .strata_over_deepspeed_step > 0
      and .deepspeed_version == "0.16.5"' "$work/json" >/dev/null ||
      fail "--dtype $dtype --strata-grad $grad: unexpected JSON $(cat "$work/json")"
  done
done
echo "zero3-step-compare: misuse rejected; bf16 and fp16 steps run and verified"
