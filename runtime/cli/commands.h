// Top-level `strata` subcommands that are not benchmarks.
#pragma once

#include <CLI/CLI.hpp>

namespace strata::cli {

// `strata doctor`: what a user needs to know about this machine before a long run.
void add_doctor_command(CLI::App& app);

// `strata plan`: fit, host RAM, NVMe, step time and cost of a fine-tuning job per GPU preset.
void add_plan_command(CLI::App& app);

}  // namespace strata::cli
