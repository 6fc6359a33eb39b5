// `strata bench finetune`: the main job. Fine-tunes a (scaled) model for a few steps through the
// C API with the Strata policy and with a faithful ZeRO-Infinity model, each in its own process,
// and compares peak host memory and step time.
//
// The parent process only plans, starts the workers (fork + exec of /proc/self/exe with hidden
// --worker options), shows progress, serves metrics and reports: it never creates a runtime, so
// that each worker's peak host memory is its strategy's alone.
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_commands.h"
#include "common/align.h"
#include "common/assert.h"
#include "common/report.h"
#include "common/units.h"
#include "finetune/finetune_options.h"
#include "finetune/finetune_output.h"
#include "finetune/finetune_worker.h"
#include "progress.h"
#include "storage/output_path.h"
#include "telemetry/counters.h"
#include "telemetry/metrics_server.h"

namespace strata::bench {
namespace finetune {
namespace {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

// The worker finds its end of the pipe here (after fork, before exec).
constexpr int kWorkerFd = 3;
// Explicit limit on one line from a worker (the result with its memory series is the longest).
constexpr size_t kMaxLineBytes = size_t{64} << 20;

// The live numbers a Prometheus scrape sees: one family per quantity, the strategy, tier and
// direction as labels (docs/telemetry.md lists them).
class LiveMetrics {
 public:
  static Result<std::unique_ptr<LiveMetrics>> create(const FinetunePlan& plan) {
    auto m = std::unique_ptr<LiveMetrics>(new LiveMetrics());
    m->sets_.resize(plan.contenders.size());
    for (const Contender& c : plan.contenders) {
      const std::pair<std::string, std::string> strategy{"strategy", c.name};
      Set& set = m->sets_[c.index];
      auto gauge = [&](Gauge** out, telemetry::MetricInfo info) -> Status {
        info.labels.insert(info.labels.begin(), strategy);
        STRATA_ASSIGN_OR_RETURN(Gauge * g, m->registry_.add_gauge(info));
        *out = g;
        return Status::ok();
      };
      auto counter = [&](Counter** out, telemetry::MetricInfo info) -> Status {
        info.labels.insert(info.labels.begin(), strategy);
        STRATA_ASSIGN_OR_RETURN(Counter * c, m->registry_.add_counter(info));
        *out = c;
        return Status::ok();
      };
      const char* kMemory = "strata_finetune_memory_bytes";
      const char* kMemoryHelp =
          "Memory a worker holds per tier (host: what the OS charges it, emulated device "
          "excluded)";
      STRATA_TRY(gauge(&set.host, {kMemory, kMemoryHelp, "bytes", 1.0, {{"tier", "host"}}}));
      STRATA_TRY(gauge(&set.pinned, {kMemory, kMemoryHelp, "bytes", 1.0, {{"tier", "pinned"}}}));
      STRATA_TRY(gauge(&set.device, {kMemory, kMemoryHelp, "bytes", 1.0, {{"tier", "device"}}}));
      const char* kNvme = "strata_finetune_nvme_bytes_total";
      const char* kNvmeHelp = "Bytes moved between a worker and NVMe";
      STRATA_TRY(counter(&set.read, {kNvme, kNvmeHelp, "bytes", 1.0, {{"direction", "read"}}}));
      STRATA_TRY(counter(&set.written, {kNvme, kNvmeHelp, "bytes", 1.0, {{"direction", "write"}}}));
      const char* kRate = "strata_finetune_nvme_rate_bytes_per_second";
      const char* kRateHelp = "NVMe rate of a worker over the last reporting interval";
      STRATA_TRY(gauge(&set.read_rate, {kRate,
                                        kRateHelp,
                                        "bytes_per_second",
                                        1.0,
                                        {{"direction", "read"}},
                                        /*with_peak=*/false}));
      STRATA_TRY(gauge(&set.write_rate, {kRate,
                                         kRateHelp,
                                         "bytes_per_second",
                                         1.0,
                                         {{"direction", "write"}},
                                         /*with_peak=*/false}));
      STRATA_TRY(counter(&set.stall_us, {"strata_finetune_stall_seconds_total",
                                         "Time a worker's training loop waited for its data "
                                         "(Strata: inside strata_acquire; DeepSpeed: on its "
                                         "aio requests)",
                                         "seconds", 1e-6}));
      STRATA_TRY(gauge(&set.running, {"strata_finetune_running",
                                      "1 while the worker runs",
                                      "",
                                      1.0,
                                      {},
                                      /*with_peak=*/false}));
      // The runtime's own busy times and device copies (strata_stats): Strata's workers only;
      // DeepSpeed's move their bytes through DeepSpeed's aio, which reports neither, and a series
      // that stayed 0 for them would read as an idle drive.
      if (c.kind != ContenderKind::kStrata) continue;
      const char* kBusy = "strata_finetune_nvme_busy_seconds_total";
      const char* kBusyHelp =
          "Time a worker's NVMe transfers kept the drive busy: with a read, a write, either in "
          "flight";
      for (size_t d = 0; d < kBusyDirections.size(); ++d) {
        STRATA_TRY(
            counter(&set.busy_us[d],
                    {kBusy, kBusyHelp, "seconds", 1e-6, {{"direction", kBusyDirections[d]}}}));
      }
      const char* kCopy = "strata_finetune_device_copy_bytes_total";
      const char* kCopyHelp = "Bytes a worker copied between pinned memory and the device";
      const char* kCopyBusy = "strata_finetune_device_copy_busy_seconds_total";
      const char* kCopyBusyHelp =
          "Time a worker had at least one copy between pinned memory and the device in flight";
      for (size_t d = 0; d < kCopyDirections.size(); ++d) {
        STRATA_TRY(counter(&set.copy_bytes[d],
                           {kCopy, kCopyHelp, "bytes", 1.0, {{"direction", kCopyDirections[d]}}}));
        STRATA_TRY(counter(
            &set.copy_busy_us[d],
            {kCopyBusy, kCopyBusyHelp, "seconds", 1e-6, {{"direction", kCopyDirections[d]}}}));
      }
    }
    return m;
  }

  const telemetry::MetricsRegistry& registry() const { return registry_; }

  void update(const Contender& c, const json& m) {
    Set& set = sets_[c.index];
    set.host->set(m.value("host_bytes", int64_t{0}));
    set.pinned->set(m.value("pinned_bytes", int64_t{0}));
    set.device->set(m.value("device_bytes", int64_t{0}));
    set.host->observe(m.value("peak_host_bytes", int64_t{0}));
    set.pinned->observe(m.value("peak_pinned_bytes", int64_t{0}));
    set.device->observe(m.value("peak_device_bytes", int64_t{0}));
    const uint64_t read = m.value("nvme_read_bytes", uint64_t{0});
    const uint64_t written = m.value("nvme_write_bytes", uint64_t{0});
    const uint64_t stall_us = static_cast<uint64_t>(m.value("stall_seconds", 0.0) * 1e6);
    const double t = m.value("seconds", 0.0);
    if (read >= set.last_read) set.read->add(read - set.last_read);
    if (written >= set.last_written) set.written->add(written - set.last_written);
    if (stall_us >= set.last_stall_us) set.stall_us->add(stall_us - set.last_stall_us);
    if (t > set.last_t) {
      set.read_rate->set(
          static_cast<int64_t>(static_cast<double>(read - set.last_read) / (t - set.last_t)));
      set.write_rate->set(
          static_cast<int64_t>(static_cast<double>(written - set.last_written) / (t - set.last_t)));
    }
    set.last_read = read;
    set.last_written = written;
    set.last_stall_us = stall_us;
    set.last_t = t;
    // Counters from the runtime's totals so far (Strata's workers, once the runtime exists).
    auto advance = [](Counter* counter, uint64_t now, uint64_t& last) {
      if (counter != nullptr && now >= last) counter->add(now - last);
      last = now;
    };
    if (const auto busy = m.find("nvme_busy_us"); busy != m.end()) {
      for (size_t d = 0; d < kBusyDirections.size(); ++d) {
        advance(set.busy_us[d], busy->value(kBusyDirections[d], uint64_t{0}), set.last_busy_us[d]);
      }
    }
    if (const auto copies = m.find("device_copies"); copies != m.end()) {
      for (size_t d = 0; d < kCopyDirections.size(); ++d) {
        const std::string direction = kCopyDirections[d];
        advance(set.copy_bytes[d], copies->value(direction + "_bytes", uint64_t{0}),
                set.last_copy_bytes[d]);
        advance(set.copy_busy_us[d], copies->value(direction + "_busy_us", uint64_t{0}),
                set.last_copy_busy_us[d]);
      }
    }
  }
  // A worker's result carries every sample's peak, also those after its last metrics report
  // (reports come every kMetricsInterval): the peak gauges end at the run's own peaks.
  void result(const Contender& c, const json& r) {
    Set& set = sets_[c.index];
    set.host->observe(r.value("peak_host_bytes", int64_t{0}));
    set.pinned->observe(r.value("peak_pinned_bytes", int64_t{0}));
    set.device->observe(r.value("peak_device_bytes", int64_t{0}));
  }

  void running(const Contender& c, bool on) {
    Set& set = sets_[c.index];
    set.running->set(on ? 1 : 0);
    if (on) return;
    // A worker that has ended holds no memory and moves nothing: its last report's values
    // would stay beside the next worker's (a sum over strategies counted it twice). The
    // peaks stay.
    for (Gauge* g : {set.host, set.pinned, set.device, set.read_rate, set.write_rate}) g->set(0);
  }

 private:
  using Gauge = telemetry::Gauge;
  using Counter = telemetry::Counter;
  // The label values of the busy-time and copy families, in the order of Set's arrays; the
  // copies' are also the prefixes of the worker's keys ("host_to_device_bytes").
  static constexpr std::array<const char*, 3> kBusyDirections = {"read", "write", "either"};
  static constexpr std::array<const char*, 2> kCopyDirections = {"host_to_device",
                                                                 "device_to_host"};
  struct Set {
    Gauge *host = nullptr, *pinned = nullptr, *device = nullptr;
    Counter *read = nullptr, *written = nullptr, *stall_us = nullptr;
    Gauge *read_rate = nullptr, *write_rate = nullptr, *running = nullptr;
    uint64_t last_read = 0, last_written = 0, last_stall_us = 0;
    double last_t = 0;
    // Strata's workers only (nullptr for DeepSpeed's).
    std::array<Counter*, 3> busy_us = {};
    std::array<Counter*, 2> copy_bytes = {}, copy_busy_us = {};
    std::array<uint64_t, 3> last_busy_us = {};
    std::array<uint64_t, 2> last_copy_bytes = {}, last_copy_busy_us = {};
  };
  LiveMetrics() = default;
  telemetry::MetricsRegistry registry_;
  std::vector<Set> sets_;
};

// Each worker's progress on stderr through the shared display (bench/progress.h): a bar with
// rate, elapsed and ETA on a terminal, plain lines otherwise and with --json.
class Progress {
 public:
  Progress(uint32_t steps, bool json_output)
      : steps_(steps), interactive_(is_interactive_terminal(json_output)) {}
  void update(const json& p) {
    if (!display_) return;
    const std::string phase = p.value("phase", "");
    display_->set_label(strategy_ + (phase == "startup" ? " start-up" : ""));
    display_->update(p.value("fraction", 0.0) * steps_);
  }
  void start(const Contender& c) {
    strategy_ = c.name;
    started_ = Clock::now();
    std::fprintf(stderr, "[%s] worker starting\n", strategy_.c_str());
    display_.emplace(strategy_, steps_, ProgressDisplay::Unit::kCount, "steps", interactive_);
    display_->update(0);
  }
  void done(const Contender& c, const json& r) {
    if (display_) display_->update(steps_);  // the worker's result: every step is done
    const double seconds = finish();
    std::fprintf(stderr, "[%s] done in %s: peak host %s, step %.2f s\n", c.name.c_str(),
                 human_duration(seconds).c_str(),
                 format_bytes(r.value("peak_host_bytes", uint64_t{0})).c_str(),
                 r.value("step_seconds", 0.0));
  }
  void failed() { finish(); }

 private:
  double finish() {
    if (display_) display_->finish();
    display_.reset();
    return std::chrono::duration<double>(Clock::now() - started_).count();
  }
  const uint32_t steps_;
  const bool interactive_;
  std::string strategy_;
  std::optional<ProgressDisplay> display_;
  Clock::time_point started_ = Clock::now();
};

// Ctrl-C or SIGTERM while a worker runs: the parent passes the signal on to the worker, which
// removes its swap file and dies of it (common/interrupt_cleanup.h), waits for it, removes the
// partial traces and then dies of the same signal itself. Without this, SIGTERM to the parent
// alone would leave the worker's files behind. Process-wide, as signal dispositions are.
std::atomic<pid_t> current_worker{0};
volatile std::sig_atomic_t interrupted_by = 0;

void forward_to_worker(int signal_number) {
  interrupted_by = signal_number;
  const pid_t worker = current_worker.load();
  if (worker > 0) ::kill(worker, signal_number);
}

class SignalForwarding {
 public:
  SignalForwarding() {
    struct sigaction forward {};
    forward.sa_handler = forward_to_worker;
    ::sigemptyset(&forward.sa_mask);
    forward.sa_flags = SA_RESTART;
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &forward, &previous_[i]);
  }
  ~SignalForwarding() {
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &previous_[i], nullptr);
  }
  SignalForwarding(const SignalForwarding&) = delete;
  SignalForwarding& operator=(const SignalForwarding&) = delete;

  // Dies of the signal that arrived, with the default disposition, as if never caught.
  [[noreturn]] static void die_of(int signal_number) {
    std::signal(signal_number, SIG_DFL);
    ::raise(signal_number);
    ::_exit(128 + signal_number);
  }

 private:
  static constexpr std::array<int, 3> kSignals = {SIGINT, SIGTERM, SIGHUP};
  std::array<struct sigaction, 3> previous_{};
};

// Starts a worker for `contender`, follows its events until it exits, returns its result.
Result<StrategyResult> run_strategy(const FinetunePlan& plan, const Contender& contender,
                                    Progress& progress, LiveMetrics* metrics) {
  StrategyResult out;
  out.name = contender.name;
  out.kind = contender.kind;
  if (!plan.options.trace_path.empty()) {
    out.trace_path = plan.options.trace_path + "." + contender.name + ".partial.json";
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return errno_status(STRATA_E_LIMIT, "pipe2", errno);
  const std::vector<std::string> args =
      worker_arguments(plan.options, contender, kWorkerFd, out.trace_path);
  std::vector<char*> argv;
  std::string program = "strata";
  argv.push_back(program.data());
  std::vector<std::string> storage(args);
  for (std::string& a : storage) argv.push_back(a.data());
  argv.push_back(nullptr);

  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return errno_status(STRATA_E_LIMIT, "fork", errno);
  }
  if (child == 0) {
    // Only async-signal-safe calls until exec. A worker never outlives its parent; SIGTERM
    // rather than SIGKILL, so that it still removes its swap file if the parent is killed.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(126);
    if (fds[1] == kWorkerFd) {
      ::fcntl(kWorkerFd, F_SETFD, 0);
    } else if (::dup2(fds[1], kWorkerFd) < 0) {
      ::_exit(126);
    }
    ::dup2(2, 1);  // the worker's stdout never mixes into the parent's --json
    ::execv("/proc/self/exe", argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  current_worker = child;
  if (interrupted_by != 0) ::kill(child, interrupted_by);  // arrived between fork and here
  progress.start(contender);
  if (metrics != nullptr) metrics->running(contender, true);

  std::string buffer, error;
  bool have_result = false;
  char chunk[65536];
  Status status;
  for (;;) {
    const ssize_t n = ::read(fds[0], chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buffer.append(chunk, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = buffer.find('\n', start)) != std::string::npos; start = nl + 1) {
      json message = json::parse(buffer.begin() + static_cast<ptrdiff_t>(start),
                                 buffer.begin() + static_cast<ptrdiff_t>(nl), nullptr, false);
      if (message.is_discarded() || !message.is_object()) continue;
      const std::string event = message.value("event", "");
      if (event == "progress") {
        progress.update(message);
      } else if (event == "metrics") {
        if (metrics != nullptr) metrics->update(contender, message);
      } else if (event == "result") {
        if (metrics != nullptr) metrics->result(contender, message);
        out.result = std::move(message);
        have_result = true;
      } else if (event == "error") {
        error = message.value("message", "unknown error");
      }
    }
    buffer.erase(0, start);
    if (buffer.size() > kMaxLineBytes) {
      status = Status::error(STRATA_E_INTERNAL, "a worker line exceeds the limit");
      ::kill(child, SIGKILL);
      break;
    }
  }
  ::close(fds[0]);
  int wstatus = 0;
  while (::waitpid(child, &wstatus, 0) < 0 && errno == EINTR) {
  }
  current_worker = 0;
  if (metrics != nullptr) metrics->running(contender, false);
  if (interrupted_by != 0) {
    progress.failed();
    if (!out.trace_path.empty()) {
      ::unlink(out.trace_path.c_str());
      ::unlink((out.trace_path + ".runtime.json").c_str());
    }
    SignalForwarding::die_of(interrupted_by);
  }
  if (!status) return status;
  if (!error.empty()) {
    progress.failed();
    return Status::error(STRATA_E_INTERNAL, contender.name + ": " + error);
  }
  if (WIFSIGNALED(wstatus)) {
    progress.failed();
    return Status::error(STRATA_E_INTERNAL,
                         contender.name + " worker was killed by signal " +
                             std::to_string(WTERMSIG(wstatus)) +
                             (WTERMSIG(wstatus) == SIGKILL ? " (out of memory?)" : ""));
  }
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0 || !have_result) {
    progress.failed();
    return Status::error(STRATA_E_INTERNAL,
                         contender.name + " worker exited with status " +
                             std::to_string(WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1) +
                             " without a result");
  }
  progress.done(contender, out.result);
  return out;
}

int fail(const Status& status, int code) {
  std::fprintf(stderr, "strata bench finetune: %s\n", status.message().c_str());
  return code;
}

int run_parent(const FinetunePlan& plan) {
  std::unique_ptr<LiveMetrics> metrics;
  std::unique_ptr<telemetry::MetricsServer> server;
  if (plan.options.metrics_port >= 0) {
    Result<std::unique_ptr<LiveMetrics>> m = LiveMetrics::create(plan);
    if (!m) return fail(m.status(), 1);
    metrics = std::move(*m);
    telemetry::MetricsServerConfig config;
    config.port = static_cast<uint16_t>(plan.options.metrics_port);
    Result<std::unique_ptr<telemetry::MetricsServer>> s =
        telemetry::MetricsServer::start(config, metrics->registry());
    if (!s) return fail(std::move(s).take_status().with_context("--metrics-port"), 2);
    server = std::move(*s);
    std::fprintf(stderr, "metrics: http://%s:%u/metrics\n", server->address().c_str(),
                 server->port());
  }
  Progress progress(plan.options.steps, plan.options.json);
  SignalForwarding forwarding;
  std::vector<StrategyResult> results;
  for (const Contender& c : plan.contenders) {
    Result<StrategyResult> r = run_strategy(plan, c, progress, metrics.get());
    if (!r) return fail(r.status(), 1);
    results.push_back(std::move(*r));
  }
  json projection;
  const bool project = !plan.options.project_gpu.empty();
  if (project) {
    Result<json> p = project_full_scale(plan);
    if (!p) return fail(std::move(p).take_status().with_context("--project-full-scale"), 1);
    projection = std::move(*p);
  }
  if (plan.options.json) {
    std::printf("%s\n",
                results_json(plan, results, project ? &projection : nullptr).dump(2).c_str());
  } else {
    std::printf("%s", results_table(plan, results, project ? &projection : nullptr).c_str());
  }
  std::fflush(stdout);
  int rc = 0;
  if (!plan.options.trace_path.empty()) {
    Status traced = merge_traces(results, plan.options.trace_path);
    if (!traced) rc = fail(std::move(traced).with_context("--trace"), 1);
  }
  if (!plan.options.plot_path.empty()) {
    Status plotted = plot_memory(plan, results, plan.options.plot_path);
    if (!plotted) rc = fail(std::move(plotted).with_context("--plot"), 1);
  }
  return rc;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

// --sweep-pinned: the Strata worker (optimizer after backward, the headline) once per budget,
// the default budget included, so that users see host memory against step time and where the
// default sits. A budget too small to run is a row with its error, not the end of the sweep.
int run_pinned_sweep(const FinetuneOptions& options) {
  if (!options.pinned_budget.empty()) {
    return fail(invalid_argument("--sweep-pinned sets the budgets: drop --pinned-budget"), 2);
  }
  if (!options.trace_path.empty() || !options.plot_path.empty() || !options.project_gpu.empty() ||
      options.metrics_port >= 0) {
    return fail(invalid_argument("--sweep-pinned runs without --trace, --plot, "
                                 "--project-full-scale and --metrics-port"),
                2);
  }
  FinetuneOptions base = options;
  base.sweep_pinned.clear();
  base.strategy = "strata";
  base.optimizer_overlap = "off";
  Result<FinetunePlan> default_plan = make_plan(base);
  if (!default_plan) return fail(default_plan.status(), 2);
  // The default is automatic (0): its row comes first in the list and shows what it chose.
  const uint64_t default_budget = default_plan->strata_pinned_budget;

  std::vector<std::pair<uint64_t, std::string>> budgets;  // bytes (0: automatic), as given
  for (const std::string& text : split_list(options.sweep_pinned)) {
    const std::optional<uint64_t> bytes = parse_bytes(text);
    if (!bytes || *bytes < kPageSize) {
      return fail(invalid_argument("--sweep-pinned: '" + text +
                                   "' is not a size of at least 4K (e.g. 256M,512M,2G)"),
                  2);
    }
    budgets.emplace_back(align_up(*bytes, kPageSize), text);
  }
  if (budgets.empty()) return fail(invalid_argument("--sweep-pinned: no budgets given"), 2);
  budgets.emplace_back(default_budget, std::to_string(default_budget));
  std::sort(budgets.begin(), budgets.end());
  budgets.erase(std::unique(budgets.begin(), budgets.end(),
                            [](const auto& a, const auto& b) { return a.first == b.first; }),
                budgets.end());

  Progress progress(options.steps, options.json);
  SignalForwarding forwarding;
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const auto& [bytes, text] : budgets) {
    FinetuneOptions o = base;
    o.pinned_budget = bytes == 0 ? "auto" : std::to_string(bytes);
    Result<FinetunePlan> plan = make_plan(o);
    if (!plan) return fail(plan.status(), 2);
    const Contender* strata = find_contender(*plan, "strata");
    STRATA_ASSERT(strata != nullptr);
    nlohmann::ordered_json row = {
        {"pinned_budget_bytes", bytes}, {"default", bytes == default_budget}, {"auto", bytes == 0}};
    Result<StrategyResult> r = run_strategy(*plan, *strata, progress, nullptr);
    if (!r) {
      row["error"] = r.status().message();
    } else {
      // The budget in force: an automatic one is what the runtime sized.
      if (r->result.contains("pinned_budget_bytes")) {
        row["pinned_budget_bytes"] = r->result["pinned_budget_bytes"];
      }
      for (const char* key : {"peak_host_bytes", "peak_pinned_bytes", "step_seconds",
                              "nvme_read_gbps", "nvme_write_gbps", "stall_fraction"}) {
        if (r->result.contains(key)) row[key] = r->result[key];  // as the worker wrote it
      }
    }
    rows.push_back(std::move(row));
  }

  // In budget order, the automatic one where its figure puts it.
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return a["pinned_budget_bytes"].template get<uint64_t>() <
           b["pinned_budget_bytes"].template get<uint64_t>();
  });
  if (options.json) {
    const nlohmann::ordered_json out = {
        {"model", options.model}, {"default_pinned_budget", "auto"}, {"pinned_sweep", rows}};
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  double default_step = 0;
  for (const auto& row : rows) {
    if (row["default"].get<bool>() && row.contains("step_seconds")) {
      default_step = row["step_seconds"].get<double>();
    }
  }
  Table table(
      {"pinned budget", "peak host", "peak pinned", "step (s)", "step vs default", "stall"});
  std::vector<std::string> errors;
  for (const auto& row : rows) {
    const uint64_t bytes = row["pinned_budget_bytes"].get<uint64_t>();
    const std::string budget =
        row["auto"].get<bool>()
            ? (bytes == 0 ? "auto" : format_bytes(bytes) + " (auto)")
            : format_bytes(bytes) + (row["default"].get<bool>() ? " (default)" : "");
    if (row.contains("error")) {
      errors.push_back(budget + ": " + row["error"].get<std::string>());
      table.add_row({budget, "-", "-", "failed (" + std::to_string(errors.size()) + ")", "-", "-"});
      continue;
    }
    const double step = row["step_seconds"].get<double>();
    table.add_row({budget, format_bytes(row["peak_host_bytes"].get<uint64_t>()),
                   format_bytes(row["peak_pinned_bytes"].get<uint64_t>()), fixed(step, 2),
                   default_step > 0 ? fixed(step / default_step, 3) : "-",
                   fixed(row["stall_fraction"].get<double>(), 2)});
  }
  std::printf("%s", table.render().c_str());
  for (size_t i = 0; i < errors.size(); ++i) std::printf("(%zu) %s\n", i + 1, errors[i].c_str());
  std::printf(
      "\nStrata alone (optimizer after backward), %u steps per budget; peak host: "
      "the worker's host memory as the OS counts it, the emulated device left out.\n",
      options.steps);
  return 0;
}

int run_finetune(const FinetuneOptions& options) {
  Result<FinetunePlan> plan = make_plan(options);
  if (!plan) return fail(plan.status(), 2);
  if (!options.worker.empty()) {
    const Contender* c = find_contender(*plan, options.worker);
    if (c == nullptr) return fail(invalid_argument("--worker '" + options.worker + "' unknown"), 2);
    if (options.worker_fd < 0) return fail(invalid_argument("--worker needs --worker-fd"), 2);
    return c->kind == ContenderKind::kStrata
               ? run_strata_worker(*plan, *c, options.worker_fd, options.worker_trace)
               : run_deepspeed_worker(*plan, *c, options.worker_fd, options.worker_trace);
  }
  if (!options.sweep_pinned.empty()) return run_pinned_sweep(options);
  // Every output path is checked before the run, so that a finished benchmark never loses its
  // result to a path that cannot be written.
  if (!options.trace_path.empty()) {
    if (Status ok = storage::check_output_path(options.trace_path, "--trace"); !ok)
      return fail(ok, 2);
  }
  if (!options.plot_path.empty()) {
    if (Status ok = storage::check_output_path(options.plot_path, "--plot"); !ok)
      return fail(ok, 2);
    if (Status ok = check_plot_renderer(); !ok) return fail(ok, 2);
  }
  return run_parent(*plan);
}

}  // namespace
}  // namespace finetune

void add_finetune_command(CLI::App& bench) {
  auto o = std::make_shared<finetune::FinetuneOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "finetune",
      "Fine-tune a scaled model with Strata (through its C API) and with DeepSpeed ZeRO-3's NVMe "
      "offload in its labelled configurations, each in its own process: peak host memory and "
      "step time side by side, under the same training semantics");
  cmd->add_option("--model", o->model, "A model preset (llama-2-70b, ...) or a HF config.json")
      ->required();
  cmd->add_option("--scale", o->scale, "Width factor (hidden, heads, MLP, vocabulary)")
      ->capture_default_str();
  cmd->add_option("--layers", o->layers, "Transformer layers kept (-1: all)")
      ->capture_default_str();
  cmd->add_option("--seq", o->seq, "Sequence length (tokens)")->capture_default_str();
  cmd->add_option("--batch", o->batch, "Sequences per step")->capture_default_str();
  cmd->add_option("--method", o->method,
                  "full | lora | qlora (the base frozen, read-only and streamed from NVMe, in "
                  "NF4 for qlora; rank-r adapters trained; Strata alone)")
      ->capture_default_str();
  cmd->add_option("--lora-rank", o->lora_rank, "LoRA rank r (lora, qlora)")->capture_default_str();
  cmd->add_option("--lora-targets", o->lora_targets,
                  "Adapted linear layers: all-linear or a list of q,k,v,o,gate,up,down")
      ->capture_default_str();
  cmd->add_option("--strategy", o->strategy,
                  "strata | deepspeed | both (default: both; strata for lora and qlora)");
  cmd->add_option("--baseline", o->baselines,
                  "The DeepSpeed configurations to run, comma-separated: deepspeed-defaults, "
                  "deepspeed-pinned, deepspeed-tuned")
      ->capture_default_str();
  cmd->add_option("--precision", o->precision,
                  "bf16 | fp16 (fp16 adds DeepSpeed's overflow check and its temporaries)")
      ->capture_default_str();
  cmd->add_option("--max-grad-norm", o->max_grad_norm,
                  "Global gradient clipping for Strata and DeepSpeed alike (0: none)")
      ->capture_default_str();
  cmd->add_option("--steps", o->steps, "Training steps per strategy")->capture_default_str();
  cmd->add_option("--nvme", o->nvme_dir,
                  "Directory for the swap files (default: the system temporary directory)");
  cmd->add_option("--compute", o->compute,
                  "modeled (timed wait at the GPU preset's rate) | cpu (real GEMMs) | gpu "
                  "(cuBLAS)")
      ->capture_default_str();
  cmd->add_option("--gpu", o->gpu, "GPU preset whose bf16 rate models compute")
      ->capture_default_str();
  cmd->add_option("--mfu", o->mfu, "Fraction of the preset's dense bf16 rate achieved")
      ->capture_default_str();
  cmd->add_option("--pinned-budget", o->pinned_budget,
                  "Strata's pinned budget, e.g. 512M, or auto (default: sized by the runtime "
                  "from the drive, docs/tuning.md)");
  cmd->add_option("--sweep-pinned", o->sweep_pinned,
                  "Run Strata alone at each of these pinned budgets (comma-separated, e.g. "
                  "256M,512M,2G) and at the default: host peak against step time");
  cmd->add_option("--device-budget", o->device_budget,
                  "Device budget for both strategies (default: weights and gradients of four "
                  "layers)");
  cmd->add_option("--optimizer-overlap", o->optimizer_overlap,
                  "Strata: update each layer right after its backward (on: no global clipping), "
                  "after the whole backward as DeepSpeed does (off: the headline), or both")
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Print one JSON object instead of the table");
  cmd->add_option("--trace", o->trace_path, "Write a Chrome trace (every worker) to FILE");
  cmd->add_option("--plot", o->plot_path, "Write a PNG of host / pinned / device memory to FILE");
  cmd->add_option("--project-full-scale", o->project_gpu,
                  "Also simulate the unscaled model on this GPU preset (sched::simulate)");
  // -1 is "no endpoint", the default: given explicitly it would be ignored without a word.
  cmd->add_option("--metrics-port", o->metrics_port,
                  "Serve Prometheus metrics on 127.0.0.1:N while running (0: any free port)")
      ->check(CLI::Range(0, 65535));
  // The worker side, set only by the parent.
  cmd->add_option("--worker", o->worker)->group("");
  cmd->add_option("--worker-fd", o->worker_fd)->group("");
  cmd->add_option("--worker-trace", o->worker_trace)->group("");
  // A repeated option takes its last value (a script's defaults, then the user's override).
  for (CLI::Option* option : cmd->get_options()) {
    option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
  cmd->callback([o] {
    int rc = 1;
    try {
      rc = finetune::run_finetune(*o);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "strata bench finetune: internal error: %s\n", e.what());
    }
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace strata::bench
