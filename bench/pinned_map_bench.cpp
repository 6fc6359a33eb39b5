// `strata bench pinned-map`: what one pinned buffer costs to make and unmake (map, lock, register
// with io_uring and, on a GPU, with CUDA; then the reverse), with the runtime's huge pages
// against the small pages it used before, alternating so that both see the same machine. This is
// the cost a recycler take pays whenever it cannot reuse a kept buffer (docs/memory.md).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench_commands.h"
#include "common/report.h"
#include "common/units.h"
#include "finetune/worker_common.h"
#include "io/engine_factory.h"
#include "memory/pinned_arena.h"

namespace strata::bench {
namespace {

struct PinnedMapArgs {
  std::vector<std::string> sizes = {"1MiB", "4MiB", "16MiB", "64MiB"};
  uint32_t reps = 5;     // alternations per size
  uint32_t buffers = 8;  // buffers made and unmade per timed batch
  bool register_io = true;
  bool json = false;
};

[[noreturn]] void fail(const Status& status) {
  std::fprintf(stderr, "strata bench pinned-map: %s\n", status.message().c_str());
  throw CLI::RuntimeError(1);
}

// Milliseconds per buffer made and unmade, over `buffers` buffers of `bytes`.
double time_batch(memory::PinnedArena& arena, uint64_t bytes, uint32_t buffers) {
  std::vector<memory::PinnedBuffer> held;
  held.reserve(buffers);
  const auto start = std::chrono::steady_clock::now();
  for (uint32_t i = 0; i < buffers; ++i) {
    Result<memory::PinnedBuffer> b = arena.allocate(bytes);
    if (!b) fail(b.status());
    held.push_back(std::move(b).value());
  }
  held.clear();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
             .count() /
         buffers;
}

void run_pinned_map_bench(const PinnedMapArgs& args) {
  std::unique_ptr<io::IoEngine> engine;
  if (args.register_io) {
    Result<std::unique_ptr<io::IoEngine>> made =
        io::make_io_engine(io::IoEngineKind::kAuto, io::IoEngineOptions{});
    if (!made) fail(made.status());
    engine = std::move(made).value();
  }
  struct Row {
    uint64_t bytes = 0;
    double small_ms = 0, huge_ms = 0;
  };
  std::vector<Row> rows;
  for (const std::string& text : args.sizes) {
    const std::optional<uint64_t> bytes = parse_bytes(text);
    if (!bytes || *bytes == 0) fail(invalid_argument("--size: not a size: " + text));
    std::unique_ptr<memory::PinnedArena> arenas[2];
    for (int huge = 0; huge < 2; ++huge) {
      memory::PinnedArenaOptions o;
      o.budget_bytes = *bytes * args.buffers;
      o.huge_pages = huge == 1;
      o.io_engine = engine.get();
      Result<std::unique_ptr<memory::PinnedArena>> arena = memory::PinnedArena::create(o);
      if (!arena) fail(arena.status());
      arenas[huge] = std::move(arena).value();
    }
    std::vector<double> small, huge;
    (void)time_batch(*arenas[0], *bytes, 1);  // warm the page allocator for both
    for (uint32_t rep = 0; rep < args.reps; ++rep) {
      // The order rotates so that neither side always runs first.
      const bool huge_first = rep % 2 == 1;
      for (int turn = 0; turn < 2; ++turn) {
        const bool is_huge = (turn == 0) == huge_first;
        (is_huge ? huge : small)
            .push_back(time_batch(*arenas[is_huge ? 1 : 0], *bytes, args.buffers));
      }
    }
    rows.push_back({*bytes, finetune::median(small), finetune::median(huge)});
  }

  const std::string engine_name = engine ? engine->name() : "none";
  if (args.json) {
    nlohmann::ordered_json out = {{"buffers_per_batch", args.buffers},
                                  {"reps", args.reps},
                                  {"io_registration", engine_name},
                                  {"load_average", finetune::load_average()}};
    for (const Row& r : rows) {
      out["sizes"].push_back({{"bytes", r.bytes},
                              {"small_pages_ms", r.small_ms},
                              {"huge_pages_ms", r.huge_ms},
                              {"small_over_huge", r.huge_ms > 0 ? r.small_ms / r.huge_ms : 0}});
    }
    std::printf("%s\n", out.dump().c_str());
    return;
  }
  Table table({"buffer", "small pages ms", "huge pages ms", "small / huge"});
  for (const Row& r : rows) {
    table.add_row({format_bytes(r.bytes), fixed(r.small_ms, 3), fixed(r.huge_ms, 3),
                   fixed(r.huge_ms > 0 ? r.small_ms / r.huge_ms : 0, 2)});
  }
  std::printf("%s", table.render().c_str());
  std::printf(
      "\nms: median over %u alternations of the mean per buffer to map, lock and register it "
      "(I/O engine: %s) and to undo it all, %u buffers at a time. Load average %.2f.\n",
      args.reps, engine_name.c_str(), args.buffers, finetune::load_average());
}

}  // namespace

void add_pinned_map_command(CLI::App& bench) {
  auto args = std::make_shared<PinnedMapArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "pinned-map",
      "What making and unmaking one pinned buffer costs, on huge pages against small ones");
  cmd->add_option("--size", args->sizes, "Buffer sizes (repeatable)")->capture_default_str();
  cmd->add_option("--reps", args->reps, "Alternations per size")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1000u));
  cmd->add_option("--buffers", args->buffers, "Buffers per timed batch")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1024u));
  cmd->add_flag("!--no-io-registration", args->register_io,
                "Leave the buffers unregistered with the I/O engine");
  cmd->add_flag("--json", args->json, "Print one JSON object instead of a table");
  cmd->callback([args] { run_pinned_map_bench(*args); });
}

}  // namespace strata::bench
