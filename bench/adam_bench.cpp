// `strata bench adam`: parameter updates per second of Strata's CPU AdamW on N fp32 parameters,
// beside references measured in the same run with the same threads:
//  - the bound: CpuAdam::step_traffic on the same arrays, which moves exactly the bytes of a step
//    (read p, m, v, g; write p, m, v and the copy) with the step's own chunks, threads, pages and
//    streaming stores, but none of its arithmetic, in two loops: the update's own, and (AVX-512)
//    the same with every read stream prefetched ahead in software. The faster is the bound: the
//    update's loop alone ran 3-5% slower than the update itself on a Zen 5 guest, so it was no
//    bound (docs/optimizer.md, "The bound, measured again"). of_bound = step rate / bound rate
//    says how close the update comes to what this memory system gives that access pattern. (A
//    STREAM triad, reported for reference, is no bound either: one read stream fewer and in-place
//    streams that skip a read for ownership let the update outrun it by 15-45%.)
//  - torch.optim.AdamW, foreach=False and foreach=True (the faster one counts), run by
//    /usr/bin/python3 as a subprocess on the same N and torch.set_num_threads(T), when importable.
// Each side runs 2 warm-up steps, then --steps timed steps; medians are reported (the fastest
// step too). A step is one update of all N parameters. Ratios come from medians.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench_commands.h"
#include "common/interrupt_cleanup.h"
#include "common/report.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "optim/cpu_adam.h"
#include "progress.h"

namespace strata::bench {
namespace {

using optim::AdamWParams;
using optim::AdamWSlice;
using optim::CpuAdam;

struct AdamBenchArgs {
  std::string params = "50M";
  int threads = 0;
  int numa_node = -1;  // >= 0: one worker bound per core of this node (CpuAdamOptions::numa_node)
  int steps = 10;
  std::string simd = "auto";
  std::string grad_dtype = "fp32";
  std::string param_out = "none";
  bool hugepages = true;
  bool torch = true;
  bool json = false;
};

// "50M", "1.5G", "123456": decimal multiples, as parameter counts are quoted.
std::optional<uint64_t> parse_count(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !(value > 0)) return std::nullopt;
  double scale = 1;
  const std::string suffix(end);
  if (suffix == "K" || suffix == "k") {
    scale = 1e3;
  } else if (suffix == "M" || suffix == "m") {
    scale = 1e6;
  } else if (suffix == "G" || suffix == "g" || suffix == "B") {
    scale = 1e9;
  } else if (!suffix.empty()) {
    return std::nullopt;
  }
  const double count = value * scale;
  if (count > 1e12) return std::nullopt;
  return static_cast<uint64_t>(count);
}

std::optional<DType> parse_dtype(const std::string& name) {
  if (name == "fp32") return DType::kFloat32;
  if (name == "bf16") return DType::kBFloat16;
  if (name == "fp16") return DType::kFloat16;
  return std::nullopt;
}

// Anonymous memory, optionally on transparent huge pages (as Strata's pinned arena is): fewer TLB
// misses when streaming gigabytes.
class Region {
 public:
  Region(size_t bytes, bool hugepages) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    if (hugepages) madvise(p, bytes, MADV_HUGEPAGE);
    data_ = p;
  }
  ~Region() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  bool ok() const { return data_ != nullptr; }

 private:
  void* data_ = nullptr;
  size_t bytes_;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t k = v.size() / 2;
  return v.size() % 2 ? v[k] : (v[k - 1] + v[k]) / 2;
}

// Fills [0, n) in parallel on the optimizer's own threads, so pages are first touched (and placed)
// by the threads that will stream them.
template <typename Fill>
void parallel_fill(CpuAdam& adam, size_t n, Fill fill) {
  const int threads = adam.threads();
  auto job = [&](int index) {
    const size_t begin = n * index / threads;
    const size_t end = n * (index + 1) / threads;
    for (size_t i = begin; i < end; ++i) fill(i);
  };
  adam.pool().run_each(job);
}

// Median and best of repeated timings of one thing.
struct Timing {
  double median_s = 0;
  double best_s = 0;
};

Timing summarize(const std::vector<double>& times) {
  return {median(times), *std::min_element(times.begin(), times.end())};
}

// Strata's steps, its traffic passes and the triad passes alternate (step, traffic, streaming
// triad, ordinary triad, ...), so on
// a shared machine both see the same interference and their ratio stays meaningful; half of them
// run before torch and half after, for the same reason. The triad follows STREAM's rules: arrays
// far larger than the caches, 12 bytes counted per fp32 element; its three arrays together are
// as large as AdamW's four.
class Workload {
 public:
  Workload(CpuAdam& adam, const AdamBenchArgs& args, uint64_t n, DType grad_dtype,
           std::optional<DType> out_dtype)
      : adam_(adam),
        n_(n),
        triad_n_(std::max<uint64_t>(n * 4 / 3, 1 << 20)),
        p_(n * 4, args.hugepages),
        m_(n * 4, args.hugepages),
        v_(n * 4, args.hugepages),
        g_(n * dtype_size(grad_dtype), args.hugepages),
        out_(out_dtype ? n * 2 : 1, args.hugepages),
        a_(triad_n_ * 4, args.hugepages),
        b_(triad_n_ * 4, args.hugepages),
        c_(triad_n_ * 4, args.hugepages) {
    slice_ = {p_.as<float>(),
              m_.as<float>(),
              v_.as<float>(),
              g_.as<void>(),
              grad_dtype,
              out_dtype ? out_.as<void>() : nullptr,
              out_dtype.value_or(DType::kBFloat16),
              n};
  }

  Status prepare() {
    if (!p_.ok() || !m_.ok() || !v_.ok() || !g_.ok() || !out_.ok() || !a_.ok() || !b_.ok() ||
        !c_.ok()) {
      return Status::error(STRATA_E_NOMEM, "cannot map " + std::to_string(n_) +
                                               " parameters' states and the triad arrays");
    }
    const DType grad_dtype = slice_.grad_dtype;
    parallel_fill(adam_, n_, [&](size_t i) {
      p_.as<float>()[i] = static_cast<float>(static_cast<int64_t>(i % 2001) - 1000) * 1e-3f;
      m_.as<float>()[i] = 0;
      v_.as<float>()[i] = 0;
      const float grad = static_cast<float>(static_cast<int64_t>(i % 997) - 498) * 1e-4f;
      if (grad_dtype == DType::kFloat32) {
        g_.as<float>()[i] = grad;
      } else {
        // Any normal value will do for timing; the top half of an fp32 is a bf16.
        uint32_t bits;
        std::memcpy(&bits, &grad, 4);
        g_.as<uint16_t>()[i] =
            static_cast<uint16_t>(grad_dtype == DType::kBFloat16 ? bits >> 16 : 0x3C00 + i % 64);
      }
    });
    parallel_fill(adam_, triad_n_, [&](size_t i) {
      a_.as<float>()[i] = 0;
      b_.as<float>()[i] = 1;
      c_.as<float>()[i] = 2;
    });
    return run(/*rounds=*/2, /*record=*/false);  // warm-up: page tables, caches, frequency
  }

  // Rounds of one step, its traffic passes and two triad passes. Which of the step and the
  // traffic passes goes first turns round by round: each inherits the caches its predecessor
  // left (dirty lines to write back), and the same predecessor every time would tilt the ratio.
  Status run(int rounds, bool record = true) {
    AdamWParams h;
    h.weight_decay = 0.01;
    const int passes = adam_.has_prefetched_traffic() ? 3 : 2;
    for (int k = 0; k < rounds; ++k) {
      h.step = ++step_;
      double step_s = 0, traffic_s = 0, prefetched_s = 0;
      for (int j = 0; j < passes; ++j) {
        const int pass = (round_ + j) % passes;
        const auto start = std::chrono::steady_clock::now();
        if (pass == 0) {
          STRATA_TRY(adam_.step(h, {&slice_, 1}));
          step_s = seconds_since(start);
        } else if (pass == 1) {
          // Scale 0: the same traffic, the states left as the step made them.
          STRATA_TRY(adam_.step_traffic(0.0f, {&slice_, 1}));
          traffic_s = seconds_since(start);
        } else {
          STRATA_TRY(adam_.step_traffic(0.0f, {&slice_, 1}, CpuAdam::TrafficLoop::kPrefetched));
          prefetched_s = seconds_since(start);
        }
      }
      ++round_;
      auto start = std::chrono::steady_clock::now();
      adam_.triad(a_.as<float>(), b_.as<float>(), c_.as<float>(), 3.0f, triad_n_, true);
      const double streaming_s = seconds_since(start);
      start = std::chrono::steady_clock::now();
      adam_.triad(a_.as<float>(), b_.as<float>(), c_.as<float>(), 3.0f, triad_n_, false);
      const double regular_s = seconds_since(start);
      if (!record) continue;
      steps_.push_back(step_s);
      traffic_.push_back(traffic_s);
      if (passes == 3) prefetched_.push_back(prefetched_s);
      streaming_.push_back(streaming_s);
      regular_.push_back(regular_s);
    }
    return Status::ok();
  }

  Timing strata() const { return summarize(steps_); }
  Timing traffic() const { return summarize(traffic_); }
  // Nothing where the SIMD level has no prefetched pass (CpuAdam::has_prefetched_traffic).
  std::optional<Timing> prefetched_traffic() const {
    if (prefetched_.empty()) return std::nullopt;
    return summarize(prefetched_);
  }
  Timing triad_streaming() const { return summarize(streaming_); }
  Timing triad_regular() const { return summarize(regular_); }
  uint64_t triad_bytes() const { return triad_n_ * 12; }

 private:
  CpuAdam& adam_;
  const uint64_t n_;
  const uint64_t triad_n_;
  Region p_, m_, v_, g_, out_, a_, b_, c_;
  AdamWSlice slice_;
  int64_t step_ = 0;
  int round_ = 0;
  std::vector<double> steps_, traffic_, prefetched_, streaming_, regular_;
};

// Times torch.optim.AdamW steps (median) on fp32 params and grads, foreach off and on.
const char* kTorchScript = R"PY(
import json, sys, time, torch
n, threads, steps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
torch.manual_seed(0)
out = {}
for foreach in (False, True):
    p = torch.nn.Parameter(torch.randn(n) * 0.5)
    p.grad = torch.randn(n) * 1e-2
    opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, foreach=foreach)
    times = []
    for k in range(2 + steps):
        t = time.perf_counter()
        opt.step()
        if k >= 2:
            times.append(time.perf_counter() - t)
    times.sort()
    mid = len(times) // 2
    out["foreach" if foreach else "single"] = {
        "median_s": times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2,
        "best_s": times[0]}
    del opt, p
print(json.dumps(out))
)PY";

struct TorchResult {
  std::optional<double> single_median_s, foreach_median_s;
  std::string note;  // why torch did not run, if it did not
};

TorchResult time_torch(uint64_t n, int threads, int steps) {
  TorchResult result;
  // NOLINTNEXTLINE(concurrency-mt-unsafe): the CLI runs no other thread at this point.
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    result.note = "/usr/bin/python3 cannot import torch";
    return result;
  }
  // The script goes through a temporary file: popen's shell would need it quoted otherwise.
  char path[] = "/tmp/strata-adam-bench-XXXXXX.py";
  const int fd = mkstemps(path, 3);
  if (fd < 0) {
    result.note = "cannot create a temporary script";
    return result;
  }
  // Removed on Ctrl-C or SIGTERM too (common/interrupt_cleanup.h), not only on the way out.
  const UniqueFd tmp_dir(::open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  InterruptCleanup on_signal = InterruptCleanup::arm(tmp_dir.get(), path + std::strlen("/tmp/"),
                                                     InterruptCleanup::What::kFile);
  const size_t length = std::strlen(kTorchScript);
  const bool written = write(fd, kTorchScript, length) == static_cast<ssize_t>(length);
  close(fd);
  std::string output;
  if (written) {
    const std::string command = "/usr/bin/python3 " + std::string(path) + " " + std::to_string(n) +
                                " " + std::to_string(threads) + " " + std::to_string(steps);
    if (FILE* pipe = popen(command.c_str(), "r")) {
      char buffer[4096];
      size_t got;
      while ((got = fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, got);
      if (pclose(pipe) != 0) output.clear();
    }
  }
  on_signal.disarm();
  unlink(path);
  const auto parsed = nlohmann::json::parse(output, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.contains("single") || !parsed.contains("foreach")) {
    result.note = "the torch subprocess failed";
    return result;
  }
  result.single_median_s = parsed["single"]["median_s"].get<double>();
  result.foreach_median_s = parsed["foreach"]["median_s"].get<double>();
  return result;
}

int run_adam_bench(const AdamBenchArgs& args) {
  const auto n = parse_count(args.params);
  if (!n) {
    std::fprintf(stderr, "strata bench adam: --params '%s' is not a count like 50M\n",
                 args.params.c_str());
    return 2;
  }
  const auto grad_dtype = parse_dtype(args.grad_dtype);
  const auto out_dtype = parse_dtype(args.param_out);
  optim::CpuAdamOptions options;
  options.threads = args.threads;
  options.numa_node = args.numa_node;
  if (args.simd != "auto") options.simd = optim::parse_simd_level(args.simd);
  auto adam = CpuAdam::create(options);
  if (!adam) {
    std::fprintf(stderr, "strata bench adam: %s\n", adam.status().message().c_str());
    // A node this machine does not have is bad input; anything else (no thread, no binding) is
    // the machine's.
    return adam.status().code() == STRATA_E_INVALID ? 2 : 1;
  }
  CpuAdam& optimizer = **adam;
  const int threads = optimizer.threads();
  const std::optional<DType> copy =
      args.param_out == "none" ? std::nullopt : std::optional<DType>(*out_dtype);

  Workload work(optimizer, args, *n, *grad_dtype, copy);
  // Three stages, in the order they run: half of Strata's steps, torch's, the other half.
  ProgressDisplay progress("bench adam: strata", 3, ProgressDisplay::Unit::kCount, "stages",
                           is_interactive_terminal(args.json));
  progress.update(0);
  Status status = work.prepare();
  if (status) status = work.run(args.steps / 2);
  progress.set_label("bench adam: torch");
  progress.update(1);
  TorchResult torch;
  if (args.torch) {
    torch = time_torch(*n, threads, args.steps);
  } else {
    torch.note = "--no-torch";
  }
  progress.set_label("bench adam: strata");
  progress.update(2);
  if (status) status = work.run(args.steps - args.steps / 2);
  progress.update(3);
  progress.finish();
  if (!status) {
    std::fprintf(stderr, "strata bench adam: %s\n", status.message().c_str());
    return 1;
  }
  struct {
    Timing strata, traffic;
    std::optional<Timing> prefetched;
    Timing triad_streaming, triad_regular;
  } r{work.strata(), work.traffic(), work.prefetched_traffic(), work.triad_streaming(),
      work.triad_regular()};

  // Bytes one update must move: p, m, v read and written, the gradient read, the copy written.
  const uint64_t bytes_per_param = 24 + dtype_size(*grad_dtype) + (copy ? 2 : 0);
  const uint64_t triad_bytes = work.triad_bytes();
  // The triad takes whichever store flavour streamed faster.
  const double triad_gbps = std::max(gbps(triad_bytes, r.triad_streaming.median_s),
                                     gbps(triad_bytes, r.triad_regular.median_s));
  const double triad_best_gbps = std::max(gbps(triad_bytes, r.triad_streaming.best_s),
                                          gbps(triad_bytes, r.triad_regular.best_s));
  const double strata_rate = *n / r.strata.median_s / 1e6;
  const double strata_best_rate = *n / r.strata.best_s / 1e6;
  // The bound is the faster traffic pass: what this memory system did with the step's bytes.
  const double loop_rate = *n / r.traffic.median_s / 1e6;
  std::optional<double> prefetched_rate;
  if (r.prefetched) prefetched_rate = *n / r.prefetched->median_s / 1e6;
  const bool prefetched_bound = prefetched_rate && *prefetched_rate > loop_rate;
  const double bound_rate = prefetched_bound ? *prefetched_rate : loop_rate;
  const double bound_best_s =
      r.prefetched ? std::min(r.traffic.best_s, r.prefetched->best_s) : r.traffic.best_s;
  const double bound_best_rate = *n / bound_best_s / 1e6;
  const char* bound_pass = prefetched_bound ? "prefetched" : "the update's loop";
  const double triad_rate = triad_gbps * 1e9 / bytes_per_param / 1e6;
  std::optional<double> torch_single, torch_foreach, torch_rate;
  if (torch.single_median_s) torch_single = *n / *torch.single_median_s / 1e6;
  if (torch.foreach_median_s) torch_foreach = *n / *torch.foreach_median_s / 1e6;
  if (torch_single && torch_foreach) torch_rate = std::max(*torch_single, *torch_foreach);

  auto or_null = [](const std::optional<double>& x) {
    return x ? nlohmann::json(*x) : nlohmann::json(nullptr);
  };
  if (args.json) {
    nlohmann::json j;
    j["params"] = *n;
    j["threads"] = threads;
    j["numa_node"] = args.numa_node >= 0 ? nlohmann::json(args.numa_node) : nlohmann::json(nullptr);
    j["simd"] = optim::to_string(optimizer.simd_level());
    j["grad_dtype"] = args.grad_dtype;
    j["param_out"] = args.param_out;
    j["hugepages"] = args.hugepages;
    j["steps"] = args.steps;
    j["statistic"] = "median of the timed steps (best_* fields: fastest step)";
    j["strata_mparams_per_s"] = strata_rate;
    j["strata_best_mparams_per_s"] = strata_best_rate;
    j["bytes_per_param"] = bytes_per_param;
    j["strata_gbps"] = strata_rate * 1e6 * bytes_per_param / 1e9;
    j["triad_streaming_gbps"] = gbps(triad_bytes, r.triad_streaming.median_s);
    j["triad_regular_gbps"] = gbps(triad_bytes, r.triad_regular.median_s);
    j["triad_best_gbps"] = triad_best_gbps;
    j["bound"] =
        "step_traffic: the step's own memory traffic without its arithmetic, the faster of its "
        "two loops";
    j["bound_pass"] = bound_pass;
    j["bound_loop_mparams_per_s"] = loop_rate;
    j["bound_prefetched_mparams_per_s"] = or_null(prefetched_rate);
    j["bound_mparams_per_s"] = bound_rate;
    j["bound_gbps"] = bound_rate * 1e6 * bytes_per_param / 1e9;
    j["triad_mparams_per_s"] = triad_rate;
    j["bound_best_mparams_per_s"] = bound_best_rate;
    j["of_bound"] = strata_rate / bound_rate;
    j["of_bound_best"] = strata_best_rate / bound_best_rate;
    j["torch_single_mparams_per_s"] = or_null(torch_single);
    j["torch_foreach_mparams_per_s"] = or_null(torch_foreach);
    j["torch_mparams_per_s"] = or_null(torch_rate);
    j["vs_torch"] =
        torch_rate ? nlohmann::json(strata_rate / *torch_rate) : nlohmann::json(nullptr);
    if (!torch.note.empty()) j["torch_note"] = torch.note;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }

  const std::string binding =
      args.numa_node >= 0 ? ", bound one per core of NUMA node " + std::to_string(args.numa_node)
                          : "";
  std::printf(
      "AdamW on %s parameters, %d thread(s)%s, %s kernels, %s gradients%s%s; median of %d "
      "steps\n\n",
      args.params.c_str(), threads, binding.c_str(), optim::to_string(optimizer.simd_level()),
      args.grad_dtype.c_str(), copy ? ", weight copy " : "", copy ? args.param_out.c_str() : "",
      args.steps);
  Table table({"", "M params/s", "ms/step", "vs torch", "of bound"});
  auto ratio = [](std::optional<double> a, std::optional<double> b) {
    return a && b ? fixed(*a / *b, 2) + "x" : std::string("-");
  };
  table.add_row({"strata", fixed(strata_rate, 0), fixed(r.strata.median_s * 1e3, 2),
                 ratio(strata_rate, torch_rate), fixed(100 * strata_rate / bound_rate, 1) + "%"});
  auto traffic_row = [&](const std::string& name, double rate, bool bound) {
    table.add_row({name + (bound ? " = bound" : ""), fixed(rate, 0), fixed(*n / rate / 1e3, 2),
                   ratio(rate, torch_rate), fixed(100 * rate / bound_rate, 1) + "%"});
  };
  traffic_row("traffic, the update's loop", loop_rate, !prefetched_bound);
  if (prefetched_rate) traffic_row("traffic, prefetched", *prefetched_rate, prefetched_bound);
  table.add_row({"triad / " + std::to_string(bytes_per_param) + " B (no bound)",
                 fixed(triad_rate, 0), fixed(*n / triad_rate / 1e3, 2),
                 ratio(triad_rate, torch_rate), fixed(100 * triad_rate / bound_rate, 1) + "%"});
  if (torch_single) {
    table.add_row({"torch AdamW foreach=False", fixed(*torch_single, 0),
                   fixed(*torch.single_median_s * 1e3, 2), ratio(torch_single, torch_rate), "-"});
    table.add_row({"torch AdamW foreach=True", fixed(*torch_foreach, 0),
                   fixed(*torch.foreach_median_s * 1e3, 2), ratio(torch_foreach, torch_rate), "-"});
  }
  std::printf("%s\n", table.render().c_str());
  std::printf("strata moves %s GB/s (%d B per parameter); its traffic alone %s GB/s (%s)\n",
              fixed(strata_rate * 1e6 * bytes_per_param / 1e9, 1).c_str(),
              static_cast<int>(bytes_per_param),
              fixed(bound_rate * 1e6 * bytes_per_param / 1e9, 1).c_str(), bound_pass);
  std::printf("fastest step: strata %s M params/s, %s%% of the fastest traffic pass\n",
              fixed(strata_best_rate, 0).c_str(),
              fixed(100 * strata_best_rate / bound_best_rate, 1).c_str());
  std::printf("triad (median pass): %s GB/s with streaming stores, %s GB/s with ordinary stores\n",
              fixed(gbps(triad_bytes, r.triad_streaming.median_s), 1).c_str(),
              fixed(gbps(triad_bytes, r.triad_regular.median_s), 1).c_str());
  if (!torch.note.empty()) std::printf("torch: not measured (%s)\n", torch.note.c_str());
  return 0;
}

}  // namespace

void add_adam_command(CLI::App& bench) {
  auto args = std::make_shared<AdamBenchArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "adam", "CPU AdamW updates/s vs its own memory traffic and torch.optim.AdamW");
  cmd->add_option("--params", args->params, "Parameters to update per step (K/M/G: decimal)")
      ->capture_default_str();
  cmd->add_option("--threads", args->threads, "Optimizer threads (0: one per available CPU)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--numa-node", args->numa_node,
                  "Bind one optimizer thread per core of this NUMA node (-1: unbound, the "
                  "kernel's scheduler places them)")
      ->capture_default_str()
      ->check(CLI::Range(-1, 1023));
  cmd->add_option("--steps", args->steps,
                  "Timed steps (and triad passes) per side, after 2 warm-up steps")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--simd", args->simd, "Kernel level: auto, scalar, avx2 or avx512")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "scalar", "avx2", "avx512"}));
  cmd->add_option("--grad-dtype", args->grad_dtype, "Gradient dtype for Strata: fp32, bf16, fp16")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  cmd->add_option("--param-out", args->param_out,
                  "Also write the updated weights as bf16 or fp16 in the same pass")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "bf16", "fp16"}));
  cmd->add_flag("!--no-hugepages", args->hugepages,
                "Do not ask for transparent huge pages for Strata's and the triad's arrays");
  cmd->add_flag("!--no-torch", args->torch, "Skip torch.optim.AdamW");
  cmd->add_flag("--json", args->json, "Print one JSON object instead of a table");
  cmd->callback([args] {
    const int rc = run_adam_bench(*args);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace strata::bench
