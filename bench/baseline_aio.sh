#!/usr/bin/env bash
# A STRATA_BIN for ../shared/tools/deepspeed/aio-compare.sh that measures the DeepSpeed
# baseline's own aio handle (bench/finetune/deepspeed_aio.h, what `strata bench finetune`'s
# DeepSpeed workers move their files with) instead of Strata's engine, beside DeepSpeed's real
# csrc/aio on the same disk at the same settings:
#
#   ../shared/tools/deepspeed/aio-compare.sh bench/baseline_aio.sh --path /var/tmp --qd 8
#
# It runs build/bin/strata (or $STRATA_CLI) with `--engine deepspeed-aio` added to
# `bench io`; every other command passes through unchanged.
set -euo pipefail
strata=${STRATA_CLI:-"$(cd "$(dirname "$0")/.." && pwd)/build/bin/strata"}
if [[ "${1:-}" == bench && "${2:-}" == io ]]; then
  exec "$strata" "$@" --engine deepspeed-aio
fi
exec "$strata" "$@"
