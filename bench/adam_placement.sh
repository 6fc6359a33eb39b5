#!/usr/bin/env bash
# The CPU AdamW kernel at several code placements: builds `strata` once per STRATA_OPTIM_CODE_PAD
# (bytes jumped over at the top of each SIMD kernel's body, so its loop moves by as much), then
# times `strata bench adam` for each configuration with every placement in turn, rotating which
# placement goes first, and prints a Markdown table of M params/s. On an AMD family 26 guest the
# same kernel ran at half its rate or at full rate by where the linker put it (docs/optimizer.md,
# "Code placement"): a kernel change is kept only if it wins at every placement.
#
#   bash bench/adam_placement.sh                 # build/, pads 0 64 .. 448, the default configs
#   PADS="0 128 256 384" ROUNDS=3 bash bench/adam_placement.sh BUILD_DIR
#   CONFIGS="--params 50M --threads 2;--params 32M --threads 1" bash bench/adam_placement.sh
#
# Each pad rebuilds only the two kernel files and relinks; on exit the build is put back to pad 0
# (the release layout). Benchmarks run under flock $LOCK so that they never overlap another one.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
PADS=${PADS:-0 64 128 192 256 320 384 448}
ROUNDS=${ROUNDS:-2}
LOCK=${LOCK:-/tmp/strata-bench.lock}
CONFIGS=${CONFIGS:-"--params 32M --threads 1;--params 32M --threads 2;--params 50M --threads 1;\
--params 50M --threads 2;--params 50M --threads 2 --grad-dtype bf16 --param-out bf16"}
[ -f "$BUILD/CMakeCache.txt" ] || { echo "adam_placement.sh: $BUILD is not a configured build" >&2; exit 2; }
for pad in $PADS; do
  case $pad in '' | *[!0-9]*) echo "adam_placement.sh: PADS must be byte counts, not '$pad'" >&2; exit 2 ;; esac
done

work=$(mktemp -d)
restore() {
  cmake -S . -B "$BUILD" -DSTRATA_OPTIM_CODE_PAD=0 >/dev/null &&
    cmake --build "$BUILD" --target strata_cli >/dev/null
  rm -rf "$work"
}
trap restore EXIT

for pad in $PADS; do
  echo "building with STRATA_OPTIM_CODE_PAD=$pad" >&2
  cmake -S . -B "$BUILD" -DSTRATA_OPTIM_CODE_PAD="$pad" >/dev/null
  cmake --build "$BUILD" --target strata_cli >/dev/null
  cp "$BUILD/bin/strata" "$work/strata-$pad"
done

flock "$LOCK" python3 - "$work" "$ROUNDS" "$CONFIGS" "$PADS" <<'PY'
import json, statistics, subprocess, sys

work, rounds, configs, pads = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4].split()
configs = [c.split() for c in configs.split(";") if c.strip()]
rates = {}
for r in range(rounds):
    for ci, config in enumerate(configs):
        order = pads[r % len(pads):] + pads[:r % len(pads)]
        for pad in order:
            run = subprocess.run([f"{work}/strata-{pad}", "bench", "adam", "--steps", "10",
                                  "--no-torch", "--json"] + config,
                                 capture_output=True, text=True, check=True)
            rates.setdefault((ci, pad), []).append(json.loads(run.stdout)["strata_mparams_per_s"])
print(f"`strata bench adam --steps 10 --no-torch` + the configuration; M params/s, median (min-max) "
      f"of {rounds} round(s); pad: bytes before the kernel's body")
print()
print("| configuration | " + " | ".join(f"pad {p}" for p in pads) + " | slowest / fastest median |")
print("| --- |" + " --- |" * (len(pads) + 1))
for ci, config in enumerate(configs):
    medians = [statistics.median(rates[(ci, p)]) for p in pads]
    cells = [f"{statistics.median(rates[(ci, p)]):.0f} ({min(rates[(ci, p)]):.0f}-{max(rates[(ci, p)]):.0f})"
             for p in pads]
    print(f"| {' '.join(config)} | " + " | ".join(cells) + f" | {min(medians) / max(medians):.2f} |")
PY
