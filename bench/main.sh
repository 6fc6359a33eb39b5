#!/usr/bin/env bash
# The README's main command: set up, build, and run the main job on its defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
bash cmake/bootstrap.sh
# The main job: the same fine-tuning steps of a llama-2-70b-shaped model (scaled to finish in about
# five minutes on 2 cores) done ZeRO-Infinity's way and Strata's way, each in its own process,
# with peak host memory, step time and NVMe traffic side by side (docs/results.md).
exec build/runtime/cli/strata bench finetune --model llama-2-70b --strategy both "$@"
