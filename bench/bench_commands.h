// Each `strata bench NAME` subcommand registers itself on the `bench` app here.
#pragma once

#include <CLI/CLI.hpp>

namespace strata::bench {

// Adds `bench io` (sequential NVMe write/read through the engine, optionally beside fio).
void add_io_command(CLI::App& bench);

// Adds `bench adam` (CPU AdamW updates/s beside a triad bandwidth bound and torch.optim.AdamW).
void add_adam_command(CLI::App& bench);

// Adds `bench optimizer` (the optimizer step over NVMe states: pipelined against serial per
// sub-group, beside each stage alone).
void add_optimizer_command(CLI::App& bench);

// Adds `bench pool` (a recorded run's pinned requests replayed through the runtime's recycler and
// the adaptive, zero-infinity and pow2 pools: pinned bytes reserved and allocation cost).
void add_pool_command(CLI::App& bench);

// Adds `bench pinned-map` (the cost of making and unmaking one pinned buffer, huge pages against
// small ones).
void add_pinned_map_command(CLI::App& bench);

// Adds `bench copy` (copies between pinned host memory and the device, emulated or CUDA, each
// direction alone and both at once, beside memcpy).
void add_copy_command(CLI::App& bench);

// Adds `bench finetune` (training steps through the C API: Strata against ZeRO-Infinity, each in
// its own process; peak host memory and step time).
void add_finetune_command(CLI::App& bench);

}  // namespace strata::bench
