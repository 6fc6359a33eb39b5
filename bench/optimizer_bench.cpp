// `strata bench optimizer`: the optimizer step over states on NVMe, pipelined (read of sub-group
// i+1, update of i, write-back of i-1 at once) against the same step done serially per sub-group
// (read, then update, then write and wait), in the same process over the same tensors. Beside
// them, each stage alone: reading every state, writing every state, and the update measured on
// data already in memory. A pipeline runs at the pace of its slowest stage at best, so the figure
// of merit is pipelined / slowest stage (close to 1 is good) and the speed-up over serial.
// A drive that shares one bandwidth between reads and writes (a virtual disk, a drive near its
// write limit) cannot run them side by side at their solo rates, so the bench also times reading
// and writing overlapped with no update: the I/O as the step does it. pipelined / max(update,
// that) says how close the step comes to what the drive gives it.
// Inside the pipelined step, the optimizer's StepReport splits the time into the update itself,
// waits for reads and the final wait for write-backs: the stages as they ran overlapped.
//
// Setup: N parameters in bf16 tensors of --param-elements each, bf16 gradients, fp32 master / m / v
// on NVMe (12 bytes per parameter). Every measurement is repeated --repeats times, interleaved,
// and the median is reported. Steps are timed up to the moment every state is back on NVMe.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/runtime.h"
#include "bench_commands.h"
#include "common/report.h"
#include "common/units.h"
#include "io/paced_engine.h"
#include "optim/half_convert.h"
#include "optim/tiered_optimizer.h"
#include "progress.h"

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct OptimizerBenchArgs {
  std::string params = "200M";
  std::string param_elements = "16M";
  std::string pinned_budget = "256MiB";
  std::string sub_group_bytes = "0";  // per state tensor; 0: sized from the pinned budget
  std::string model_drive;            // "" : the real device's pace; else io/paced_engine.h's spec
  std::string nvme = "/tmp";
  int threads = 0;
  int repeats = 3;
  bool json = false;
};

std::optional<uint64_t> parse_count(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !(value > 0)) return std::nullopt;
  const std::string suffix(end);
  double scale = 1;
  if (suffix == "K" || suffix == "k") {
    scale = 1e3;
  } else if (suffix == "M" || suffix == "m") {
    scale = 1e6;
  } else if (suffix == "G" || suffix == "g") {
    scale = 1e9;
  } else if (!suffix.empty()) {
    return std::nullopt;
  }
  if (value * scale > 1e12) return std::nullopt;
  return static_cast<uint64_t>(value * scale);
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

int fail(const char* what, const Status& status) {
  std::fprintf(stderr, "strata bench optimizer: %s: %s: %s\n", what, strata_strerror(status.code()),
               status.message().c_str());
  return 1;
}

// Fills a tensor through a pinned acquire: bf16 values 1e-3 * (1 + (i + salt) % 7).
Status fill_bf16(sched::Scheduler& s, sched::TensorHandle h, uint64_t elements, uint32_t salt) {
  STRATA_ASSIGN_OR_RETURN(auto a, s.acquire(h, Tier::kPinned, sched::AccessMode::kOverwrite,
                                            std::chrono::seconds(300)));
  auto* data = static_cast<uint16_t*>(a.data);
  uint16_t pattern[7];
  for (uint32_t k = 0; k < 7; ++k) pattern[k] = optim::float_to_bf16(1e-3f * (1 + k));
  for (uint64_t i = 0; i < elements; ++i) data[i] = pattern[(i + salt) % 7];
  return s.release(h, /*dirty=*/true);
}

struct Stage {
  const char* name;
  double seconds;
};

Stage slowest_stage(double read_s, double update_s, double write_s) {
  Stage slowest{"read", read_s};
  if (update_s > slowest.seconds) slowest = {"update", update_s};
  if (write_s > slowest.seconds) slowest = {"write", write_s};
  return slowest;
}

// A pass's time over `bytes` at the rate it moved `pass_bytes`.
double at_bytes(double seconds, uint64_t pass_bytes, uint64_t bytes) {
  return pass_bytes > 0 ? seconds * static_cast<double>(bytes) / static_cast<double>(pass_bytes)
                        : seconds;
}

int run_optimizer_bench(const OptimizerBenchArgs& args) {
  const auto n = parse_count(args.params);
  const auto per_tensor = parse_count(args.param_elements);
  const auto budget = parse_bytes(args.pinned_budget);
  const auto sub_group_bytes = parse_bytes(args.sub_group_bytes);
  if (!n || !per_tensor || !budget || !sub_group_bytes) {
    std::fprintf(stderr,
                 "strata bench optimizer: bad --params, --param-elements, --pinned-budget or "
                 "--sub-group-bytes\n");
    return 2;
  }
  strata_config config;
  strata_config_init(&config);
  config.nvme_path = args.nvme.c_str();
  // States, parameters and gradients on NVMe, with room for write-backs to new extents.
  config.nvme_capacity_bytes = *n * 16 * 2 + (256ull << 20);
  config.pinned_budget_bytes = *budget;
  config.device_budget_bytes = 64ull << 20;
  config.device_backend = STRATA_DEVICE_EMULATED;
  config.optimizer_threads = static_cast<uint32_t>(args.threads);
  if (!args.model_drive.empty()) {
    // A modelled full-duplex drive over the real one (io/paced_engine.h), picked up by the
    // runtime at creation.
    Result<io::DriveModel> drive = io::parse_drive_model(args.model_drive);
    if (!drive) return fail("--model-drive", drive.status());
    // One thread so far (the runtime is created next): nothing reads the environment meanwhile.
    ::setenv("STRATA_PACED_DRIVE", args.model_drive.c_str(), 1);  // NOLINT(concurrency-mt-unsafe)
  }
  auto created = api::Runtime::create(config);
  if (!created) return fail("runtime", created.status());
  api::Runtime& rt = *created.value();
  sched::Scheduler& s = rt.scheduler();
  auto made = rt.optimizer();
  if (!made) return fail("optimizer", made.status());
  optim::TieredOptimizer& opt = *made.value();
  // Like for like with the baseline pass: no overflow-check pass over the gradients.
  optim::TieredOptimizerOptions options;
  options.check_overflow = false;
  options.sub_group_bytes = *sub_group_bytes;
  if (Status st = opt.configure(options); !st.is_ok()) return fail("configure", st);
  if (auto g = opt.add_group(optim::GroupSettings{}); !g) return fail("group", g.status());

  struct Tensors {
    sched::TensorHandle param, grad;
    uint64_t elements;
  };
  std::vector<Tensors> tensors;
  for (uint64_t first = 0; first < *n; first += *per_tensor) {
    const uint64_t e = std::min(*per_tensor, *n - first);
    const std::string name = "layers." + std::to_string(tensors.size()) + ".weight";
    TensorSpec spec;
    spec.name = name;
    spec.dtype = DType::kBFloat16;
    spec.kind = TensorKind::kParameter;
    spec.shape = {e};
    auto p = s.register_tensor(spec);
    spec.name = name + ".grad";
    spec.kind = TensorKind::kGradient;
    auto g = s.register_tensor(spec);
    if (!p || !g) return fail("register", p ? g.status() : p.status());
    if (Status st = fill_bf16(s, *p, e, 0); !st.is_ok()) return fail("parameter", st);
    if (Status st = opt.add_param(0, *p, *g); !st.is_ok()) return fail("add_param", st);
    tensors.push_back({*p, *g, e});
  }
  const auto timeout = std::chrono::seconds(600);
  auto write_gradients = [&]() -> Status {
    for (const Tensors& t : tensors) STRATA_TRY(fill_bf16(s, t.grad, t.elements, 3));
    return s.flush(timeout);
  };
  if (Status st = s.flush(timeout); !st.is_ok()) return fail("flush", st);

  // The update alone, from memory: CpuAdam over sub-group-sized arrays, as many times as the
  // step has sub-groups (at least 16M elements per call so caches do not flatter it).
  const uint64_t sub = opt.sub_group_elements();
  const uint64_t chunk = std::min<uint64_t>(*n, std::max<uint64_t>(sub, 16u << 20));
  std::vector<float> p(chunk, 0.5f), m(chunk, 0.0f), v(chunk, 0.0f);
  std::vector<uint16_t> g(chunk, optim::float_to_bf16(1e-3f)), out(chunk);
  auto update_alone = [&]() {
    const auto t = Clock::now();
    optim::AdamWParams a;
    for (uint64_t done = 0; done < *n; done += chunk) {
      optim::AdamWSlice slice{
          p.data(),         m.data(),   v.data(),         g.data(),
          DType::kBFloat16, out.data(), DType::kBFloat16, std::min(chunk, *n - done)};
      (void)opt.adam().step(a, {&slice, 1});
    }
    return seconds_since(t);
  };

  std::vector<double> read_s, write_s, update_s, io_s, pipelined_s, serial_s;
  // The pipelined step's own split (StepReport): update, read waits, the final write-back wait.
  std::vector<double> in_step_update_s, in_step_read_wait_s, in_step_write_wait_s;
  uint64_t pipelined_read_bytes = 0, pipelined_written_bytes = 0, read_pass_bytes = 0;
  uint64_t io_pass_bytes = 0, write_pass_bytes = 0;
  // Five measured passes per repetition; the rate is the state bytes they move.
  ProgressDisplay progress("bench optimizer", args.repeats, ProgressDisplay::Unit::kCount,
                           "repetitions", is_interactive_terminal(args.json));
  progress.update(0);
  for (int r = 0; r < args.repeats; ++r) {
    // Write alone: every state acquired to be overwritten (zeros), written back, all on NVMe.
    const uint64_t written_before = rt.store().stats().bytes_written;
    auto t = Clock::now();
    auto pass =
        opt.run_pass({/*read=*/false, /*update=*/false, /*write=*/true, /*overlap=*/true}, 1.0f);
    if (!pass) return fail("write pass", pass.status());
    if (Status st = s.flush(timeout); !st.is_ok()) return fail("flush", st);
    write_s.push_back(seconds_since(t));
    write_pass_bytes = rt.store().stats().bytes_written - written_before;
    // Read alone.
    const uint64_t read_before = rt.store().stats().bytes_read;
    t = Clock::now();
    pass = opt.run_pass({/*read=*/true, /*update=*/false, /*write=*/false, /*overlap=*/true}, 1.0f);
    if (!pass) return fail("read pass", pass.status());
    read_s.push_back(seconds_since(t));
    read_pass_bytes = rt.store().stats().bytes_read - read_before;
    update_s.push_back(update_alone());
    const auto io_before = rt.store().stats();
    t = Clock::now();
    pass = opt.run_pass({/*read=*/true, /*update=*/false, /*write=*/true, /*overlap=*/true}, 1.0f);
    if (!pass) return fail("read+write pass", pass.status());
    if (Status st = s.flush(timeout); !st.is_ok()) return fail("flush", st);
    io_s.push_back(seconds_since(t));
    const auto io_after = rt.store().stats();
    io_pass_bytes = io_after.bytes_read - io_before.bytes_read + io_after.bytes_written -
                    io_before.bytes_written;
    // The pipelined step, to the last write-back.
    if (Status st = write_gradients(); !st.is_ok()) return fail("gradients", st);
    const auto store_before = rt.store().stats();
    t = Clock::now();
    auto step = opt.step(1.0);
    if (!step) return fail("step", step.status());
    if (Status st = s.flush(timeout); !st.is_ok()) return fail("flush", st);
    pipelined_s.push_back(seconds_since(t));
    in_step_update_s.push_back(step->update_seconds);
    in_step_read_wait_s.push_back(step->read_wait_seconds);
    in_step_write_wait_s.push_back(step->write_wait_seconds);
    const auto store_after = rt.store().stats();
    pipelined_read_bytes = store_after.bytes_read - store_before.bytes_read;
    pipelined_written_bytes = store_after.bytes_written - store_before.bytes_written;
    // The serial baseline: per sub-group read, update, write and wait; no prefetch.
    if (Status st = write_gradients(); !st.is_ok()) return fail("gradients", st);
    t = Clock::now();
    pass = opt.run_pass({/*read=*/true, /*update=*/true, /*write=*/true, /*overlap=*/false}, 1.0f);
    if (!pass) return fail("serial step", pass.status());
    if (Status st = s.flush(timeout); !st.is_ok()) return fail("flush", st);
    serial_s.push_back(seconds_since(t));
    progress.update(r + 1);
  }
  progress.finish();

  const double read = median(read_s), write = median(write_s), update = median(update_s);
  const double pipelined = median(pipelined_s), serial = median(serial_s);
  const double io = median(io_s);
  const double io_bound_s = std::max(io, update);
  const auto [slowest, slowest_s] = slowest_stage(read, update, write);
  // Like for like with the step, which also reads the gradients and writes the weights: each
  // pass's time at the bytes the step moved in its directions, at the rate the pass measured.
  const double read_at_step_s = at_bytes(read, read_pass_bytes, pipelined_read_bytes);
  const double write_at_step_s = at_bytes(write, write_pass_bytes, pipelined_written_bytes);
  const double io_at_step_bytes_s =
      at_bytes(io, io_pass_bytes, pipelined_read_bytes + pipelined_written_bytes);
  const auto [slowest_at_step, slowest_at_step_s] =
      slowest_stage(read_at_step_s, update, write_at_step_s);
  const uint64_t state_bytes = *n * 12;

  nlohmann::json j;
  j["params"] = *n;
  j["param_tensors"] = tensors.size();
  j["pinned_budget_bytes"] = *budget;
  j["sub_group_elements"] = sub;
  j["sub_groups"] = opt.sub_group_count();
  j["threads"] = opt.adam().threads();
  j["io_engine"] = rt.engine().name();
  j["simd"] = optim::to_string(opt.adam().simd_level());
  j["repeats"] = args.repeats;
  j["state_bytes"] = state_bytes;
  j["read_s"] = read;
  j["read_pass_nvme_bytes"] = read_pass_bytes;
  j["update_s"] = update;
  j["write_s"] = write;
  j["slowest_stage"] = slowest;
  j["slowest_stage_s"] = slowest_s;
  j["read_write_overlapped_s"] = io;
  j["pipelined_step_s"] = pipelined;
  j["pipelined_vs_overlapped_io"] = pipelined / io_bound_s;
  j["read_write_overlapped_nvme_bytes"] = io_pass_bytes;
  j["read_write_overlapped_s_at_step_bytes"] = io_at_step_bytes_s;
  j["pipelined_vs_overlapped_io_at_step_bytes"] = pipelined / std::max(update, io_at_step_bytes_s);
  j["write_pass_nvme_bytes"] = write_pass_bytes;
  j["read_s_at_step_bytes"] = read_at_step_s;
  j["write_s_at_step_bytes"] = write_at_step_s;
  j["slowest_stage_at_step_bytes"] = slowest_at_step;
  j["slowest_stage_s_at_step_bytes"] = slowest_at_step_s;
  j["pipelined_vs_slowest_at_step_bytes"] = pipelined / slowest_at_step_s;
  j["pipelined_nvme_bytes_read"] = pipelined_read_bytes;
  j["pipelined_nvme_bytes_written"] = pipelined_written_bytes;
  j["pipelined_update_s"] = median(in_step_update_s);
  j["pipelined_read_wait_s"] = median(in_step_read_wait_s);
  j["pipelined_write_wait_s"] = median(in_step_write_wait_s);
  j["serial_step_s"] = serial;
  j["pipelined_vs_slowest"] = pipelined / slowest_s;
  j["speedup_vs_serial"] = serial / pipelined;
  j["read_s_all"] = read_s;
  j["update_s_all"] = update_s;
  j["write_s_all"] = write_s;
  j["read_write_overlapped_s_all"] = io_s;
  j["pipelined_step_s_all"] = pipelined_s;
  j["serial_step_s_all"] = serial_s;
  if (args.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf(
      "%llu parameters in %zu tensors, %zu sub-groups of %llu elements, pinned budget "
      "%llu bytes, %d threads (%s); medians of %d\n",
      static_cast<unsigned long long>(*n), tensors.size(), opt.sub_group_count(),
      static_cast<unsigned long long>(sub), static_cast<unsigned long long>(*budget),
      opt.adam().threads(), optim::to_string(opt.adam().simd_level()), args.repeats);
  std::printf("I/O: %s\n", rt.engine().name());
  Table table({"measurement", "seconds", "GB/s of states"});
  table.add_row({"read alone (NVMe)", fixed(read, 3), fixed(gbps(state_bytes, read))});
  table.add_row({"update alone (memory)", fixed(update, 3), fixed(gbps(state_bytes, update))});
  table.add_row({"write alone (NVMe)", fixed(write, 3), fixed(gbps(state_bytes, write))});
  table.add_row(
      {"read + write overlapped (no update)", fixed(io, 3), fixed(gbps(state_bytes, io))});
  table.add_row({"pipelined step", fixed(pipelined, 3), fixed(gbps(state_bytes, pipelined))});
  table.add_row({"  of which update", fixed(median(in_step_update_s), 3), "-"});
  table.add_row({"  of which waiting for reads", fixed(median(in_step_read_wait_s), 3), "-"});
  table.add_row(
      {"  of which waiting for write-backs", fixed(median(in_step_write_wait_s), 3), "-"});
  table.add_row({"serial step", fixed(serial, 3), fixed(gbps(state_bytes, serial))});
  std::printf("%s", table.render().c_str());
  std::printf("slowest stage: %s; pipelined / slowest stage: %.2f; speed-up over serial: %.2fx\n",
              slowest, pipelined / slowest_s, serial / pipelined);
  std::printf(
      "at the step's bytes (the stages' rates): read alone %.3f s, write alone %.3f s; "
      "pipelined / slowest stage (%s): %.2f\n",
      read_at_step_s, write_at_step_s, slowest_at_step, pipelined / slowest_at_step_s);
  std::printf("pipelined / max(update, read + write overlapped): %.2f\n", pipelined / io_bound_s);
  std::printf(
      "NVMe bytes: pipelined step %s read + %s written, read + write pass %s; that pass's rate "
      "over the step's bytes: %.3f s, pipelined / that: %.2f\n",
      format_bytes(pipelined_read_bytes).c_str(), format_bytes(pipelined_written_bytes).c_str(),
      format_bytes(io_pass_bytes).c_str(), io_at_step_bytes_s,
      pipelined / std::max(update, io_at_step_bytes_s));
  return 0;
}

}  // namespace

void add_optimizer_command(CLI::App& bench) {
  auto args = std::make_shared<OptimizerBenchArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "optimizer", "Optimizer step over NVMe states: pipelined vs serial vs each stage alone");
  cmd->add_option("--params", args->params, "Parameters (K/M/G: decimal)")->capture_default_str();
  cmd->add_option("--param-elements", args->param_elements,
                  "Elements per parameter tensor (K/M/G: decimal)")
      ->capture_default_str();
  cmd->add_option("--pinned-budget", args->pinned_budget, "Pinned budget (e.g. 256MiB)")
      ->capture_default_str();
  cmd->add_option("--sub-group-bytes", args->sub_group_bytes,
                  "Sub-group size per state tensor (0: sized from the pinned budget; else as "
                  "strata_optimizer_options.sub_group_bytes)")
      ->capture_default_str();
  cmd->add_option("--nvme", args->nvme, "Directory for the swap file")->capture_default_str();
  cmd->add_option("--threads", args->threads, "Optimizer threads (0: one per available CPU)")
      ->capture_default_str()
      ->check(CLI::Range(0, 256));
  cmd->add_option("--repeats", args->repeats, "Repetitions of every measurement (median)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  cmd->add_option("--model-drive", args->model_drive,
                  "Pace I/O as a full-duplex drive of these rates over the real one, e.g. "
                  "read=0.3G,write=0.3G (bytes/s; below what the real device delivers)");
  cmd->add_flag("--json", args->json, "Print one JSON object instead of a table");
  cmd->callback([args] {
    const int rc = run_optimizer_bench(*args);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace strata::bench
