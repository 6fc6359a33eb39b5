// `strata bench pool --trace FILE`: the runtime's recorded pinned requests (memory/pinned_trace.h,
// written when STRATA_PINNED_TRACE is set) replayed through the runtime's own exact-size recycler
// and, beside it, through the pool policies it is compared with (pool/pool_policy.h): adaptive
// size classes (MemAscend), ZeRO-Infinity's uniform slots and PyTorch's power-of-two caching.
//
// Every policy serves the same requests in the same order, each at once (the pools are sized so
// that none ever waits), so step time would be the same for all but the allocation cost, which
// is measured here too. What differs is the pinned memory each maps: peak reserved bytes on a dry
// arena (nothing touched), against the most bytes the run asked for at once.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench_commands.h"
#include "common/report.h"
#include "common/units.h"
#include "memory/pinned_trace.h"
#include "pool/pool_policy.h"
#include "pool/trace_replay.h"

namespace strata::bench {
namespace {

struct PoolBenchArgs {
  std::string trace;
  uint32_t passes = 5;
  uint32_t buffer_count = 5;
  uint64_t buffer_size = 0;
  std::vector<std::string> recycler_budgets;
  bool json = false;
};

struct PolicyResult {
  std::string name;
  ReplayResult replay;
};

[[noreturn]] void fail(const Status& status) {
  std::fprintf(stderr, "strata bench pool: %s\n", status.message().c_str());
  throw CLI::RuntimeError(1);
}

void run_pool_bench(const PoolBenchArgs& args) {
  Result<memory::PinnedTrace> trace = memory::read_pinned_trace(args.trace);
  if (!trace.is_ok()) fail(trace.status());
  const TraceDemand demand = trace_demand(*trace);
  if (demand.takes == 0) fail(invalid_argument(args.trace + " holds no pinned takes"));
  const ReplayOptions replay{.passes = args.passes};
  PoolOptions options;
  options.zero_buffer_count = args.buffer_count;
  options.zero_buffer_size_bytes = args.buffer_size;

  std::vector<PolicyResult> results;
  std::vector<uint64_t> budgets = {trace->budget_bytes};
  for (const std::string& text : args.recycler_budgets) {
    const std::optional<uint64_t> bytes = parse_bytes(text);
    if (!bytes || *bytes == 0) fail(invalid_argument("--recycler-budget: not a size: " + text));
    budgets.push_back(*bytes);
  }
  for (size_t i = 0; i < budgets.size(); ++i) {
    Result<ReplayResult> r = replay_through_recycler(*trace, budgets[i], replay);
    if (!r.is_ok()) fail(std::move(r).take_status().with_context("recycler"));
    results.push_back({i == 0 ? std::string("recycler (runtime)")
                              : "recycler, budget " + format_bytes(budgets[i]),
                       *r});
  }
  for (PoolPolicy policy : {PoolPolicy::kAdaptive, PoolPolicy::kZeroInfinity, PoolPolicy::kPow2}) {
    Result<PoolPlan> plan = plan_for_trace(*trace, policy, options);
    if (!plan.is_ok()) fail(std::move(plan).take_status().with_context(to_string(policy)));
    Result<ReplayResult> r = replay_through_pool(*trace, *plan, replay);
    if (!r.is_ok()) fail(std::move(r).take_status().with_context(to_string(policy)));
    results.push_back({to_string(policy), *r});
  }

  const ReplayResult& base = results.front().replay;
  auto ratio = [](double value, double against) { return against > 0 ? value / against : 0.0; };
  auto overhead = [&](const ReplayResult& r) {
    return ratio(static_cast<double>(r.peak_reserved_bytes),
                 static_cast<double>(demand.peak_requested_bytes));
  };
  // Mapping as the recorded run paid it, per byte (page clearing and locking grow with the size).
  const double ns_per_mapped_byte =
      ratio(demand.mapped_ns_in_run, static_cast<double>(demand.mapped_bytes_in_run));
  auto mapping_s = [&](double bytes) { return bytes * ns_per_mapped_byte / 1e9; };
  const bool budgeted = trace->budget_bytes != 0;
  auto fits = [&](const ReplayResult& r) {
    return !budgeted || r.peak_reserved_bytes <= trace->budget_bytes;
  };
  if (args.json) {
    nlohmann::ordered_json policies = nlohmann::ordered_json::array();
    for (const PolicyResult& p : results) {
      const ReplayResult& r = p.replay;
      policies.push_back(
          {{"policy", p.name},
           {"peak_reserved_bytes", r.peak_reserved_bytes},
           {"overhead", overhead(r)},
           {"reserved_vs_recycler", ratio(static_cast<double>(r.peak_reserved_bytes),
                                          static_cast<double>(base.peak_reserved_bytes))},
           {"fits_budget", fits(r)},
           {"mapped_cold", r.mapped_first_pass},
           {"mapped_warm", r.mapped_per_later_pass},
           {"mapping_s_cold", mapping_s(static_cast<double>(r.mapped_bytes_first_pass))},
           {"mapping_s_warm", mapping_s(r.mapped_bytes_per_later_pass)},
           {"waits", r.waits},
           {"take_ns", r.take_ns},
           {"give_ns", r.give_ns},
           {"first_pass_take_ns", r.first_pass_take_ns}});
    }
    const nlohmann::ordered_json out = {{"trace", args.trace},
                                        {"budget_bytes", trace->budget_bytes},
                                        {"takes", demand.takes},
                                        {"peak_live", demand.peak_live},
                                        {"peak_requested_bytes", demand.peak_requested_bytes},
                                        {"peak_page_bytes", demand.peak_page_bytes},
                                        {"reused_in_run", demand.reused_in_run},
                                        {"reused_take_ns_in_run", demand.reused_take_ns_in_run},
                                        {"mapped_take_ns_in_run", demand.mapped_take_ns_in_run},
                                        {"mapped_bytes_in_run", demand.mapped_bytes_in_run},
                                        {"mapped_s_in_run", demand.mapped_ns_in_run / 1e9},
                                        {"policies", policies}};
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }

  std::printf(
      "strata bench pool: %s, %llu takes, at most %u buffers and %s asked for at once "
      "(%s in 4 KiB pages), budget %s\n",
      args.trace.c_str(), static_cast<unsigned long long>(demand.takes), demand.peak_live,
      format_bytes(demand.peak_requested_bytes).c_str(),
      format_bytes(demand.peak_page_bytes).c_str(),
      budgeted ? format_bytes(trace->budget_bytes).c_str() : "none");
  std::printf(
      "in the recorded run: %llu of %llu takes reused a kept buffer (%.0f ns each); the others "
      "mapped %s in %.2f s (%.2f ms each)\n\n",
      static_cast<unsigned long long>(demand.reused_in_run),
      static_cast<unsigned long long>(demand.takes), demand.reused_take_ns_in_run,
      format_bytes(demand.mapped_bytes_in_run).c_str(), demand.mapped_ns_in_run / 1e9,
      demand.mapped_take_ns_in_run / 1e6);
  Table table({"policy", "peak reserved", "overhead", "vs recycler", "fits budget", "mapped cold",
               "mapped warm", "mapping s cold", "mapping s warm", "waits", "take ns", "give ns"});
  for (const PolicyResult& p : results) {
    const ReplayResult& r = p.replay;
    table.add_row({p.name, format_bytes(r.peak_reserved_bytes), fixed(overhead(r), 4),
                   fixed(ratio(static_cast<double>(r.peak_reserved_bytes),
                               static_cast<double>(base.peak_reserved_bytes)),
                         3),
                   fits(r) ? "yes" : "no", std::to_string(r.mapped_first_pass),
                   fixed(r.mapped_per_later_pass, 0),
                   fixed(mapping_s(static_cast<double>(r.mapped_bytes_first_pass)), 2),
                   fixed(mapping_s(r.mapped_bytes_per_later_pass), 2), std::to_string(r.waits),
                   fixed(r.take_ns, 0), fixed(r.give_ns, 0)});
  }
  std::printf("%s", table.render().c_str());
  std::printf(
      "\noverhead: peak reserved / most bytes asked for at once. mapped cold / warm: arena "
      "allocations (mmap, mlock, io_uring and, with a GPU, cudaHostRegister) in the first of %u "
      "replays and on average in each later one. mapping s: their bytes at the recorded run's "
      "cost per mapped byte. take / give ns: mean per call after the first replay, on a dry "
      "arena (mapping there is an unlocked mmap).\n",
      args.passes);
}

}  // namespace

void add_pool_command(CLI::App& bench) {
  auto args = std::make_shared<PoolBenchArgs>();
  CLI::App* pool = bench.add_subcommand(
      "pool",
      "Replay a recorded run's pinned requests through the runtime's recycler and the "
      "adaptive, zero-infinity and pow2 pools: pinned bytes and allocation cost of each");
  pool->add_option("--trace", args->trace,
                   "A pinned trace: STRATA_PINNED_TRACE=FILE while a run (e.g. strata bench "
                   "finetune) executes")
      ->required();
  pool->add_option("--passes", args->passes, "Replays of the trace on each allocator")
      ->capture_default_str()
      ->check(CLI::Range(2u, 1000u));
  pool->add_option("--buffer-count", args->buffer_count,
                   "zero-infinity: DeepSpeed's offload_param.buffer_count (minimum slots)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 20));
  pool->add_option("--buffer-size", args->buffer_size,
                   "zero-infinity: each slot's bytes (raised to the largest request; 0: the "
                   "largest request)")
      ->capture_default_str();
  pool->add_option("--recycler-budget", args->recycler_budgets,
                   "Also replay the recycler under this pinned budget (e.g. 1500M; repeatable): "
                   "what more kept memory would save in mapping");
  pool->add_flag("--json", args->json, "Print one JSON object instead of a table");
  pool->callback([args] { run_pool_bench(*args); });
}

}  // namespace strata::bench
