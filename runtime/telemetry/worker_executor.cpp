#include "telemetry/worker_executor.h"

#include <pthread.h>

#include <algorithm>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>

#include "common/assert.h"

namespace strata::telemetry {

namespace asio = boost::asio;

struct WorkerExecutor::Impl {
  explicit Impl(uint64_t max_queued) : max_queued_tasks(max_queued) {}

  asio::io_context io;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  const uint64_t max_queued_tasks;
  uint32_t thread_count = 0;  // set once by create()

  std::mutex shutdown_mutex;  // serialises shutdown() calls; guards threads and joined
  std::vector<std::thread> threads;
  bool joined = false;

  mutable std::mutex mutex;
  std::condition_variable room;  // queued dropped below the bound, or shutdown began
  std::condition_variable idle;  // queued + running reached 0
  bool closed = false;
  WorkerExecutorStats stats;

  void run_thread(const std::string& name) {
    // Names make the pool recognisable in top -H, gdb and perf.
    (void)pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
    // Tasks catch their own exceptions (see Runner), so run() only ends when the work guard is
    // gone and the queue is empty; the loop is a belt for Asio-internal exceptions.
    for (;;) {
      try {
        io.run();
        return;
      } catch (...) {
        std::fprintf(stderr, "strata: worker executor: unexpected exception in io_context::run\n");
      }
    }
  }
};

namespace {

// The handler Asio runs: accounting around the task, and an exception barrier so that one
// faulty task neither kills the thread nor leaves the counters wrong.
struct Runner {
  WorkerExecutor::Impl* impl;  // outlives every handler: shutdown() joins before Impl dies
  WorkerTask task;

  void operator()() {
    {
      std::lock_guard lock(impl->mutex);
      STRATA_ASSERT(impl->stats.queued > 0);
      --impl->stats.queued;
      ++impl->stats.running;
    }
    impl->room.notify_one();
    bool threw = false;
    try {
      task();
    } catch (const std::exception& e) {
      threw = true;
      std::fprintf(stderr, "strata: worker task threw: %s\n", e.what());
    } catch (...) {
      threw = true;
      std::fprintf(stderr, "strata: worker task threw a non-std exception\n");
    }
    task = WorkerTask();  // release what the task owns before reporting it done
    bool now_idle;
    {
      std::lock_guard lock(impl->mutex);
      --impl->stats.running;
      ++impl->stats.completed;
      if (threw) {
        ++impl->stats.threw;
      }
      now_idle = impl->stats.queued == 0 && impl->stats.running == 0;
    }
    if (now_idle) {
      impl->idle.notify_all();
    }
  }
};

}  // namespace

Result<std::unique_ptr<WorkerExecutor>> WorkerExecutor::create(const WorkerExecutorConfig& config) {
  if (config.threads > kMaxWorkerThreads) {
    return invalid_argument("worker threads must be 0 (automatic) or 1.." +
                            std::to_string(kMaxWorkerThreads) + ", got " +
                            std::to_string(config.threads));
  }
  if (config.max_queued_tasks == 0 || config.max_queued_tasks > kMaxQueuedTasks) {
    return invalid_argument("worker queue bound must be 1.." + std::to_string(kMaxQueuedTasks) +
                            ", got " + std::to_string(config.max_queued_tasks));
  }
  uint32_t threads = config.threads;
  if (threads == 0) {
    threads = std::clamp<uint32_t>(std::thread::hardware_concurrency(), 1, kMaxAutoWorkerThreads);
  }
  std::unique_ptr<Impl> impl;
  try {
    impl = std::make_unique<Impl>(config.max_queued_tasks);
    impl->work.emplace(impl->io.get_executor());
  } catch (const std::exception& e) {
    return Status::error(STRATA_E_NOMEM, std::string("worker executor: ") + e.what());
  }
  std::unique_ptr<WorkerExecutor> executor(new (std::nothrow) WorkerExecutor(std::move(impl)));
  if (!executor) {
    return Status::error(STRATA_E_NOMEM, "worker executor: out of memory");
  }
  for (uint32_t i = 0; i < threads; ++i) {
    Impl* p = executor->impl_.get();
    std::string name = config.thread_name + "-" + std::to_string(i);
    try {
      p->threads.emplace_back([p, name = std::move(name)] { p->run_thread(name); });
    } catch (const std::system_error& e) {
      // The destructor joins the threads that did start.
      p->thread_count = static_cast<uint32_t>(p->threads.size());
      return Status::error(STRATA_E_LIMIT, "worker executor: starting thread " + std::to_string(i) +
                                               " of " + std::to_string(threads) + ": " + e.what());
    }
  }
  executor->impl_->thread_count = threads;
  return executor;
}

WorkerExecutor::WorkerExecutor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

WorkerExecutor::~WorkerExecutor() {
  // join() can only throw on a broken invariant (a thread joining itself, which shutdown
  // asserts against) or a lock failure; neither may escape a destructor.
  try {
    shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata: worker executor shutdown: %s\n", e.what());
  }
}

Status WorkerExecutor::reserve_slot(std::chrono::milliseconds timeout, bool wait) noexcept {
  std::unique_lock lock(impl_->mutex);
  const auto has_room = [&] {
    return impl_->closed || impl_->stats.queued < impl_->max_queued_tasks;
  };
  if (wait && !has_room() && !on_worker_thread()) {
    if (!impl_->room.wait_for(lock, timeout, has_room)) {
      ++impl_->stats.rejected;
      return Status::error(STRATA_E_TIMEOUT, "worker executor: queue stayed full (" +
                                                 std::to_string(impl_->max_queued_tasks) +
                                                 " tasks) for " + std::to_string(timeout.count()) +
                                                 " ms");
    }
  }
  if (impl_->closed) {
    ++impl_->stats.rejected;
    return Status::error(STRATA_E_STATE, "worker executor is shut down");
  }
  if (impl_->stats.queued >= impl_->max_queued_tasks) {
    ++impl_->stats.rejected;
    return Status::error(STRATA_E_LIMIT, "worker executor: queue full (" +
                                             std::to_string(impl_->max_queued_tasks) + " tasks)");
  }
  ++impl_->stats.queued;
  return Status::ok();
}

void WorkerExecutor::release_slot() noexcept {
  bool now_idle;
  {
    std::lock_guard lock(impl_->mutex);
    STRATA_ASSERT(impl_->stats.queued > 0);
    --impl_->stats.queued;
    now_idle = impl_->stats.queued == 0 && impl_->stats.running == 0;
  }
  impl_->room.notify_one();
  if (now_idle) {
    impl_->idle.notify_all();
  }
}

Status WorkerExecutor::submit_reserved(WorkerTask task) noexcept {
  // The reservation happened while not closed, and shutdown() waits for the queue to drain
  // through run() after dropping the work guard, so the handler posted here always runs.
  try {
    asio::post(impl_->io, Runner{impl_.get(), std::move(task)});
  } catch (...) {
    release_slot();
    return Status::error(STRATA_E_NOMEM, "worker executor: cannot queue a task");
  }
  return Status::ok();
}

Status WorkerExecutor::wait_idle(std::chrono::milliseconds timeout) {
  if (on_worker_thread()) {
    return Status::error(STRATA_E_STATE, "worker executor: wait_idle on a worker thread");
  }
  std::unique_lock lock(impl_->mutex);
  const bool idle = impl_->idle.wait_for(
      lock, timeout, [&] { return impl_->stats.queued == 0 && impl_->stats.running == 0; });
  if (!idle) {
    return Status::error(STRATA_E_TIMEOUT,
                         "worker executor: still " + std::to_string(impl_->stats.queued) +
                             " queued and " + std::to_string(impl_->stats.running) +
                             " running after " + std::to_string(timeout.count()) + " ms");
  }
  return Status::ok();
}

void WorkerExecutor::shutdown() {
  STRATA_ASSERT(!on_worker_thread());
  std::lock_guard shutdown_lock(impl_->shutdown_mutex);
  if (impl_->joined) {
    return;
  }
  {
    std::lock_guard lock(impl_->mutex);
    impl_->closed = true;
  }
  impl_->room.notify_all();  // post_wait callers get STRATA_E_STATE now
  // Without the guard, run() returns once every handler already posted has run: that is the
  // drain. Reservations made before `closed` was set are posted by their own threads, which are
  // not workers, so they may still land after this point; run() picks them up as long as any
  // thread is still running, and the wait below covers the rest.
  impl_->work.reset();
  for (std::thread& t : impl_->threads) {
    t.join();
  }
  impl_->joined = true;
  // A task reserved just before `closed` may have been posted after every thread left run().
  // Run such stragglers here so that no accepted task is ever dropped.
  for (;;) {
    {
      std::lock_guard lock(impl_->mutex);
      if (impl_->stats.queued == 0) {
        break;
      }
    }
    impl_->io.restart();
    if (impl_->io.poll() == 0) {
      std::this_thread::yield();
    }
  }
}

uint32_t WorkerExecutor::thread_count() const {
  return impl_->thread_count;
}

bool WorkerExecutor::on_worker_thread() const {
  return impl_->io.get_executor().running_in_this_thread();
}

WorkerExecutorStats WorkerExecutor::stats() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->stats;
}

}  // namespace strata::telemetry
