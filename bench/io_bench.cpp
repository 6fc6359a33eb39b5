// `strata bench io`: sequential O_DIRECT write then read of one file through a Strata I/O engine,
// with queue_depth requests kept in flight, and (with --compare-fio) fio's io_uring engine on the
// same file, same block size and depth, in the same run. Sides alternate within each round and
// the median of the rounds is reported, because a shared machine's disk is noisy.
#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench_commands.h"
#include "common/align.h"
#include "common/huge_page_mapping.h"
#include "common/interrupt_cleanup.h"
#include "common/report.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "common/units.h"
#include "finetune/deepspeed_aio.h"
#include "io/engine_factory.h"
#include "io/io_engine.h"
#include "io/io_limits.h"
#include "progress.h"
#include "sched/device_model.h"
#include "storage/owned_names.h"

extern char** environ;

namespace strata::bench {

namespace {

using io::IoEngine;
using io::IoOp;
using io::IoRequest;

struct IoBenchArgs {
  std::string path = ".";
  std::string size = "1G";
  std::string block = "1M";
  uint32_t queue_depth = 32;
  std::string engine = "auto";
  uint32_t rounds = 5;
  bool compare_fio = false;
  bool mixed = false;
  bool no_thp = false;
  bool json = false;
};

struct Config {
  std::string dir;
  uint64_t size = 0;
  uint64_t block = 0;
  uint32_t queue_depth = 0;
  io::IoEngineKind kind = io::IoEngineKind::kAuto;
  uint32_t rounds = 0;
  bool compare_fio = false;
  // Also read one file while writing another, both at once (the traffic of an optimizer step,
  // which reads states while writing back earlier ones): each direction's rate under the other.
  bool mixed = false;
  bool huge_pages = true;
  // The DeepSpeed baseline's aio handle (bench/finetune/deepspeed_aio.h) instead of a Strata
  // engine: one whole-file request at a time, as DeepSpeed's handle moves a tensor, so that
  // ../shared/tools/deepspeed/aio-compare.sh can set it beside DeepSpeed's own.
  bool deepspeed_aio = false;
};

// The benchmark's file: created exclusively (never follows or clobbers anything), preallocated,
// removed on every exit path.
class BenchFile {
 public:
  static Result<BenchFile> create(const std::string& dir, uint64_t size) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {
      return errno_status(STRATA_E_INVALID, "--path " + dir, errno);
    }
    if (!S_ISDIR(st.st_mode)) {
      return invalid_argument("--path " + dir + " is not a directory");
    }
    UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dir_fd.valid()) return errno_status(STRATA_E_INVALID, "--path " + dir, errno);
    // Owner-stamped and locked like a swap file, so that `strata doctor` recognises the file of
    // a run that was killed outright; a SIGINT / SIGTERM / SIGHUP removes it (on_signal_).
    const std::string name = storage::generated_name(".bench-io");
    const std::string path = dir + "/" + name;
    const int fd = ::openat(dir_fd.get(), name.c_str(),
                            O_CREAT | O_EXCL | O_NOFOLLOW | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
    if (fd < 0) {
      if (errno == EINVAL) {
        return unsupported("the file system of " + dir +
                           " does not support O_DIRECT (tmpfs?); point --path at the NVMe drive");
      }
      return errno_status(STRATA_E_IO, "creating " + path, errno);
    }
    BenchFile file(std::move(dir_fd), name, path, UniqueFd(fd));
    STRATA_TRY(storage::lock_as_owner(file.fd(), path));
    if (int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(size)); rc != 0) {
      const int code = rc == ENOSPC ? STRATA_E_NOSPACE : STRATA_E_IO;
      return errno_status(code, "preallocating " + format_bytes(size) + " in " + dir, rc);
    }
    return file;
  }

  BenchFile(BenchFile&& other) noexcept
      : dir_fd_(std::move(other.dir_fd_)),
        name_(std::exchange(other.name_, {})),
        path_(std::move(other.path_)),
        fd_(std::move(other.fd_)),
        on_signal_(std::move(other.on_signal_)) {}
  BenchFile& operator=(BenchFile&&) = delete;
  ~BenchFile() {
    if (!name_.empty()) {
      on_signal_.disarm();
      ::unlinkat(dir_fd_.get(), name_.c_str(), 0);
    }
  }

  const std::string& path() const { return path_; }
  int fd() const { return fd_.get(); }

 private:
  BenchFile(UniqueFd dir_fd, std::string name, std::string path, UniqueFd fd)
      : dir_fd_(std::move(dir_fd)),
        name_(std::move(name)),
        path_(std::move(path)),
        fd_(std::move(fd)),
        on_signal_(InterruptCleanup::arm(dir_fd_.get(), name_, InterruptCleanup::What::kFile)) {}
  UniqueFd dir_fd_;
  std::string name_;
  std::string path_;
  UniqueFd fd_;
  InterruptCleanup on_signal_;
};

// One engine, one file, queue_depth request slots each with its own buffer.
class StrataSide {
 public:
  static Result<std::unique_ptr<StrataSide>> create(const Config& config, int fd) {
    io::IoEngineOptions options;
    options.queue_depth = config.queue_depth;
    options.block_size = static_cast<uint32_t>(config.block);
    // pread/pwrite keeps one block per thread in flight: give it the depth fio gets.
    options.threads = std::min(config.queue_depth, io::kMaxThreads);
    auto engine = io::make_io_engine(config.kind, options);
    if (!engine) {
      return std::move(engine).take_status();
    }
    std::unique_ptr<StrataSide> side(new StrataSide(config, std::move(engine).value()));
    if (side->memory_.data() == nullptr) {
      return Status::error(STRATA_E_NOMEM,
                           "mapping " + format_bytes(side->slot_bytes_total()) + " of I/O buffers");
    }
    auto file = side->engine_->register_file(fd);
    if (!file) {
      return std::move(file).take_status();
    }
    side->file_ = *file;
    // Non-zero, non-repeating data, so nothing on the way can shortcut it. Writing it also
    // faults the pages in (as huge pages where advised) before registration pins them.
    uint64_t x = 0x9E3779B97F4A7C15ULL;
    auto* words = reinterpret_cast<uint64_t*>(side->memory_.data());
    for (uint64_t i = 0; i < side->slot_bytes_total() / 8; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      words[i] = x;
    }
    STRATA_TRY(side->register_buffers());
    return side;
  }

  const char* engine_name() const { return engine_->name(); }

  // Moves the whole file in one direction; returns the seconds from first submit to last
  // completion. Each completion submits the slot's next request from inside on_complete (as
  // fio's loop does), so the depth never waits for a hop through this thread.
  Result<double> run(IoOp op) { return run_until(op, nullptr); }

  // As run(), but while `until` is given and false the offsets wrap to the start of the file, so
  // that this side keeps the drive busy for as long as another side runs; then it drains.
  Result<double> run_until(IoOp op, const std::atomic<bool>* until) {
    {
      std::lock_guard lock(mutex_);
      op_ = op;
      next_ = 0;
      outstanding_ = 0;
      error_ = 0;
      submit_error_ = Status::ok();
      until_ = until;
      completed_bytes_ = 0;
      ++runs_;
      running_ = true;
    }
    const auto start = std::chrono::steady_clock::now();
    for (Slot& slot : slots_) {
      std::unique_lock lock(mutex_);
      if (!submit_next(slot, lock)) {
        break;
      }
    }
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return outstanding_ == 0; });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    running_ = false;
    progress_.notify_all();
    if (!submit_error_.is_ok()) {
      return submit_error_;
    }
    if (error_ != 0) {
      return request_status(failed_);
    }
    return seconds;
  }

  // Bytes of requests completed since run_until() began.
  uint64_t completed_bytes() {
    std::lock_guard lock(mutex_);
    return completed_bytes_;
  }

  // run_until() calls begun so far: the number the next one will have is runs() + 1.
  uint64_t runs() {
    std::lock_guard lock(mutex_);
    return runs_;
  }

  // Blocks until run number `run` has completed a request or has ended (its result says why),
  // or a later one has begun. --mixed starts its read once the writes flow: started together, a
  // read that takes milliseconds (a small --size on a fast drive) could end before the writing
  // thread's first request did, and the write rate "while the read ran" came out 0.
  void wait_until_flowing(uint64_t run) {
    std::unique_lock lock(mutex_);
    progress_.wait(
        lock, [&] { return runs_ > run || (runs_ == run && (completed_bytes_ > 0 || !running_)); });
  }

 private:
  struct Slot {
    StrataSide* side = nullptr;
    uint32_t index = 0;
    int32_t buffer_index = -1;
    IoRequest request;
  };

  StrataSide(const Config& config, std::unique_ptr<IoEngine> engine)
      : config_(config),
        memory_(config.block * config.queue_depth, config.huge_pages),
        slots_(config.queue_depth),
        engine_(std::move(engine)) {
    for (uint32_t i = 0; i < slots_.size(); ++i) {
      slots_[i].side = this;
      slots_[i].index = i;
    }
  }

  uint64_t slot_bytes_total() const { return config_.block * config_.queue_depth; }

  // Registered buffers spare the kernel a page walk per request; each may span at most 1 GiB.
  Status register_buffers() {
    const uint64_t per_buffer =
        std::max<uint64_t>(1, io::kMaxRegisteredBufferBytes / config_.block);
    for (uint32_t first = 0; first < slots_.size(); first += per_buffer) {
      const uint32_t count =
          static_cast<uint32_t>(std::min<uint64_t>(per_buffer, slots_.size() - first));
      auto index =
          engine_->register_buffer(memory_.data() + first * config_.block, count * config_.block);
      if (!index) {
        return std::move(index).take_status();
      }
      for (uint32_t i = first; i < first + count; ++i) {
        slots_[i].buffer_index = *index;
      }
    }
    return Status::ok();
  }

  // Starts the slot's next request, if any is left and nothing failed. Called with mutex_ held;
  // submits with it released (submit may wait for queue space).
  bool submit_next(Slot& slot, std::unique_lock<std::mutex>& lock) {
    if (error_ != 0 || !submit_error_.is_ok()) {
      return false;
    }
    if (next_ >= config_.size) {
      if (until_ == nullptr || until_->load(std::memory_order_acquire)) {
        return false;
      }
      next_ = 0;
    }
    IoRequest& r = slot.request;
    r = IoRequest{};
    r.op = op_;
    r.file = file_;
    r.buffer = memory_.data() + slot.index * config_.block;
    r.length = std::min(config_.block, config_.size - next_);
    r.offset = next_;
    r.buffer_index = slot.buffer_index;
    r.on_complete = &StrataSide::on_complete;
    r.context = &slot;
    next_ += r.length;
    ++outstanding_;
    lock.unlock();
    Status status = engine_->submit(&r);
    lock.lock();
    if (!status.is_ok()) {
      --outstanding_;
      if (submit_error_.is_ok()) {
        submit_error_ = std::move(status);
      }
      return false;
    }
    return true;
  }

  static void on_complete(IoRequest* request, void* context) {
    auto* slot = static_cast<Slot*>(context);
    StrataSide* side = slot->side;
    std::unique_lock lock(side->mutex_);
    if (request->error != 0 && side->error_ == 0) {
      side->error_ = request->error;
      side->failed_ = *request;
    }
    if (request->error == 0) {
      const bool first = side->completed_bytes_ == 0;
      side->completed_bytes_ += request->length;
      if (first) side->progress_.notify_all();  // wait_until_flowing
    }
    // The engine is done with the request once on_complete runs: the slot is reused at once.
    --side->outstanding_;
    side->submit_next(*slot, lock);
    if (side->outstanding_ == 0) {
      side->done_.notify_all();
    }
  }

  const Config config_;
  uint32_t file_ = 0;
  HugePageMapping memory_;
  std::vector<Slot> slots_;
  std::mutex mutex_;
  std::condition_variable done_;
  std::condition_variable progress_;  // a run's first completion, and its end
  IoOp op_ = IoOp::kWrite;
  uint64_t next_ = 0;                         // file offset of the next request to start
  uint32_t outstanding_ = 0;                  // requests submitted and not yet completed
  const std::atomic<bool>* until_ = nullptr;  // run_until's: wrap until it is set
  uint64_t completed_bytes_ = 0;
  uint64_t runs_ = 0;     // run_until calls begun
  bool running_ = false;  // the latest has not ended
  int error_ = 0;
  IoRequest failed_;
  Status submit_error_;
  // Last, so it is destroyed (and drained) first, while the buffers registered with it exist.
  std::unique_ptr<IoEngine> engine_;
};

std::optional<std::string> find_in_path(const std::string& program) {
  const char* path = std::getenv("PATH");  // NOLINT(concurrency-mt-unsafe): single-threaded CLI
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string candidate = dirs.substr(start, end - start) + "/" + program;
    if (end > start && ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    start = end + 1;
  }
  return std::nullopt;
}

// Runs argv with `extra_env` added to our environment; returns its standard output (its
// standard error goes to ours).
Result<std::string> run_capture(const std::vector<std::string>& args,
                                const std::vector<std::string>& extra_env = {}) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return errno_status(STRATA_E_LIMIT, "pipe", errno);
  }
  UniqueFd read_end(pipe_fds[0]);
  UniqueFd write_end(pipe_fds[1]);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), STDOUT_FILENO);
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (const std::string& a : args) {
    argv.push_back(const_cast<char*>(a.c_str()));
  }
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) {
    const bool replaced = std::any_of(
        extra_env.begin(), extra_env.end(),
        [&](const std::string& x) { return std::strncmp(*e, x.c_str(), x.find('=') + 1) == 0; });
    if (!replaced) {
      envp.push_back(*e);
    }
  }
  for (const std::string& x : extra_env) {
    envp.push_back(const_cast<char*>(x.c_str()));
  }
  envp.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, args[0].c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    return errno_status(STRATA_E_UNSUPPORTED, "starting " + args[0], rc);
  }
  write_end.reset();
  std::string out;
  char chunk[65536];
  for (;;) {
    const ssize_t n = ::read(read_end.get(), chunk, sizeof chunk);
    if (n > 0) {
      out.append(chunk, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    return io_error(args[0] + " failed (exit status " +
                    std::to_string(WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1) + ")");
  }
  return out;
}

struct FioSide {
  std::string program;
  std::string version;

  std::vector<std::string> args(const Config& config, const std::string& file, IoOp op) const {
    // The same work as the Strata side: one job, io_uring, O_DIRECT, same block size and depth,
    // and the same registered files and buffers Strata uses.
    return {program,
            "--name=strata-bench",
            "--filename=" + file,
            std::string("--rw=") + (op == IoOp::kRead ? "read" : "write"),
            "--bs=" + std::to_string(config.block),
            "--size=" + std::to_string(config.size),
            "--iodepth=" + std::to_string(config.queue_depth),
            "--ioengine=io_uring",
            "--direct=1",
            "--fixedbufs=1",
            "--registerfiles=1",
            "--output-format=json"};
  }

  Result<double> run(const Config& config, const std::string& file, IoOp op) const {
    // fio takes its buffers from malloc; this glibc (2.35+) tunable makes malloc advise huge
    // pages, giving fio the same memory backing as the Strata side.
    std::vector<std::string> env;
    if (config.huge_pages) {
      env.push_back("GLIBC_TUNABLES=glibc.malloc.hugetlb=1");
    }
    auto out = run_capture(args(config, file, op), env);
    if (!out) {
      return std::move(out).take_status();
    }
    // fio may print notes before the JSON document.
    const size_t brace = out->find('{');
    if (brace == std::string::npos) {
      return io_error("fio printed no JSON");
    }
    const auto doc = nlohmann::json::parse(out->substr(brace), nullptr, false);
    const char* side = op == IoOp::kRead ? "read" : "write";
    if (doc.is_discarded() || !doc.contains("jobs") || doc["jobs"].empty() ||
        !doc["jobs"][0].contains(side)) {
      return io_error("could not parse fio's JSON output");
    }
    const auto& job = doc["jobs"][0];
    if (job.value("error", 0) != 0) {
      return errno_status(STRATA_E_IO, "fio job", job.value("error", 0));
    }
    return job[side].value("bw_bytes", 0.0) / 1e9;
  }
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

[[noreturn]] void fail(const Status& status) {
  std::fprintf(stderr, "strata bench io: %s\n", status.message().c_str());
  throw CLI::RuntimeError(1);
}

// The DeepSpeed baseline's aio handle on the same file: one request of the whole size, split
// into `block` iocbs with `queue_depth` in flight on the handle's thread, into one buffer (the
// tensor DeepSpeed would pass), as DeepSpeed's handle moves a swap file.
class DeepSpeedAioSide {
 public:
  static Result<std::unique_ptr<DeepSpeedAioSide>> create(const Config& config,
                                                          const std::string& path) {
    auto side = std::unique_ptr<DeepSpeedAioSide>(new DeepSpeedAioSide(config, path));
    finetune::AioHandle::Options o;
    o.name = "bench io";
    o.block_bytes = static_cast<uint32_t>(config.block);
    o.queue_depth = config.queue_depth;
    o.threads = 1;
    STRATA_ASSIGN_OR_RETURN(auto handle, finetune::AioHandle::create(o, nullptr));
    side->handle_ = std::move(handle);
    void* p =
        ::mmap(nullptr, config.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return errno_status(STRATA_E_NOMEM, "the aio buffer", errno);
    side->buffer_ = static_cast<std::byte*>(p);
    // Pinned, as the baseline's swap buffers are (and DeepSpeed's handle's tensor): locked
    // 4 KiB pages, whatever --no-thp says; where the lock is refused, touched pages all the same.
    (void)::mlock(p, config.size);
    std::memset(p, 0x5A, config.size);
    return side;
  }
  ~DeepSpeedAioSide() {
    handle_.reset();
    if (buffer_ != nullptr) ::munmap(buffer_, config_.size);
  }
  Result<double> run(IoOp op) {
    const auto start = std::chrono::steady_clock::now();
    STRATA_ASSIGN_OR_RETURN(uint64_t ticket, op == IoOp::kWrite
                                                 ? handle_->write(path_, buffer_, config_.size)
                                                 : handle_->read(path_, buffer_, config_.size));
    STRATA_TRY(handle_->wait(ticket));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const char* engine_name() const {
    return "deepspeed-aio (the baseline's libaio handle, locked buffer)";
  }

 private:
  DeepSpeedAioSide(const Config& config, std::string path)
      : config_(config), path_(std::move(path)) {}
  const Config config_;
  const std::string path_;
  std::unique_ptr<finetune::AioHandle> handle_;
  std::byte* buffer_ = nullptr;
};

Config parse_config(const IoBenchArgs& args) {
  Config config;
  config.dir = args.path;
  const auto size = parse_bytes(args.size);
  const auto block = parse_bytes(args.block);
  if (!size || *size == 0 || !is_aligned(*size, io::kIoAlignment)) {
    fail(invalid_argument("--size " + args.size + " must be a positive multiple of 4K"));
  }
  if (!block || *block == 0 || *block > io::kMaxBlockSize ||
      !is_aligned(*block, io::kIoAlignment)) {
    fail(invalid_argument("--block " + args.block + " must be a multiple of 4K up to 1G"));
  }
  config.deepspeed_aio = args.engine == "deepspeed-aio";
  const auto kind = io::parse_io_engine_kind(config.deepspeed_aio ? "auto" : args.engine);
  if (!kind) {
    fail(invalid_argument("--engine " + args.engine +
                          " is not auto, uring, psync or deepspeed-aio"));
  }
  config.size = *size;
  config.block = *block;
  config.queue_depth = args.queue_depth;
  config.kind = *kind;
  config.rounds = args.rounds;
  config.compare_fio = args.compare_fio;
  config.mixed = args.mixed;
  config.huge_pages = !args.no_thp;
  if (config.mixed && config.deepspeed_aio) {
    fail(
        invalid_argument("--mixed measures Strata's engine; it does not apply to --engine "
                         "deepspeed-aio"));
  }
  return config;
}

void run_io_bench(const IoBenchArgs& args) {
  const Config config = parse_config(args);

  std::optional<FioSide> fio;
  if (config.compare_fio) {
    const auto program = find_in_path("fio");
    if (!program) {
      fail(unsupported("--compare-fio needs fio on PATH (Debian: apt-get install fio)"));
    }
    fio = FioSide{*program, {}};
    auto version = run_capture({*program, "--version"});
    if (!version) {
      fail(version.status());
    }
    fio->version = version->substr(0, version->find('\n'));
  }

  auto file = BenchFile::create(config.dir, config.size);
  if (!file) {
    fail(file.status());
  }
  std::unique_ptr<StrataSide> strata_side;
  std::unique_ptr<DeepSpeedAioSide> baseline_side;
  if (config.deepspeed_aio) {
    auto side = DeepSpeedAioSide::create(config, file->path());
    if (!side) fail(side.status());
    baseline_side = std::move(*side);
  } else {
    auto side = StrataSide::create(config, file->fd());
    if (!side) fail(side.status());
    strata_side = std::move(*side);
  }
  // --mixed: a second file and engine that write while the first side reads.
  std::optional<BenchFile> mixed_file;
  std::unique_ptr<StrataSide> writer_side;
  if (config.mixed) {
    auto second = BenchFile::create(config.dir, config.size);
    if (!second) fail(second.status());
    mixed_file.emplace(std::move(*second));
    auto side = StrataSide::create(config, mixed_file->fd());
    if (!side) fail(side.status());
    writer_side = std::move(*side);
    if (auto warm_up = writer_side->run(IoOp::kWrite); !warm_up) fail(warm_up.status());
  }
  auto run_side = [&](IoOp op) {
    return baseline_side ? baseline_side->run(op) : strata_side->run(op);
  };
  const std::string engine_name =
      baseline_side ? baseline_side->engine_name() : strata_side->engine_name();

  // Untimed: the first write into preallocated (unwritten) extents also pays for the file
  // system's extent conversion, which only the side that happens to go first would pay.
  if (auto warm_up = run_side(IoOp::kWrite); !warm_up) {
    fail(warm_up.status());
  }

  std::vector<double> write_gbps, read_gbps, fio_write_gbps, fio_read_gbps;
  std::vector<double> mixed_read_gbps, mixed_write_gbps;
  const uint32_t passes = config.rounds * (2 * (fio.has_value() ? 2 : 1) + (config.mixed ? 2 : 0));
  ProgressDisplay progress("bench io", static_cast<double>(config.size) * passes,
                           ProgressDisplay::Unit::kBytes, "", is_interactive_terminal(args.json));
  double moved = 0;
  progress.update(0);
  auto strata_pass = [&](IoOp op, std::vector<double>& into) {
    progress.set_label(std::string("bench io: strata ") + (op == IoOp::kWrite ? "write" : "read"));
    auto seconds = run_side(op);
    if (!seconds) {
      fail(seconds.status());
    }
    into.push_back(gbps(config.size, *seconds));
    progress.update(moved += static_cast<double>(config.size));
  };
  auto fio_pass = [&](IoOp op, std::vector<double>& into) {
    progress.set_label(std::string("bench io: fio ") + (op == IoOp::kWrite ? "write" : "read"));
    auto rate = fio->run(config, file->path(), op);
    if (!rate) {
      fail(rate.status());
    }
    into.push_back(*rate);
    progress.update(moved += static_cast<double>(config.size));
  };
  // Reads the first file while the second side writes its own over and over; the write rate
  // counts what completed while the read ran, so both rates cover the same interval. The read
  // starts once the writes flow.
  auto mixed_pass = [&] {
    progress.set_label("bench io: strata read and write at once");
    std::atomic<bool> read_done{false};
    Result<double> wrote = 0.0;
    const uint64_t run = writer_side->runs() + 1;
    std::thread writer([&] { wrote = writer_side->run_until(IoOp::kWrite, &read_done); });
    writer_side->wait_until_flowing(run);
    const uint64_t written_before = writer_side->completed_bytes();
    Result<double> read = strata_side->run(IoOp::kRead);
    const uint64_t written = writer_side->completed_bytes() - written_before;
    read_done.store(true, std::memory_order_release);
    writer.join();
    if (!read) fail(read.status());
    if (!wrote) fail(wrote.status());
    if (written == 0) {
      fail(Status::error(STRATA_E_STATE,
                         "--mixed: no write completed while the " + format_bytes(config.size) +
                             " read ran (" + fixed(*read * 1e3, 2) +
                             " ms): give a larger --size, so that both directions overlap"));
    }
    mixed_read_gbps.push_back(gbps(config.size, *read));
    mixed_write_gbps.push_back(gbps(written, *read));
    progress.update(moved += 2.0 * static_cast<double>(config.size));
  };
  for (uint32_t round = 0; round < config.rounds; ++round) {
    // Writes before reads, so reads never meet unwritten (all-zero, device-free) extents; who
    // goes first alternates between rounds so neither side always gets the warmer disk.
    const bool fio_first = fio.has_value() && round % 2 == 1;
    for (IoOp op : {IoOp::kWrite, IoOp::kRead}) {
      auto& mine = op == IoOp::kWrite ? write_gbps : read_gbps;
      auto& theirs = op == IoOp::kWrite ? fio_write_gbps : fio_read_gbps;
      if (fio_first) {
        fio_pass(op, theirs);
      }
      strata_pass(op, mine);
      if (fio.has_value() && !fio_first) {
        fio_pass(op, theirs);
      }
    }
    if (config.mixed) mixed_pass();
  }

  progress.finish();
  // Ratios pair each Strata pass with the fio pass next to it in time, then take the median:
  // the disk's throughput drifts by tens of percent between rounds, much less within one.
  auto paired_ratio = [](const std::vector<double>& mine, const std::vector<double>& theirs) {
    std::vector<double> ratios;
    for (size_t i = 0; i < mine.size() && i < theirs.size(); ++i) {
      if (theirs[i] > 0) {
        ratios.push_back(mine[i] / theirs[i]);
      }
    }
    return ratios.empty() ? 0.0 : median(ratios);
  };
  const double write = median(write_gbps);
  const double read = median(read_gbps);
  const double fio_write = fio ? median(fio_write_gbps) : 0.0;
  const double fio_read = fio ? median(fio_read_gbps) : 0.0;
  const double write_ratio = paired_ratio(write_gbps, fio_write_gbps);
  const double read_ratio = paired_ratio(read_gbps, fio_read_gbps);
  // With --mixed: the half-duplex drive `strata plan --nvme` models that moves, with both
  // directions at once, what this one moved (sched/device_model.h, half_duplex_rates).
  const double mixed_read = config.mixed ? median(mixed_read_gbps) : 0.0;
  const double mixed_write = config.mixed ? median(mixed_write_gbps) : 0.0;
  std::optional<sched::HalfDuplexRates> half_duplex;
  if (config.mixed) {
    auto rates = sched::half_duplex_rates(read, write, mixed_read, mixed_write);
    if (!rates) fail(rates.status());
    half_duplex = *rates;
  }

  if (args.json) {
    nlohmann::json out = {
        {"engine", engine_name},
        {"engine_kind", io::io_engine_kind_name(config.kind)},
        {"path", config.dir},
        {"size_bytes", config.size},
        {"block_bytes", config.block},
        {"queue_depth", config.queue_depth},
        {"rounds", config.rounds},
        {"statistic", "median over rounds; ratios: median of per-round strata/fio"},
        {"transparent_huge_pages", config.huge_pages},
        {"write_gbps", write},
        {"read_gbps", read},
        {"write_gbps_rounds", write_gbps},
        {"read_gbps_rounds", read_gbps},
    };
    if (config.mixed) {
      out["mixed_read_gbps"] = mixed_read;
      out["mixed_write_gbps"] = mixed_write;
      out["mixed_read_gbps_rounds"] = mixed_read_gbps;
      out["mixed_write_gbps_rounds"] = mixed_write_gbps;
      out["half_duplex_read_gbps"] = half_duplex->read;
      out["half_duplex_write_gbps"] = half_duplex->write;
      out["half_duplex_factor"] = half_duplex->factor;
    }
    if (fio) {
      out["fio_version"] = fio->version;
      out["fio_write_gbps"] = fio_write;
      out["fio_read_gbps"] = fio_read;
      out["fio_write_gbps_rounds"] = fio_write_gbps;
      out["fio_read_gbps_rounds"] = fio_read_gbps;
      out["write_ratio"] = write_ratio;
      out["read_ratio"] = read_ratio;
    }
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }

  std::printf("strata bench io: %s in %s, %s blocks, queue depth %u, median of %u rounds\n",
              format_bytes(config.size).c_str(), config.dir.c_str(),
              format_bytes(config.block).c_str(), config.queue_depth, config.rounds);
  std::printf("engine: %s\n", engine_name.c_str());
  std::printf("buffers: %s\n", config.huge_pages ? "transparent huge pages (both sides)"
                                                 : "4 KiB pages (both sides)");
  if (fio) {
    std::printf("competitor: %s, ioengine=io_uring direct=1 fixedbufs registerfiles, alternating\n",
                fio->version.c_str());
  }
  std::printf("\n");
  Table table({"", "write GB/s", "read GB/s"});
  table.add_row({"strata", fixed(write), fixed(read)});
  if (config.mixed) {
    table.add_row({"strata, both at once (--mixed)", fixed(mixed_write), fixed(mixed_read)});
    table.add_row({"as a half-duplex drive (strata plan --nvme)", fixed(half_duplex->write),
                   fixed(half_duplex->read)});
  }
  if (fio) {
    table.add_row({"fio", fixed(fio_write), fixed(fio_read)});
    table.add_row({"strata / fio (per-round median)", fixed(write_ratio), fixed(read_ratio)});
  }
  std::printf("%s", table.render().c_str());
}

}  // namespace

void add_io_command(CLI::App& bench) {
  auto args = std::make_shared<IoBenchArgs>();
  CLI::App* io = bench.add_subcommand(
      "io", "Sequential O_DIRECT write then read through a Strata I/O engine (GB/s, decimal)");
  io->add_option("--path", args->path,
                 "Directory on the drive to measure; a temporary file is created and removed")
      ->capture_default_str();
  io->add_option("--size", args->size, "Bytes to write and read (K/M/G suffixes)")
      ->capture_default_str();
  io->add_option("--block", args->block, "Bytes per request (K/M/G suffixes)")
      ->capture_default_str();
  io->add_option("--qd", args->queue_depth, "Requests kept in flight")
      ->capture_default_str()
      ->check(CLI::Range(1u, io::kMaxQueueDepth));
  io->add_option("--engine", args->engine,
                 "auto, uring or psync (Strata's engines), or deepspeed-aio (the DeepSpeed "
                 "baseline's libaio handle, whole-file requests)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "uring", "io_uring", "psync", "deepspeed-aio"}));
  io->add_option("--rounds", args->rounds, "Rounds per side; the median is reported")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100u));
  io->add_flag("--compare-fio", args->compare_fio,
               "Also run fio (io_uring, direct=1, same size, block and depth) and report ratios");
  io->add_flag("--mixed", args->mixed,
               "Also read the file while a second one is written, both at once, each round: "
               "each direction's rate while the other runs (an optimizer step's traffic)");
  io->add_flag("--no-thp", args->no_thp,
               "Back I/O buffers (Strata's and fio's) with 4 KiB pages instead of transparent "
               "huge pages");
  io->add_flag("--json", args->json, "Print one JSON object instead of a table");
  io->callback([args] { run_io_bench(*args); });
}

}  // namespace strata::bench
