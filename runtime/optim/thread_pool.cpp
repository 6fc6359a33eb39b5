#include "optim/thread_pool.h"

#include <hwloc.h>
#include <sched.h>

#include <cerrno>
#include <climits>
#include <string>
#include <system_error>

#include "common/assert.h"

#if defined(STRATA_OPTIM_X86)
#include <immintrin.h>
#endif

namespace strata::optim {
namespace {

uint32_t read_fp_control() {
#if defined(STRATA_OPTIM_X86)
  return _mm_getcsr();
#else
  return 0;
#endif
}

void write_fp_control([[maybe_unused]] uint32_t value) {
#if defined(STRATA_OPTIM_X86)
  // Keep the caller's rounding mode and FTZ/DAZ, but never unmask exceptions in a worker: the
  // masked lanes of tail vectors compute on zeros (0/0 when eps is 0) and must not trap.
  _mm_setcsr(value | 0x1F80u);
#endif
}

class Topology {
 public:
  Topology() = default;
  ~Topology() {
    if (loaded_) hwloc_topology_destroy(topology_);
  }
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  Status load() {
    if (hwloc_topology_init(&topology_) != 0)
      return Status::error(STRATA_E_NOMEM, "hwloc_topology_init failed");
    if (hwloc_topology_load(topology_) != 0) {
      hwloc_topology_destroy(topology_);
      return Status::error(STRATA_E_UNSUPPORTED, "hwloc could not read the machine's topology");
    }
    loaded_ = true;
    return Status::ok();
  }
  hwloc_topology_t get() const { return topology_; }

 private:
  hwloc_topology_t topology_{};
  bool loaded_ = false;
};

class Bitmap {
 public:
  Bitmap() : bitmap_(hwloc_bitmap_alloc()) {}
  ~Bitmap() { hwloc_bitmap_free(bitmap_); }
  Bitmap(const Bitmap&) = delete;
  Bitmap& operator=(const Bitmap&) = delete;
  Bitmap(Bitmap&& other) noexcept : bitmap_(other.bitmap_) { other.bitmap_ = nullptr; }
  hwloc_bitmap_t get() const { return bitmap_; }

 private:
  hwloc_bitmap_t bitmap_;
};

}  // namespace

int affinity_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  const int count = CPU_COUNT(&set);
  return count > 0 ? count : 1;
}

Result<std::unique_ptr<ThreadPool>> ThreadPool::create(int threads, int numa_node) {
  Topology topology;
  hwloc_obj_t node = nullptr;
  if (numa_node >= 0) {
    STRATA_TRY(topology.load());
    node = hwloc_get_numanode_obj_by_os_index(topology.get(), static_cast<unsigned>(numa_node));
    if (node == nullptr || node->cpuset == nullptr || hwloc_bitmap_iszero(node->cpuset)) {
      const int nodes = hwloc_get_nbobjs_by_type(topology.get(), HWLOC_OBJ_NUMANODE);
      return invalid_argument("optimizer threads: NUMA node " + std::to_string(numa_node) +
                              " does not exist or has no CPUs (this machine has " +
                              std::to_string(nodes) + " node(s))");
    }
    if (threads <= 0) {
      threads =
          hwloc_get_nbobjs_inside_cpuset_by_type(topology.get(), node->cpuset, HWLOC_OBJ_CORE);
    }
  } else if (threads <= 0) {
    threads = affinity_cpu_count();
  }
  if (threads <= 0) threads = 1;
  if (threads > 1024) {
    return invalid_argument("optimizer threads: " + std::to_string(threads) + " is more than 1024");
  }

  std::unique_ptr<ThreadPool> pool(new ThreadPool(threads, numa_node));
  pool->caller_computes_ = numa_node < 0;
  const int first_worker = pool->caller_computes_ ? 1 : 0;

  // One cpuset per worker, spread over the node's cores, each narrowed to a single PU so the
  // scheduler cannot bounce a worker between hyperthreads.
  std::vector<Bitmap> cpusets;
  if (node != nullptr) {
    const int workers = threads - first_worker;
    cpusets.resize(static_cast<size_t>(workers));
    std::vector<hwloc_bitmap_t> raw;
    raw.reserve(cpusets.size());
    for (auto& set : cpusets) raw.push_back(set.get());
    // hwloc 2 keeps NUMA nodes beside the CPU tree: distribute over the smallest CPU-side
    // object that covers the node.
    hwloc_obj_t root = hwloc_get_obj_covering_cpuset(topology.get(), node->cpuset);
    if (root == nullptr) root = hwloc_get_root_obj(topology.get());
    if (hwloc_distrib(topology.get(), &root, 1, raw.data(), static_cast<unsigned>(workers), INT_MAX,
                      0) != 0) {
      return Status::error(STRATA_E_INTERNAL, "optimizer threads: hwloc_distrib failed");
    }
    // hwloc_distrib stores newly allocated bitmaps into raw[] (it does not fill the ones passed):
    // take their contents and free them. Reading cpusets unchanged lost the distribution (every
    // worker fell back to the node's first CPU) and leaked the bitmaps (found by LeakSanitizer).
    for (size_t i = 0; i < cpusets.size(); ++i) {
      if (raw[i] != cpusets[i].get()) {
        hwloc_bitmap_copy(cpusets[i].get(), raw[i]);
        hwloc_bitmap_free(raw[i]);
      }
    }
    for (auto& set : cpusets) {
      hwloc_bitmap_and(set.get(), set.get(), node->cpuset);
      if (hwloc_bitmap_iszero(set.get())) hwloc_bitmap_copy(set.get(), node->cpuset);
      hwloc_bitmap_singlify(set.get());
    }
  }

  try {
    for (int index = first_worker; index < threads; ++index) {
      pool->workers_.emplace_back([raw = pool.get(), index] { raw->worker_loop(index); });
    }
  } catch (const std::system_error& e) {
    return Status::error(STRATA_E_LIMIT,
                         std::string("optimizer threads: cannot start a thread: ") + e.what());
  }

  for (size_t i = 0; i < cpusets.size(); ++i) {
    if (hwloc_set_thread_cpubind(topology.get(), pool->workers_[i].native_handle(),
                                 cpusets[i].get(), HWLOC_CPUBIND_THREAD) != 0) {
      return errno_status(
          STRATA_E_UNSUPPORTED,
          "optimizer threads: binding a worker to NUMA node " + std::to_string(numa_node), errno);
    }
  }
  return pool;
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    const Job job = job_;
    void* const context = context_;
    const uint32_t fp_control = fp_control_;
    lock.unlock();
    write_fp_control(fp_control);
    job(context, index);
    lock.lock();
    STRATA_ASSERT(pending_ > 0);
    if (--pending_ == 0) done_.notify_one();
  }
}

void ThreadPool::run(Job job, void* context) {
  STRATA_ASSERT(job != nullptr);
  std::lock_guard serial(run_mutex_);
  if (workers_.empty()) {
    job(context, 0);
    return;
  }
  {
    std::lock_guard lock(mutex_);
    job_ = job;
    context_ = context;
    fp_control_ = read_fp_control();
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  if (caller_computes_) job(context, 0);
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return pending_ == 0; });
}

}  // namespace strata::optim
