#!/usr/bin/env bash
# Installs a built tree into a temporary prefix, as a user would (`cmake --install BUILD --prefix
# P`), then builds and runs two programs outside the tree against that prefix alone: one through
# find_package(strata) + strata::strata, one through `pkg-config --cflags --libs strata`. Each
# checks strata_version() and makes a real runtime round trip on a scratch directory.
# Usage: tests/install/check_install.sh BUILD_DIR [VERSION]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: check_install.sh BUILD_DIR [VERSION]}" && pwd)
version=${2:-$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")}
work=$(mktemp -d "${TMPDIR:-/tmp}/strata-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
nvme=$work/nvme
mkdir -p "$nvme"

cmake --install "$build" --prefix "$prefix" >"$work/install.log" || {
  cat "$work/install.log" >&2
  exit 1
}
libdir=$(dirname "$(find "$prefix" -name 'libstrata.so' | head -n 1)")
for f in include/strata/strata.h bin/strata; do
  [ -e "$prefix/$f" ] || { echo "check_install: $prefix/$f was not installed" >&2; exit 1; }
done
[ -e "$libdir/cmake/strata/strataConfig.cmake" ] || { echo "check_install: no CMake package" >&2; exit 1; }
[ -e "$libdir/pkgconfig/strata.pc" ] || { echo "check_install: no strata.pc" >&2; exit 1; }

# Nothing from the build tree may leak in: a clean environment but for the prefix.
echo "== find_package(strata) consumer"
cmake -S "$here/cmake_consumer" -B "$work/cmake-build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$work/cmake.log" || { cat "$work/cmake.log" >&2; exit 1; }
cmake --build "$work/cmake-build" >>"$work/cmake.log" || { cat "$work/cmake.log" >&2; exit 1; }
"$work/cmake-build/consumer" "$version" "$nvme"

echo "== pkg-config consumer"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
flags=$(pkg-config --cflags --libs strata)
case "$flags" in
  *"$prefix"*) ;;
  *) echo "check_install: pkg-config flags '$flags' do not name the prefix $prefix" >&2; exit 1 ;;
esac
[ "$(pkg-config --modversion strata)" = "$version" ] || {
  echo "check_install: pkg-config version $(pkg-config --modversion strata), expected $version" >&2
  exit 1
}
# shellcheck disable=SC2086 # the flags are words
cc -std=c11 -Wall -Wextra -Werror "$here/consumer.c" -o "$work/pc-consumer" $flags \
  -Wl,-rpath,"$libdir"
"$work/pc-consumer" "$version" "$nvme"

"$prefix/bin/strata" --version | grep -qx "strata $version" || {
  echo "check_install: installed strata --version is not $version" >&2
  exit 1
}
leftovers=$(ls -A "$nvme")
[ -z "$leftovers" ] || { echo "check_install: left in the NVMe directory: $leftovers" >&2; exit 1; }
echo "check_install: ok ($prefix)"
