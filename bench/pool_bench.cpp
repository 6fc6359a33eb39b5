// `strata bench pool`: the pinned bytes each buffer-pool policy reserves to stage one model's
// tensors, beside the bytes that are really in flight.
//
// "Requested" is the same for every policy: the most bytes of tensors in flight at once when a
// training step is staged with the given lookahead (staging.h: the windows of W consecutive
// visits through forward, backward and the optimizer, for the selected tensor kinds). Each policy
// then builds a real BufferPool over a real PinnedArena (pages left untouched, so a 70B model's
// buffers cost no RAM here) and is driven through every window of the step, acquiring and
// releasing as the prefetcher does; "reserved" is the arena's peak of mapped bytes. So the
// figures are what each policy pins to stage exactly the same tensors at exactly the same times.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_commands.h"
#include "common/report.h"
#include "common/units.h"
#include "memory/buffer_pool.h"
#include "memory/pinned_arena.h"
#include "memory/pool_policy.h"
#include "memory/staging.h"
#include "memory/staging_replay.h"
#include "model/inventory.h"
#include "model/model_config.h"

namespace strata::bench {
namespace {

using memory::PoolPolicy;

struct PoolBenchArgs {
  std::string model;
  uint32_t lookahead = 2;
  std::string kinds = "parameter";
  uint32_t buffer_count = 5;
  double buffer_size = 1e8;
  bool json = false;
};

struct PolicyResult {
  std::string name;
  uint64_t reserved = 0;
  uint64_t requested = 0;
  uint32_t buffers = 0;
  uint64_t deferred = 0;
  uint64_t unstaged = 0;
  double overhead() const {
    return requested > 0 ? static_cast<double>(reserved) / static_cast<double>(requested) : 0.0;
  }
};

[[noreturn]] void fail(const Status& status) {
  std::fprintf(stderr, "strata bench pool: %s\n", status.message().c_str());
  throw CLI::RuntimeError(1);
}

// Builds the policy's pool on a dry arena (pages never touched) and replays the step through it.
PolicyResult measure(const std::string& name, const memory::PoolOptions& options,
                     std::span<const memory::StagedTensor> tensors,
                     std::span<const memory::Window> windows) {
  memory::PinnedArenaOptions arena_options;
  arena_options.budget_bytes = uint64_t{1} << 50;  // the policies are compared, not limited
  arena_options.lock_pages = false;
  arena_options.bind_numa = false;
  auto arena = memory::PinnedArena::create(arena_options);
  if (!arena.is_ok()) fail(arena.status());
  auto pool = memory::BufferPool::create(**arena, tensors, options);
  if (!pool.is_ok()) fail(std::move(pool).take_status().with_context(name));
  auto replay = memory::replay_step(**pool, tensors, windows);
  if (!replay.is_ok()) fail(std::move(replay).take_status().with_context(name));

  PolicyResult r;
  r.name = name;
  r.reserved = (*arena)->stats().peak_reserved_bytes;
  r.requested = (*pool)->plan().requested_bytes;
  r.buffers = (*pool)->stats().buffers;
  r.deferred = replay->deferred;
  r.unstaged = replay->unstaged_at_use;
  return r;
}

void run_pool_bench(const PoolBenchArgs& args) {
  Result<ModelConfig> config = load_model(args.model);
  if (!config.is_ok()) fail(config.status());
  Result<memory::KindMask> kinds = memory::parse_kind_mask(args.kinds);
  if (!kinds.is_ok()) fail(kinds.status());
  if (args.buffer_size < 1) fail(invalid_argument("--buffer-size must be >= 1 element"));

  const std::vector<TensorSpec> inventory = build_inventory(*config, InventoryOptions{});
  const std::vector<memory::StagedTensor> tensors = memory::staged_tensors(inventory, *kinds);
  if (tensors.empty()) fail(invalid_argument("the model has no tensors of kinds " + args.kinds));
  const std::vector<memory::Window> windows = memory::staging_windows(tensors, args.lookahead);

  memory::PoolOptions base;
  base.lookahead = args.lookahead;
  base.zero_buffer_count = args.buffer_count;
  base.zero_buffer_size_elements = static_cast<uint64_t>(args.buffer_size);

  std::vector<PolicyResult> results;
  for (PoolPolicy policy : {PoolPolicy::kStrata, PoolPolicy::kZeroInfinity, PoolPolicy::kPow2}) {
    memory::PoolOptions o = base;
    o.policy = policy;
    results.push_back(measure(memory::to_string(policy), o, tensors, windows));
  }
  if (args.json) {
    nlohmann::ordered_json policies = nlohmann::ordered_json::array();
    for (const PolicyResult& r : results) {
      policies.push_back({{"policy", r.name},
                          {"reserved_bytes", r.reserved},
                          {"requested_bytes", r.requested},
                          {"overhead", r.overhead()}});
    }
    const nlohmann::ordered_json out = {{"model", config->name}, {"policies", policies}};
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }

  // Two variants for context, in the table only: strata sized so that no acquire ever waits,
  // and DeepSpeed's block as torch's pin_memory() really pins it (rounded to a power of two).
  memory::PoolOptions strict = base;
  strict.no_waiting = true;
  const PolicyResult strata_strict = measure("strata, no waits", strict, tensors, windows);
  memory::PoolOptions deepspeed = base;
  deepspeed.policy = PoolPolicy::kZeroInfinity;
  deepspeed.zero_pow2_block = true;
  const PolicyResult zero_pinned =
      measure("zero-infinity, pow2 block", deepspeed, tensors, windows);

  std::printf("strata bench pool: %s, kinds %s, lookahead %u visits, %zu tensors staged\n",
              config->name.c_str(), memory::kind_mask_string(*kinds).c_str(), args.lookahead,
              tensors.size());
  std::printf(
      "requested = the most bytes of tensors in flight at once along the step (the same "
      "windows for every policy)\n\n");
  Table table({"policy", "reserved", "requested", "overhead", "vs strata", "buffers", "deferred"});
  const double strata_reserved = static_cast<double>(results.front().reserved);
  auto add = [&](const PolicyResult& r) {
    table.add_row({r.name, format_bytes(r.reserved), format_bytes(r.requested),
                   fixed(r.overhead(), 4), fixed(static_cast<double>(r.reserved) / strata_reserved),
                   std::to_string(r.buffers), std::to_string(r.deferred)});
  };
  for (const PolicyResult& r : results) add(r);
  add(strata_strict);
  add(zero_pinned);
  std::printf("%s", table.render().c_str());
  std::printf(
      "\ndeferred: acquires that waited for a release (that tensor's fetch starts one visit "
      "later); no tensor was missing when its visit ran: %s\n",
      results.front().unstaged + strata_strict.unstaged == 0 ? "yes" : "NO");
}

}  // namespace

void add_pool_command(CLI::App& bench) {
  auto args = std::make_shared<PoolBenchArgs>();
  CLI::App* pool = bench.add_subcommand(
      "pool",
      "Pinned bytes each buffer-pool policy (strata, zero-infinity, pow2) reserves to "
      "stage a model, against the bytes in flight");
  pool->add_option("--model", args->model, "A model preset (llama-2-70b, ...) or a config.json")
      ->required();
  pool->add_option("--lookahead", args->lookahead, "Visits (layers) in flight at once")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1024u));
  pool->add_option("--kinds", args->kinds,
                   "Tensor kinds staged: parameter, gradient, fp32_master, adam_m, adam_v "
                   "(comma-separated) or all")
      ->capture_default_str();
  pool->add_option("--buffer-count", args->buffer_count,
                   "zero-infinity: DeepSpeed's offload_param.buffer_count (minimum slots)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 20));
  pool->add_option("--buffer-size", args->buffer_size,
                   "zero-infinity: DeepSpeed's offload_param.buffer_size in elements (raised to "
                   "the largest tensor, as DeepSpeed requires)")
      ->capture_default_str();
  pool->add_flag("--json", args->json, "Print one JSON object instead of a table");
  pool->callback([args] { run_pool_bench(*args); });
}

}  // namespace strata::bench
