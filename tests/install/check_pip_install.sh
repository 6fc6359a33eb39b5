#!/usr/bin/env bash
# `pip install` of bindings/python, as docs/pytorch.md tells a user with their own environment:
# a venv made from Debian's interpreter with --system-site-packages (for python3-torch), the
# package installed offline with --no-build-isolation, then imported from another directory
# with no STRATA_LIBRARY and no PYTHONPATH: it must load the libstrata.so it carries.
# Usage: tests/install/check_pip_install.sh LIBSTRATA_SO [PYTHON]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
library=$(realpath "${1:?usage: check_pip_install.sh LIBSTRATA_SO [PYTHON]}")
python=${2:-/usr/bin/python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/strata-pip.XXXXXX")
trap 'rm -rf "$work"' EXIT

"$python" -m venv --system-site-packages "$work/venv"
STRATA_LIBRARY=$library "$work/venv/bin/python" -m pip install --no-build-isolation --no-index \
  --no-cache-dir --quiet "$root/bindings/python"

mkdir -p "$work/elsewhere/nvme"
cd "$work/elsewhere"
env -u STRATA_LIBRARY -u PYTHONPATH "$work/venv/bin/python" - "$work/venv" <<'PY'
import os, sys
import numpy as np
import strata
import strata.torch  # needs the environment's torch

venv = os.path.realpath(sys.argv[1])
assert os.path.realpath(strata.__file__).startswith(venv), f"strata imported from {strata.__file__}"
assert os.path.realpath(strata.library_path).startswith(venv), f"library from {strata.library_path}"
with strata.Runtime(nvme_path="nvme", nvme_capacity_bytes=16 << 20, pinned_budget_bytes=4 << 20,
                    device_budget_bytes=4 << 20) as rt:
    t = rt.register("pip.weight", nbytes=4096, dtype="f32", home="nvme")
    data = np.arange(1024, dtype=np.float32)
    t.write(data)
    assert np.array_equal(t.read(), data)
assert os.listdir("nvme") == [], os.listdir("nvme")
print(f"strata {strata.version()} from {strata.library_path}: round trip ok")
PY
echo "check_pip_install: ok"
