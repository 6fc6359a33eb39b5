// `strata bench finetune` end to end, through the real `strata` program on a tiny model (Llama-2
// 7B narrowed to 5% and cut to 2 layers: 2.2M parameters, 35 MB of states; 2 steps, 64 tokens):
// the JSON report, one process per strategy, the trace, the metrics endpoint while it runs, and
// clear errors for bad arguments. (Qwen2.5-0.5B cannot shrink that far: its 7:1 grouped-query
// ratio keeps at least 7 heads of 64, and its 152K vocabulary then dominates.)
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cli_run.h"
#include "model/test_dir.h"
#include "telemetry/loopback_http.h"

namespace strata {
namespace {

using json = nlohmann::json;

using testing::CliOptions;
using testing::CliRun;
using testing::run_cli;

std::vector<std::string> tiny(const std::filesystem::path& dir,
                              std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {
      "bench",   "finetune", "--model", "llama-2-7b", "--scale", "0.05", "--layers", "2",
      "--steps", "2",        "--seq",   "64",         "--batch", "1",    "--nvme",   dir.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(FinetuneBench, JsonHasEveryKeyFromOneProcessPerContender) {
  const auto dir = testing::scratch_dir("finetune-json");
  const CliRun r = run_cli(tiny(dir, {"--json", "--project-full-scale", "h100-sxm"}));
  ASSERT_EQ(r.code, 0) << r.err;
  // Not a terminal, --json: progress as plain lines on stderr, with rate and ETA, never redrawn.
  EXPECT_NE(r.err.find("100% (2 of 2 steps)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ETA"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << r.err;
  const json j = json::parse(r.out);
  for (const char* key : {"model", "precision", "semantics", "strategies", "baselines",
                          "host_reduction", "step_time_ratio", "optimizer_overlap"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["model"], "llama-2-7b");
  EXPECT_EQ(j["precision"], "bf16");
  ASSERT_EQ(j["strategies"].size(), 2u);
  ASSERT_EQ(j["baselines"].size(), 3u);
  std::set<int64_t> pids;
  std::vector<json> everyone;
  for (const json& s : j["strategies"]) everyone.push_back(s);
  for (const json& s : j["baselines"]) everyone.push_back(s);
  for (const json& s : everyone) {
    for (const char* key :
         {"name", "peak_host_bytes", "peak_host_bytes_during_steps", "peak_host_moment",
          "peak_pinned_bytes", "peak_device_bytes", "step_seconds", "nvme_read_gbps",
          "nvme_write_gbps", "stall_fraction", "semantics"}) {
      EXPECT_TRUE(s.contains(key)) << s["name"] << " lacks " << key;
    }
    EXPECT_GT(s["peak_host_bytes"].get<double>(), 0) << s["name"];
    EXPECT_GT(s["peak_pinned_bytes"].get<double>(), 0) << s["name"];
    EXPECT_GT(s["peak_device_bytes"].get<double>(), 0) << s["name"];
    EXPECT_GT(s["step_seconds"].get<double>(), 0) << s["name"];
    EXPECT_GE(s["stall_fraction"].get<double>(), 0);
    EXPECT_LE(s["stall_fraction"].get<double>(), 1);
    EXPECT_GT(s["os_vmhwm_bytes"].get<double>(), 0);
    // The process before the engine exists: something (code, libraries), less than its peak.
    ASSERT_TRUE(s.contains("process_base_bytes")) << s["name"];
    EXPECT_GT(s["process_base_bytes"].get<double>(), 0) << s["name"];
    EXPECT_LT(s["process_base_bytes"].get<double>(),
              s["peak_host_bytes_during_steps"].get<double>())
        << s["name"];
    EXPECT_FALSE(s["peak_host_moment"].get<std::string>().empty()) << s["name"];
    pids.insert(s["pid"].get<int64_t>());
  }
  // Each contender in its own process, none of them the parent.
  EXPECT_EQ(pids.size(), 5u);
  EXPECT_EQ(pids.count(r.pid), 0u);
  EXPECT_EQ(j["strategies"][0]["name"], "strata");
  EXPECT_EQ(j["strategies"][1]["name"], "strata-overlap");
  // Strata's steps name what they moved by tensor kind, adding up to the runtime's own count.
  for (const json& s : j["strategies"]) {
    for (const json& step : s["steps"]) {
      ASSERT_TRUE(step.contains("nvme_written_by_kind")) << s["name"];
      uint64_t written = 0;
      for (const auto& [kind, bytes] : step["nvme_written_by_kind"].items()) {
        written += bytes.get<uint64_t>();
      }
      EXPECT_EQ(written, step["runtime_nvme_write_bytes"].get<uint64_t>()) << s["name"];
      EXPECT_TRUE(step["nvme_read_by_kind"].contains("parameter")) << s["name"];
    }
  }
  const char* names[] = {"deepspeed-defaults", "deepspeed-pinned", "deepspeed-tuned"};
  for (size_t i = 0; i < 3; ++i) {
    const json& b = j["baselines"][i];
    EXPECT_EQ(b["name"], names[i]);
    for (const char* key : {"deepspeed_version_modelled", "peak_host_bytes_steps",
                            "nvme_read_bytes_per_step", "nvme_write_bytes_per_step", "config"}) {
      EXPECT_TRUE(b.contains(key)) << names[i] << " lacks " << key;
    }
    // Every buffer traced to a DeepSpeed source line.
    ASSERT_FALSE(b["buffers"].empty());
    for (const json& buf : b["buffers"]) {
      EXPECT_NE(buf["deepspeed_source"].get<std::string>().find(".py:"), std::string::npos)
          << buf.dump();
      EXPECT_GT(buf["held_bytes"].get<double>(), 0) << buf.dump();
    }
    // Everything DeepSpeed keeps on NVMe is read and written every step (no cache across steps).
    EXPECT_GT(b["nvme_read_bytes_per_step"].get<double>(), 0) << names[i];
    EXPECT_GT(b["nvme_write_bytes_per_step"].get<double>(), 0) << names[i];
    EXPECT_TRUE(j["host_reduction"][names[i]].is_number()) << names[i];
    EXPECT_TRUE(j["step_time_ratio"][names[i]].is_number()) << names[i];
  }
  EXPECT_EQ(j["baselines"][1]["config"]["offload_optimizer"]["pin_memory"], true);
  EXPECT_EQ(j["baselines"][2]["config"]["offload_optimizer"]["pipeline_read"], true);
  // The projection: Strata simulated, each configuration from its buffer rules at full size.
  ASSERT_TRUE(j.contains("projection"));
  EXPECT_EQ(j["projection"]["strategies"].size(), 1u);
  ASSERT_EQ(j["projection"]["baselines"].size(), 3u);
  for (const json& b : j["projection"]["baselines"]) {
    EXPECT_GT(b["peak_host_bytes"].get<double>(),
              j["projection"]["strategies"][0]["peak_host_bytes"].get<double>());
  }
  // The swap files and folders are gone.
  EXPECT_TRUE(std::filesystem::is_empty(dir));
}

TEST(FinetuneBench, Fp16AddsDeepSpeedsOverflowCheckAndItsTemporaries) {
  const auto dir = testing::scratch_dir("finetune-fp16");
  for (const char* precision : {"bf16", "fp16"}) {
    const CliRun r = run_cli(tiny(dir, {"--json", "--strategy", "deepspeed", "--baseline",
                                        "deepspeed-defaults", "--precision", precision}));
    ASSERT_EQ(r.code, 0) << r.err;
    const json j = json::parse(r.out);
    ASSERT_EQ(j["baselines"].size(), 1u);
    const json& b = j["baselines"][0];
    bool temporaries = false;
    for (const json& buf : b["buffers"]) {
      if (buf["name"].get<std::string>().find("overflow") != std::string::npos) temporaries = true;
    }
    double check = 0;
    for (const json& step : b["steps"]) check += step["overflow_check_seconds"].get<double>();
    EXPECT_EQ(temporaries, std::string(precision) == "fp16") << precision;
    EXPECT_EQ(check > 0, std::string(precision) == "fp16") << precision;
  }
}

TEST(FinetuneBench, TraceIsChromeJsonWithReadWriteCopyComputeAndOptimizerTracks) {
  const auto dir = testing::scratch_dir("finetune-trace");
  const auto trace = dir / "trace.json";
  const auto nvme = dir / "nvme";
  std::filesystem::create_directories(nvme);
  // A pinned budget well below the model's 35 MB of states, so that Strata streams from NVMe.
  const CliRun r =
      run_cli(tiny(nvme, {"--trace", trace.string(), "--pinned-budget", "12M",
                          "--optimizer-overlap", "off", "--baseline", "deepspeed-defaults"}));
  ASSERT_EQ(r.code, 0) << r.err;
  // The table: memory in binary units, rates in decimal GB/s, each labelled, signs once.
  EXPECT_TRUE(std::regex_search(r.out, std::regex("[0-9] (KiB|MiB|GiB)"))) << r.out;
  EXPECT_FALSE(std::regex_search(r.out, std::regex("[0-9] GB[^/]"))) << r.out;
  EXPECT_FALSE(std::regex_search(r.out, std::regex("[-+]{2}[0-9]"))) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("peak host [-+]?[0-9]+\\.[0-9]%"))) << r.out;
  std::ifstream in(trace);
  const json j = json::parse(in);
  ASSERT_TRUE(j["traceEvents"].is_array());
  // thread name per (pid, tid), then count complete events per track name and process.
  std::map<std::pair<int, int>, std::string> names;
  std::map<int, std::string> processes;
  for (const json& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") {
      names[{e["pid"].get<int>(), e["tid"].get<int>()}] = e["args"]["name"].get<std::string>();
    }
    if (e["ph"] == "M" && e["name"] == "process_name") {
      processes[e["pid"].get<int>()] = e["args"]["name"].get<std::string>();
    }
  }
  std::map<std::string, std::map<std::string, int>> spans;  // process -> track -> count
  for (const json& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const int pid = e["pid"].get<int>();
    std::string track = names[{pid, e["tid"].get<int>()}];
    track = std::regex_replace(track, std::regex(" \\([0-9]+\\)$"), "");  // sub-rows
    ++spans[processes[pid]][track];
    EXPECT_GE(e["dur"].get<int64_t>(), 0);
  }
  for (const char* process : {"strata", "deepspeed-defaults"}) {
    SCOPED_TRACE(process);
    ASSERT_TRUE(spans.count(process));
    const auto& tracks = spans[process];
    for (const char* track : {"nvme read", "nvme write", "compute", "optimizer"}) {
      EXPECT_GT(tracks.count(track) ? tracks.at(track) : 0, 0) << track;
    }
    const int copies = (tracks.count("h2d copy") ? tracks.at("h2d copy") : 0) +
                       (tracks.count("d2h copy") ? tracks.at("d2h copy") : 0);
    EXPECT_GT(copies, 0);
  }
  // Transfers are named by the tensor they moved, with its kind and layer, never by the link's
  // word alone; each link has a queue track (transfers in flight).
  int named = 0, unnamed = 0;
  std::set<std::string> counters;
  int strata_pid = -1;
  for (const auto& [pid, name] : processes) {
    if (name == "strata") strata_pid = pid;
  }
  for (const json& e : j["traceEvents"]) {
    if (e["ph"] == "C") counters.insert(e["name"].get<std::string>());
    if (e["ph"] != "X" || e.value("cat", "") != "nvme read") continue;
    if (e["pid"].get<int>() != strata_pid) continue;  // DeepSpeed's handles name files
    const std::string name = e["name"].get<std::string>();
    if (name == "read") {
      ++unnamed;
      continue;
    }
    ++named;
    ASSERT_TRUE(e.contains("args")) << e.dump();
    EXPECT_TRUE(e["args"].contains("kind")) << e.dump();
    EXPECT_TRUE(e["args"].contains("layer")) << e.dump();
    EXPECT_GT(e["args"]["bytes"].get<int64_t>(), 0) << e.dump();
  }
  EXPECT_GT(named, 0);
  EXPECT_EQ(unnamed, 0);
  EXPECT_TRUE(counters.count("nvme read in flight")) << counters.size();
  // The workers' partial traces were merged and removed.
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().string().find(".partial"), std::string::npos) << entry.path();
  }
}

TEST(FinetuneBench, MetricsEndpointIsScrapedWhileItRuns) {
  const auto dir = testing::scratch_dir("finetune-metrics");
  std::atomic<int> port{0};
  std::atomic<bool> done{false}, seen_strata{false}, seen_zero{false}, bad_exposition{false};
  std::atomic<bool> seen_busy{false}, seen_copies{false};
  // seen_zero: the DeepSpeed baseline's worker. Once `strata` has ended while the baseline runs:
  // its memory gauges (must be 0: it holds nothing) and its host peak (must be its --json one).
  std::atomic<bool> seen_ended{false};
  std::atomic<double> ended_host{-1}, ended_host_peak{-1};
  std::thread scraper;
  auto on_stderr = [&](const std::string& err, pid_t) {
    if (port.load() != 0) return;
    std::smatch m;
    if (!std::regex_search(err, m,
                           std::regex("metrics: http://127\\.0\\.0\\.1:([0-9]+)/metrics"))) {
      return;
    }
    port = std::stoi(m[1]);
    scraper = std::thread([&] {
      while (!done.load()) {
        const auto r = telemetry::testing::http_get(static_cast<uint16_t>(port.load()), "/metrics");
        if (r.status == 200) {
          const auto values = telemetry::testing::parse_prometheus(r.body);
          auto value = [&](const char* name) {
            auto it = values.find(name);
            return it == values.end() ? -1.0 : it->second;
          };
          // One family per quantity, the strategy and tier as labels (Prometheus conventions).
          if (value("strata_finetune_running{strategy=\"strata\"}") == 1 &&
              value("strata_finetune_memory_bytes{strategy=\"strata\",tier=\"host\"}") > 0) {
            seen_strata = true;
          }
          if (value("strata_finetune_running{strategy=\"deepspeed-defaults\"}") == 1 &&
              value("strata_finetune_memory_bytes{strategy=\"deepspeed-defaults\",tier=\"host\"}") >
                  0) {
            seen_zero = true;
            if (value("strata_finetune_running{strategy=\"strata\"}") == 0) {
              seen_ended = true;
              ended_host = value("strata_finetune_memory_bytes{strategy=\"strata\",tier=\"host\"}");
              ended_host_peak =
                  value("strata_finetune_memory_bytes_peak{strategy=\"strata\",tier=\"host\"}");
            }
          }
          // The runtime's busy times and copies: Strata's worker counts them; DeepSpeed's has no
          // such series at all (its aio reports none: a 0 would read as an idle drive).
          if (value("strata_finetune_nvme_busy_seconds_total{strategy=\"strata\",direction="
                    "\"either\"}") > 0) {
            seen_busy = true;
          }
          if (value("strata_finetune_device_copy_bytes_total{strategy=\"strata\",direction="
                    "\"host_to_device\"}") > 0 &&
              value("strata_finetune_device_copy_busy_seconds_total{strategy=\"strata\","
                    "direction=\"host_to_device\"}") > 0) {
            seen_copies = true;
          }
          if (r.body.find("_busy_seconds_total{strategy=\"deepspeed") != std::string::npos ||
              r.body.find("copy_bytes_total{strategy=\"deepspeed") != std::string::npos) {
            bad_exposition = true;
          }
          // `running` is a flag: no peak; memory keeps one.
          if (r.body.find("strata_finetune_running_peak") != std::string::npos ||
              r.body.find("strata_finetune_memory_bytes_peak{") == std::string::npos ||
              r.body.find("# TYPE strata_finetune_nvme_bytes_total counter") == std::string::npos) {
            bad_exposition = true;
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  };
  CliOptions options;
  options.on_stderr = on_stderr;
  const CliRun r = run_cli(tiny(dir, {"--steps", "3", "--metrics-port", "0", "--optimizer-overlap",
                                      "off", "--baseline", "deepspeed-defaults", "--json"}),
                           options);
  done = true;
  if (scraper.joinable()) scraper.join();
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_NE(port.load(), 0) << r.err;
  EXPECT_TRUE(seen_strata.load());
  EXPECT_TRUE(seen_zero.load());
  EXPECT_TRUE(seen_busy.load());
  EXPECT_TRUE(seen_copies.load());
  EXPECT_FALSE(bad_exposition.load());
  ASSERT_TRUE(seen_ended.load());
  EXPECT_EQ(ended_host.load(), 0);  // an ended worker's last report does not stay
  const json j = json::parse(r.out);
  // The peak is every sample's, as the run's own: before, only the reported values' (lower).
  EXPECT_EQ(ended_host_peak.load(), j["strategies"][0]["peak_host_bytes"].get<double>());
}

TEST(FinetuneBench, BadArgumentsGiveClearErrors) {
  const auto dir = testing::scratch_dir("finetune-bad");
  struct Case {
    std::vector<std::string> extra;
    const char* expect;  // in stderr
  };
  const std::vector<Case> cases = {
      {{"--strategy", "megatron"}, "--strategy"},
      {{"--baseline", "deepspeed-fastest"}, "--baseline"},
      {{"--baseline", "deepspeed-tuned,deepspeed-tuned"}, "twice"},
      {{"--precision", "fp8"}, "--precision"},
      {{"--max-grad-norm", "-1"}, "--max-grad-norm"},
      {{"--compute", "cpu"}, "modeled"},
      {{"--compute", "abacus"}, "--compute"},
      {{"--mfu", "0"}, "--mfu"},
      {{"--mfu", "1.5"}, "--mfu"},
      {{"--steps", "0"}, "--steps"},
      {{"--gpu", "voodoo-5"}, "h100-sxm"},  // lists the presets
      {{"--project-full-scale", "voodoo-5"}, "--project-full-scale"},
      {{"--layers", "500"}, "--layers"},
      {{"--pinned-budget", "lots"}, "--pinned-budget"},
      {{"--metrics-port", "70000"}, "--metrics-port"},
      {{"--metrics-port", "-1"}, "--metrics-port"},  // the unset value, ignored when given
      {{"--nvme", "/nonexistent/strata"}, "--nvme"},
      {{"--optimizer-overlap", "maybe"}, "--optimizer-overlap"},
      {{"--method", "dora"}, "--method"},
      {{"--method", "lora", "--strategy", "both"}, "Strata alone"},
      {{"--method", "qlora", "--strategy", "deepspeed"}, "Strata alone"},
      {{"--method", "lora", "--lora-rank", "0"}, "--lora-rank"},
      {{"--method", "lora", "--lora-targets", "q,x"}, "--lora-targets"},
      {{"--method", "lora", "--project-full-scale", "h100-sxm"}, "strata plan --method lora"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = tiny(dir);
    args.insert(args.end(), c.extra.begin(), c.extra.end());
    const CliRun r = run_cli(args);
    EXPECT_EQ(r.code, 2) << c.extra[0] << ": " << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.extra[0] << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  const CliRun unknown = run_cli({"bench", "finetune", "--model", "llama-9-1t"});
  EXPECT_EQ(unknown.code, 2);
  EXPECT_NE(unknown.err.find("llama-2-70b"), std::string::npos) << unknown.err;
#if !defined(STRATA_HAVE_CUDA)
  const CliRun gpu = run_cli(tiny(dir, {"--compute", "gpu"}));
  EXPECT_NE(gpu.code, 0);
  EXPECT_NE(gpu.err.find("CUDA"), std::string::npos) << gpu.err;
#endif
  const CliRun missing = run_cli({"bench", "finetune"});
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.err.find("--model"), std::string::npos) << missing.err;
}

// --method lora: the base frozen, read-only and streamed through budgets smaller than it; Strata
// alone. Each step reads the base from NVMe and writes none of it: the parameters it writes are
// the adapters at most, and all it writes stays within the adapters' state (issue 22's <= 1.1x).
// The device budget leaves the base streaming (2 layers of 1.63 MiB each do not fit) with room
// beside one layer's: at 2 MiB, one run in 15-40 found the slab's free 725 KiB in ranges each
// under the 344 KiB weight it asked for while it held the rest of the layer (reliability finding
// 31: it waited 300 s then; now the acquire says so at once, and no run of 100 at 2.5 MiB did).
// What the device pool keeps from one step to the next is the scheduler's choice and depends on
// timing: under AddressSanitizer 7 runs in 81 kept a base weight or two (40-95 KiB) across the
// step boundary, so that step read that much less of the base, or had an adapter's write-back of
// the step before complete in it (one adapter, 41 KiB, over). So a step reads the base less at
// most what the device pool holds, and writes at most the adapters of two steps; over the run,
// the adapters' once a step.
TEST(FinetuneBench, LoraStreamsAReadOnlyBaseAndWritesOnlyTheAdaptersState) {
  const auto dir = testing::scratch_dir("finetune-lora");
  const CliRun r =
      run_cli(tiny(dir, {"--method", "lora", "--steps", "3", "--optimizer-overlap", "off",
                         "--pinned-budget", "3M", "--device-budget", "2560K", "--json"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["method"], "lora");
  EXPECT_TRUE(j["baselines"].empty());
  ASSERT_EQ(j["strategies"].size(), 1u);
  const json& lora = j["strategies"][0]["lora"];
  const uint64_t adapters = j["lora"]["adapter_parameters"].get<uint64_t>();
  const uint64_t base = lora["base_bytes_stored"].get<uint64_t>();
  EXPECT_EQ(adapters, lora["adapter_parameters"].get<uint64_t>());
  EXPECT_GT(base, 10 * 2 * adapters);  // a LoRA shape: the base dominates
  EXPECT_EQ(lora["adapter_home"], "nvme") << lora["adapter_home_why"];
  constexpr uint64_t kDeviceBudget = 2560 * 1024;
  EXPECT_GE(lora["parameters_read_per_step_min"].get<uint64_t>(), base - kDeviceBudget);
  // The adapters' bf16 bytes, each of the 28 adapter tensors (2 layers x 7 projections x A, B)
  // rounded up to the 4 KiB of an O_DIRECT write: nothing of the base.
  const uint64_t adapter_writes = 2 * adapters + 28 * 4096;
  EXPECT_LE(lora["parameters_written_per_step_max"].get<uint64_t>(), 2 * adapter_writes);
  EXPECT_LE(lora["written_over_adapter_state"].get<double>(), 1.1);
  EXPECT_GT(lora["base_read_rate_bytes_per_s"].get<double>(), 0.0);
  EXPECT_GT(lora["read_base_twice_seconds"].get<double>(), 0.0);
  EXPECT_EQ(lora["steps"].size(), 3u);
  // Every step's PARAMETER writes: two steps' adapters at most; over the run, one step's each.
  uint64_t parameters_written = 0;
  for (const json& step : lora["steps"]) {
    const json& written = step["nvme_written_by_kind"];
    if (written.contains("parameter")) {
      EXPECT_LE(written["parameter"].get<uint64_t>(), 2 * adapter_writes);
      parameters_written += written["parameter"].get<uint64_t>();
    }
  }
  EXPECT_LE(parameters_written, lora["steps"].size() * adapter_writes);
}

// --method qlora with real CPU compute: the layer linear weights stored in NF4 (a little over a
// quarter of bf16 with the per-block absmax) and dequantized by the SIMD path before each GEMM;
// the adapters, their gradients and optimizer states rest off NVMe, so a step writes nothing.
TEST(FinetuneBench, QloraStoresTheBaseInNf4AndAStepWritesNothingToNvme) {
  const auto dir = testing::scratch_dir("finetune-qlora");
  const CliRun r = run_cli(tiny(dir, {"--method", "qlora", "--strategy", "strata", "--compute",
                                      "cpu", "--optimizer-overlap", "off", "--json"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  const json& lora = j["strategies"][0]["lora"];
  const double stored = lora["base_bytes_stored"].get<double>();
  const double bf16 = lora["base_bytes_unquantized"].get<double>();
  EXPECT_LT(stored, 0.6 * bf16);  // embedding, LM head and norms stay bf16
  EXPECT_EQ(lora["adapter_home"], "device") << lora["adapter_home_why"];
  EXPECT_EQ(lora["nvme_written_per_step_max"].get<uint64_t>(), 0u);
  EXPECT_GT(lora["compute_seconds_median"].get<double>(), 0.0);
}

TEST(FinetuneBench, CpuComputeAndPlotRunOneStrategy) {
  const auto dir = testing::scratch_dir("finetune-cpu");
  const auto png = dir / "memory.png";
  const auto nvme = dir / "nvme";
  std::filesystem::create_directories(nvme);
  const CliRun r =
      run_cli(tiny(nvme, {"--strategy", "strata", "--optimizer-overlap", "off", "--compute", "cpu",
                          "--seq", "8", "--plot", png.string(), "--json"}));
  const bool matplotlib =
      std::system("/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1") == 0;
  if (matplotlib) {
    ASSERT_EQ(r.code, 0) << r.err;
    std::ifstream in(png, std::ios::binary);
    char magic[8] = {};
    in.read(magic, 8);
    EXPECT_EQ(std::memcmp(magic, "\x89PNG\r\n\x1a\n", 8), 0);
  } else {
    // Checked before the run: a plot that cannot be made fails at once, with the fix.
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find("matplotlib"), std::string::npos) << r.err;
    return;
  }
  const json j = json::parse(r.out);
  ASSERT_EQ(j["strategies"].size(), 1u);
  EXPECT_TRUE(j["host_reduction"].is_null());
  EXPECT_EQ(j["config"]["compute"], "cpu");
}

// --sweep-pinned: Strata alone at each budget and at the default, host peak against step time.
TEST(FinetuneBench, ThePinnedSweepRunsEachBudgetAndTheDefault) {
  const std::filesystem::path dir = testing::scratch_dir("finetune-sweep");
  const CliRun r = run_cli(tiny(dir, {"--sweep-pinned", "16M", "--json"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  const json& rows = j["pinned_sweep"];
  ASSERT_EQ(rows.size(), 2u) << r.out;  // 16M and the default, automatic
  EXPECT_EQ(j["default_pinned_budget"], "auto");
  int autos = 0;
  for (const json& row : rows) {
    if (row["auto"].get<bool>()) {
      ++autos;
      EXPECT_TRUE(row["default"].get<bool>());
      EXPECT_GT(row["pinned_budget_bytes"].get<uint64_t>(), 0u);  // what the runtime sized
    } else {
      EXPECT_EQ(row["pinned_budget_bytes"], 16u << 20);
      EXPECT_FALSE(row["default"].get<bool>());
    }
  }
  EXPECT_EQ(autos, 1);
  // In budget order.
  EXPECT_LE(rows[0]["pinned_budget_bytes"].get<uint64_t>(),
            rows[1]["pinned_budget_bytes"].get<uint64_t>());
  for (const json& row : rows) {
    ASSERT_FALSE(row.contains("error")) << row.dump();
    EXPECT_GT(row["step_seconds"].get<double>(), 0);
    EXPECT_GT(row["peak_host_bytes"].get<double>(), 0);
    EXPECT_LE(row["peak_pinned_bytes"].get<double>(), row["pinned_budget_bytes"].get<double>());
  }
  const CliRun both = run_cli(tiny(dir, {"--sweep-pinned", "16M", "--pinned-budget", "8M"}));
  EXPECT_EQ(both.code, 2);
  EXPECT_NE(both.err.find("drop --pinned-budget"), std::string::npos) << both.err;
  const CliRun bad = run_cli(tiny(dir, {"--sweep-pinned", "16M,lots"}));
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("'lots' is not a size"), std::string::npos) << bad.err;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata
