// ThreadPool: every index runs once per job, jobs serialize, workers inherit the caller's
// floating-point control state, and NUMA binding pins each worker to one CPU of the node.
#include "optim/thread_pool.h"

#include <gtest/gtest.h>
#include <immintrin.h>
#include <sched.h>

#include <atomic>
#include <thread>
#include <vector>

namespace strata::optim {
namespace {

TEST(ThreadPool, RunsEveryIndexExactlyOncePerJob) {
  for (int threads : {1, 2, 5}) {
    auto pool = ThreadPool::create(threads);
    ASSERT_TRUE(pool.is_ok()) << pool.status().message();
    EXPECT_EQ((*pool)->threads(), threads);
    std::vector<std::atomic<int>> hits(threads);
    for (int job = 0; job < 500; ++job) {
      auto count = [&](int index) { hits[index].fetch_add(1); };
      (*pool)->run_each(count);
    }
    for (int i = 0; i < threads; ++i) EXPECT_EQ(hits[i].load(), 500) << "index " << i;
  }
}

TEST(ThreadPool, ConcurrentCallersAreSerialized) {
  auto pool = ThreadPool::create(3);
  ASSERT_TRUE(pool.is_ok());
  std::atomic<int> inside{0};
  std::atomic<int> most{0};
  std::atomic<int> total{0};
  auto job = [&](int) {
    const int now = inside.fetch_add(1) + 1;
    int seen = most.load();
    while (now > seen && !most.compare_exchange_weak(seen, now)) {
    }
    total.fetch_add(1);
    inside.fetch_sub(1);
  };
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int k = 0; k < 200; ++k) (*pool)->run_each(job);
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 200 * 3);
  EXPECT_LE(most.load(), 3);  // never two jobs' threads at once
}

TEST(ThreadPool, WorkersUseTheCallersFloatingPointMode) {
  auto pool = ThreadPool::create(3);
  ASSERT_TRUE(pool.is_ok());
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);  // flush-to-zero and denormals-are-zero
  std::vector<unsigned> seen(3);
  auto read = [&](int index) { seen[index] = _mm_getcsr(); };
  (*pool)->run_each(read);
  _mm_setcsr(saved);
  for (unsigned csr : seen) EXPECT_EQ(csr & 0x8040u, 0x8040u);
}

TEST(ThreadPool, BindsEachWorkerToOneCpuOfTheNode) {
  auto pool = ThreadPool::create(2, /*numa_node=*/0);
  ASSERT_TRUE(pool.is_ok()) << pool.status().message();
  std::vector<int> cpus_allowed(2, -1);
  auto read = [&](int index) {
    cpu_set_t set;
    CPU_ZERO(&set);
    ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
    cpus_allowed[index] = CPU_COUNT(&set);
  };
  (*pool)->run_each(read);
  // With a node, the caller does not compute: both indices ran on bound workers.
  EXPECT_EQ(cpus_allowed[0], 1);
  EXPECT_EQ(cpus_allowed[1], 1);
}

TEST(ThreadPool, RejectsAMissingNode) {
  auto pool = ThreadPool::create(2, 4095);
  ASSERT_FALSE(pool.is_ok());
  EXPECT_EQ(pool.status().code(), STRATA_E_INVALID);
}

}  // namespace
}  // namespace strata::optim
