// Each `strata bench NAME` subcommand registers itself on the `bench` app here.
#pragma once

#include <CLI/CLI.hpp>

namespace strata::bench {

// Adds `bench io` (sequential NVMe write/read through the engine, optionally beside fio).
void add_io_command(CLI::App& bench);

}  // namespace strata::bench
