// What `strata bench finetune` prints and writes once its workers are done: the table, the JSON
// object, the merged Chrome trace, the memory plot and the full-scale projection.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "finetune/finetune_options.h"

namespace strata::bench::finetune {

// One worker's "result" event, as it arrived.
// NOLINTNEXTLINE(bugprone-exception-escape): json's move may assert, which clang-tidy counts.
struct StrategyResult {
  std::string name;
  ContenderKind kind = ContenderKind::kStrata;
  nlohmann::ordered_json result;
  std::string trace_path;  // the worker's trace file, when --trace
};

// --project-full-scale: both memory plans on the unscaled model through sched::simulate.
Result<nlohmann::ordered_json> project_full_scale(const FinetunePlan& plan);

// The JSON object of --json (the memory series left out; the plot has them).
nlohmann::ordered_json results_json(const FinetunePlan& plan,
                                    const std::vector<StrategyResult>& results,
                                    const nlohmann::ordered_json* projection);

// The human-readable report.
std::string results_table(const FinetunePlan& plan, const std::vector<StrategyResult>& results,
                          const nlohmann::ordered_json* projection);

// One Chrome trace from the workers' traces: a process per strategy, the runtime's read / write
// / copy tracks beside the worker's compute / optimizer / overflow-check / acquire-wait tracks.
Status merge_traces(const std::vector<StrategyResult>& results, const std::string& path);

// Whether plot_memory can work here (the script and an interpreter with matplotlib), checked
// before a run so that --plot fails at once rather than after the benchmark.
Status check_plot_renderer();

// Renders host, pinned and device memory over time for each strategy into a PNG with
// bench/plot_memory.py (matplotlib, Debian's /usr/bin/python3); the data is kept beside it as
// PATH.json.
Status plot_memory(const FinetunePlan& plan, const std::vector<StrategyResult>& results,
                   const std::string& path);

}  // namespace strata::bench::finetune
