#!/usr/bin/env bash
# The README's main command: set up, build, and run the main job on its defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
bash cmake/bootstrap.sh
exec build/runtime/cli/strata bench io --path build --compare-fio "$@"
