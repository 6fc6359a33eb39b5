#!/usr/bin/env bash
# Formatting and lint, run by .ci/run after the main suite (docs/reliability.md, "Lint"):
#  1. clang-format: every C and C++ source in git matches .clang-format (nothing is rewritten);
#  2. clang-tidy: every translation unit of runtime/, app/ and bench/ in the build's
#     compile_commands.json passes .clang-tidy, whose warnings are errors.
# STRATA_LINT_STAGES="format" (or "tidy") runs one; the build must exist for tidy (run-all.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${STRATA_BUILD_DIR:-build}
stages=${STRATA_LINT_STAGES:-format tidy}

for stage in $stages; do
  start=$SECONDS
  case $stage in
    format)
      mapfile -t files < <(git ls-files '*.h' '*.hpp' '*.c' '*.cpp' '*.cu')
      clang-format --dry-run --Werror "${files[@]}"
      echo "strata lint: clang-format clean over ${#files[@]} files in $((SECONDS - start)) s"
      ;;
    tidy)
      if [ ! -f "$BUILD_DIR/compile_commands.json" ]; then
        echo "strata lint: $BUILD_DIR/compile_commands.json is missing: build first" >&2
        exit 1
      fi
      # CUDA sources are compiled by nvcc with flags clang-tidy does not take; their host code
      # is small and checked by the CUDA build itself.
      run-clang-tidy -quiet -p "$BUILD_DIR" -j "$(nproc)" \
        "$PWD/(runtime|app|bench)/.*\.cpp$" 2>&1 | sed 's/\x1b\[[0-9;]*m//g' > "$BUILD_DIR/clang-tidy.log" || true
      if grep -E "(warning|error): " "$BUILD_DIR/clang-tidy.log" | grep -v "^Suppressed" >/dev/null; then
        grep -E -A3 "(warning|error): " "$BUILD_DIR/clang-tidy.log" | head -200 >&2
        echo "strata lint: clang-tidy found problems (all of them in $BUILD_DIR/clang-tidy.log)" >&2
        exit 1
      fi
      echo "strata lint: clang-tidy clean in $((SECONDS - start)) s"
      ;;
    *)
      echo "strata lint: unknown stage '$stage' (format, tidy)" >&2
      exit 2
      ;;
  esac
done
