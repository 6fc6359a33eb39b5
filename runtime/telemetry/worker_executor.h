// The runtime's worker executor: a fixed set of threads running completion handlers (I/O done ->
// copy to device -> mark resident -> wake the waiter) posted from I/O threads and the training
// thread. It is a Boost.Asio io_context run by N threads; Asio stays inside the .cpp.
//
// Backpressure: the queue of posted-but-not-started tasks is bounded (max_queued_tasks).
//  - post() never blocks: when the queue is full it refuses with STRATA_E_LIMIT and leaves the
//    callable untouched, so the caller can run it inline, retry or fail the request. This is the
//    call for threads that must not stall (the io_uring reaper, the workers themselves).
//  - post_wait() blocks while the queue is full, up to a timeout: producers that can afford to
//    slow down (the training thread issuing prefetches) are throttled to the workers' pace instead
//    of queueing without bound. On a worker thread it does not wait (a worker waiting for room
//    that only workers can make could stall the whole pool); it behaves like post().
//
// Shutdown (the destructor, or shutdown()): new posts are refused with STRATA_E_STATE, tasks
// already queued still run (a dropped completion handler would leave a waiter hanging forever),
// then the threads are joined.
//
// Thread rules: every member may be called from any thread, except that shutdown() and the
// destructor must not run on a worker thread (a thread cannot join itself), and wait_idle()
// refuses to wait on one.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "common/status.h"

namespace strata::telemetry {

// Explicit limits.
inline constexpr uint32_t kMaxWorkerThreads = 256;
inline constexpr uint64_t kMaxQueuedTasks = uint64_t{1} << 20;
inline constexpr uint32_t kMaxAutoWorkerThreads = 8;

struct WorkerExecutorConfig {
  // 0: one per hardware thread, at most kMaxAutoWorkerThreads (completion handlers are short;
  // more threads than that only add contention).
  uint32_t threads = 0;
  // Tasks posted but not yet started, 1..kMaxQueuedTasks.
  uint64_t max_queued_tasks = 4096;
  // Thread name prefix shown by top / gdb / perf ("<prefix>-<n>"; Linux keeps 15 bytes).
  std::string thread_name = "strata-wrk";
};

struct WorkerExecutorStats {
  uint64_t queued = 0;     // posted, not started
  uint64_t running = 0;    // started, not finished
  uint64_t completed = 0;  // finished (including ones that threw)
  uint64_t rejected = 0;   // refused: queue full or shut down
  uint64_t threw = 0;      // tasks that let an exception escape (a bug in the task)
};

// A move-only, type-erased `void()` callable: completion handlers often own a buffer lease or
// a promise, which std::function (copyable only) cannot hold.
class WorkerTask {
 public:
  WorkerTask() = default;
  // Constrained so that it never stands in for the move constructor.
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, WorkerTask>>>
  explicit WorkerTask(F&& f)  // NOLINT(bugprone-forwarding-reference-overload)
      : impl_(std::make_unique<Model<std::decay_t<F>>>(std::forward<F>(f))) {}
  WorkerTask(WorkerTask&&) noexcept = default;
  WorkerTask& operator=(WorkerTask&&) noexcept = default;

  explicit operator bool() const { return impl_ != nullptr; }
  void operator()() { impl_->call(); }

 private:
  struct Concept {
    virtual ~Concept() = default;
    virtual void call() = 0;
  };
  template <typename F>
  struct Model final : Concept {
    explicit Model(F g) : f(std::move(g)) {}
    void call() override { f(); }
    F f;
  };
  std::unique_ptr<Concept> impl_;
};

class WorkerExecutor {
 public:
  // Starts the threads. STRATA_E_INVALID for a thread count above kMaxWorkerThreads or a queue
  // bound outside 1..kMaxQueuedTasks; STRATA_E_LIMIT when the OS refuses a thread.
  static Result<std::unique_ptr<WorkerExecutor>> create(const WorkerExecutorConfig& config = {});
  // Defined in the .cpp (keeps Asio out of this header); named here so its helpers can use it.
  struct Impl;

  ~WorkerExecutor();
  WorkerExecutor(const WorkerExecutor&) = delete;
  WorkerExecutor& operator=(const WorkerExecutor&) = delete;

  // Queues f to run once on a worker thread. Never blocks. STRATA_E_LIMIT when the queue is full,
  // STRATA_E_STATE after shutdown; in both cases f has not been moved from.
  template <typename F>
  Status post(F&& f) noexcept {
    return post_impl(std::forward<F>(f), std::chrono::milliseconds(0), /*wait=*/false);
  }
  // Like post(), but waits up to timeout for room in the queue (STRATA_E_TIMEOUT if none came).
  template <typename F>
  Status post_wait(F&& f, std::chrono::milliseconds timeout) noexcept {
    return post_impl(std::forward<F>(f), timeout, /*wait=*/true);
  }

  // Waits until no task is queued or running. STRATA_E_TIMEOUT after timeout; STRATA_E_STATE
  // on a worker thread (it would wait for itself).
  Status wait_idle(std::chrono::milliseconds timeout);

  // Refuses new tasks, runs the queued ones, joins the threads. Idempotent.
  void shutdown();

  uint32_t thread_count() const;
  bool on_worker_thread() const;
  WorkerExecutorStats stats() const;

 private:
  explicit WorkerExecutor(std::unique_ptr<Impl> impl);

  template <typename F>
  Status post_impl(F&& f, std::chrono::milliseconds timeout, bool wait) noexcept {
    // The slot is reserved before f is moved into a task, so a refused f is left intact.
    STRATA_TRY(reserve_slot(timeout, wait));
    try {
      return submit_reserved(WorkerTask(std::forward<F>(f)));
    } catch (...) {
      release_slot();
      return Status::error(STRATA_E_NOMEM, "worker executor: cannot allocate a task");
    }
  }
  Status reserve_slot(std::chrono::milliseconds timeout, bool wait) noexcept;
  void release_slot() noexcept;
  Status submit_reserved(WorkerTask task) noexcept;

  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::telemetry
