#!/usr/bin/env bash
# Installs what is missing (Debian bookworm, as root), then configures and builds Strata.
# Used by both README commands; safe to run again (it installs and rebuilds only what changed).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${STRATA_BUILD_DIR:-build}
packages=(
  build-essential cmake ninja-build pkg-config git
  liburing-dev libaio-dev libhwloc-dev hwloc libboost-dev libxxhash-dev
  nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev
  fio clang clang-format clang-tidy libclang-rt-14-dev
  python3 python3-numpy python3-torch python3-pytest python3-matplotlib
  python3-venv python3-pip python3-setuptools python3-wheel
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "strata: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "strata: run as root (or install these packages yourself): ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${STRATA_CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"

# `import strata` from any shell with Debian's /usr/bin/python3 (the one with python3-torch): a
# .pth file in its local site-packages names bindings/python, which is pure Python and finds
# build/runtime/libstrata.so beside itself (or $STRATA_LIBRARY).
site_dir=$(/usr/bin/python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || true)
if [ -n "$site_dir" ] && { mkdir -p "$site_dir" 2>/dev/null && [ -w "$site_dir" ]; }; then
  echo "$PWD/bindings/python" > "$site_dir/strata.pth"
else
  echo "strata: for 'import strata', export PYTHONPATH=$PWD/bindings/python" >&2
fi
