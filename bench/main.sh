#!/usr/bin/env bash
# The README's main command: set up, build, and run the main job on its defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
bash cmake/bootstrap.sh
# The main job: the same fine-tuning steps of a llama-2-70b-shaped model (scaled so that its five
# workers finish in about six minutes on 2 cores) done by Strata and by DeepSpeed ZeRO-3 in its
# three labelled configurations, each in its own process, under the same training semantics,
# with peak host memory, step time and NVMe traffic side by side (docs/results.md).
exec build/bin/strata bench finetune --model llama-2-70b --strategy both "$@"
