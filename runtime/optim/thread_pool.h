// A fixed set of threads that run one job at a time on all of them: the CPU optimizer's workers.
// Threads are made once; run() allocates nothing, so a training step pays only two wake-ups.
// When given a NUMA node, the workers are bound with hwloc to that node's cores (one core each,
// spread with hwloc_distrib) so they stream the node-local pinned buffers the scheduler hands in.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/status.h"

namespace strata::optim {

// CPUs this process may run on (its affinity mask): the optimizer's thread count when none is
// configured, and what an automatic pinned budget sizes sub-groups for.
int affinity_cpu_count();

class ThreadPool {
 public:
  // threads: how many threads execute a job; <= 0 means one per core available (of the node
  // when numa_node >= 0, else of the process's CPU affinity mask).
  // numa_node < 0: threads - 1 unbound workers plus the calling thread of run().
  // numa_node >= 0: threads workers bound to the node's cores; the caller of run() only waits,
  // so all the work happens on the node even when the caller lives elsewhere.
  static Result<std::unique_ptr<ThreadPool>> create(int threads, int numa_node = -1);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return threads_; }
  int numa_node() const { return numa_node_; }

  using Job = void (*)(void* context, int thread_index);
  // Calls job(context, i) for every i in [0, threads()) on distinct threads and returns when all
  // have returned. The job must not throw. Workers run with the caller's floating-point control
  // state (MXCSR: rounding, flush-to-zero), so a result never depends on which thread made it.
  // Concurrent calls are serialized.
  void run(Job job, void* context);

  // run() for a callable taking the thread index.
  template <typename F>
  void run_each(F& f) {
    run([](void* context, int index) { (*static_cast<F*>(context))(index); }, &f);
  }

 private:
  ThreadPool(int threads, int numa_node) : threads_(threads), numa_node_(numa_node) {}
  void worker_loop(int index);

  const int threads_;
  const int numa_node_;
  bool caller_computes_ = true;
  std::vector<std::thread> workers_;

  std::mutex run_mutex_;  // one run() at a time
  std::mutex mutex_;      // guards everything below
  std::condition_variable wake_;
  std::condition_variable done_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  Job job_ = nullptr;
  void* context_ = nullptr;
  uint32_t fp_control_ = 0;
};

}  // namespace strata::optim
