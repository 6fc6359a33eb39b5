#include "telemetry/worker_executor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace strata::telemetry {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<WorkerExecutor> make(uint32_t threads, uint64_t max_queued = 4096) {
  WorkerExecutorConfig config;
  config.threads = threads;
  config.max_queued_tasks = max_queued;
  auto r = WorkerExecutor::create(config);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return r.is_ok() ? std::move(r).value() : nullptr;
}

// Holds the workers inside a task until opened, to fill the queue deterministically.
class Gate {
 public:
  void wait() {
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, 10s, [&] { return open_; });  // bounded even if a test fails early
  }
  void open() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Spins (bounded) until the executor reports `running` tasks in progress.
bool wait_running(const WorkerExecutor& ex, uint64_t running) {
  for (int i = 0; i < 5000; ++i) {
    if (ex.stats().running == running) {
      return true;
    }
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

TEST(WorkerExecutor, RunsPostedWorkOnWorkerThreads) {
  auto ex = make(3);
  ASSERT_TRUE(ex);
  EXPECT_EQ(ex->thread_count(), 3u);
  EXPECT_FALSE(ex->on_worker_thread());

  std::mutex mutex;
  std::set<std::thread::id> ids;
  std::atomic<int> ran{0};
  std::atomic<int> on_worker{0};
  constexpr int kTasks = 2000;
  for (int i = 0; i < kTasks; ++i) {
    ASSERT_TRUE(ex->post([&] {
                    {
                      std::lock_guard lock(mutex);
                      ids.insert(std::this_thread::get_id());
                    }
                    if (ex->on_worker_thread()) ++on_worker;
                    ++ran;
                  }).is_ok());
  }
  ASSERT_TRUE(ex->wait_idle(10s).is_ok());
  EXPECT_EQ(ran.load(), kTasks);
  EXPECT_EQ(on_worker.load(), kTasks);
  EXPECT_FALSE(ids.count(std::this_thread::get_id()));
  EXPECT_GE(ids.size(), 1u);
  EXPECT_LE(ids.size(), 3u);
  const auto stats = ex->stats();
  EXPECT_EQ(stats.completed, uint64_t{kTasks});
  EXPECT_EQ(stats.queued + stats.running + stats.rejected + stats.threw, 0u);
}

TEST(WorkerExecutor, AcceptsMoveOnlyTasksAndTasksPostedByTasks) {
  auto ex = make(2);
  ASSERT_TRUE(ex);
  std::promise<int> done;
  auto result = done.get_future();
  auto payload = std::make_unique<int>(20);
  ASSERT_TRUE(ex->post([&, p = std::move(payload), d = std::move(done)]() mutable {
                  // A completion handler posting its follow-up never blocks on the queue.
                  const int base = *p;
                  EXPECT_TRUE(ex->post([base, d = std::move(d)]() mutable {
                                  d.set_value(base + 22);
                                }).is_ok());
                }).is_ok());
  ASSERT_EQ(result.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(result.get(), 42);
}

struct Probe {
  std::unique_ptr<int> owned = std::make_unique<int>(7);
  void operator()() {}
};

TEST(WorkerExecutor, FullQueueRefusesPostAndLeavesTheTaskWithTheCaller) {
  auto ex = make(1, /*max_queued=*/2);
  ASSERT_TRUE(ex);
  Gate gate;
  ASSERT_TRUE(ex->post([&] { gate.wait(); }).is_ok());
  ASSERT_TRUE(wait_running(*ex, 1));  // the only worker is now busy
  ASSERT_TRUE(ex->post([] {}).is_ok());
  ASSERT_TRUE(ex->post([] {}).is_ok());

  Probe probe;
  const Status full = ex->post(std::move(probe));
  EXPECT_EQ(full.code(), STRATA_E_LIMIT);
  ASSERT_TRUE(probe.owned);  // NOLINT(bugprone-use-after-move): not moved from on refusal
  EXPECT_EQ(*probe.owned, 7);
  EXPECT_EQ(ex->stats().queued, 2u);
  EXPECT_EQ(ex->stats().rejected, 1u);

  // post_wait gives up after its timeout while the queue stays full...
  EXPECT_EQ(ex->post_wait([] {}, 30ms).code(), STRATA_E_TIMEOUT);
  // ...and succeeds once the worker makes room.
  std::thread opener([&] {
    std::this_thread::sleep_for(30ms);
    gate.open();
  });
  EXPECT_TRUE(ex->post_wait(std::move(probe), 10s).is_ok());
  opener.join();
  ASSERT_TRUE(ex->wait_idle(10s).is_ok());
  EXPECT_EQ(ex->stats().completed, 4u);
}

TEST(WorkerExecutor, WaitIdleTimesOutWhileBusyAndIsRefusedOnAWorker) {
  auto ex = make(1);
  ASSERT_TRUE(ex);
  Gate gate;
  std::promise<int> code_on_worker;
  ASSERT_TRUE(ex->post([&] {
                  code_on_worker.set_value(ex->wait_idle(1s).code());
                  gate.wait();
                }).is_ok());
  auto code = code_on_worker.get_future();
  ASSERT_EQ(code.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(code.get(), STRATA_E_STATE);
  EXPECT_EQ(ex->wait_idle(20ms).code(), STRATA_E_TIMEOUT);
  gate.open();
  EXPECT_TRUE(ex->wait_idle(10s).is_ok());
}

TEST(WorkerExecutor, ShutdownRunsQueuedTasksJoinsAndRefusesNewOnes) {
  auto ex = make(2);
  ASSERT_TRUE(ex);
  Gate gate;
  std::atomic<int> ran{0};
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(ex->post([&] {
                    gate.wait();
                    ++ran;
                  }).is_ok());
  }
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(ex->post([&] { ++ran; }).is_ok());
  }
  std::thread opener([&] {
    std::this_thread::sleep_for(20ms);
    gate.open();
  });
  ex->shutdown();  // blocks until the queued work has run
  opener.join();
  EXPECT_EQ(ran.load(), 52);
  EXPECT_EQ(ex->post([] {}).code(), STRATA_E_STATE);
  EXPECT_EQ(ex->post_wait([] {}, 1s).code(), STRATA_E_STATE);
  ex->shutdown();  // idempotent
  ex.reset();      // and the destructor after it is fine
}

TEST(WorkerExecutor, DestructorDrainsAndJoins) {
  std::atomic<int> ran{0};
  {
    auto ex = make(2);
    ASSERT_TRUE(ex);
    for (int i = 0; i < 100; ++i) {
      ASSERT_TRUE(ex->post([&] { ++ran; }).is_ok());
    }
  }
  EXPECT_EQ(ran.load(), 100);
}

TEST(WorkerExecutor, ATaskThatThrowsIsCountedAndThePoolKeepsWorking) {
  auto ex = make(1);
  ASSERT_TRUE(ex);
  ASSERT_TRUE(ex->post([] { throw std::runtime_error("bug in a handler"); }).is_ok());
  std::atomic<bool> ran{false};
  ASSERT_TRUE(ex->post([&] { ran = true; }).is_ok());
  ASSERT_TRUE(ex->wait_idle(10s).is_ok());
  EXPECT_TRUE(ran.load());
  EXPECT_EQ(ex->stats().threw, 1u);
  EXPECT_EQ(ex->stats().completed, 2u);
}

TEST(WorkerExecutor, RejectsConfigurationsOutsideTheLimits) {
  WorkerExecutorConfig config;
  config.threads = kMaxWorkerThreads + 1;
  EXPECT_EQ(WorkerExecutor::create(config).status().code(), STRATA_E_INVALID);
  config = {};
  config.max_queued_tasks = 0;
  EXPECT_EQ(WorkerExecutor::create(config).status().code(), STRATA_E_INVALID);
  config.max_queued_tasks = kMaxQueuedTasks + 1;
  EXPECT_EQ(WorkerExecutor::create(config).status().code(), STRATA_E_INVALID);
  config = {};  // threads 0: automatic
  auto automatic = WorkerExecutor::create(config);
  ASSERT_TRUE(automatic.is_ok());
  EXPECT_GE((*automatic)->thread_count(), 1u);
  EXPECT_LE((*automatic)->thread_count(), kMaxAutoWorkerThreads);
}

}  // namespace
}  // namespace strata::telemetry
