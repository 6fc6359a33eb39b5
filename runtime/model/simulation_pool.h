#pragma once

// The threads a plan's simulations run on, side by side (docs/scheduling.md, "Simulator
// speed").
//
// A plan simulates one step per candidate: the GPUs that offload to NVMe, the comparison with
// ZeRO-Infinity, the re-plans behind the advice, and two steps where the job accumulates more
// micro-batches than are simulated. Each simulation owns its scheduler and virtual clock, so they
// share nothing. Before this pool each stage ran its own threads and waited for the slowest
// before the next began; now every simulation is posted as soon as what it needs is known, and
// the machine's cores stay busy until the last one ends.
//
// Fork and join. post() queues a task; join() returns once it has run. A thread that joins does
// not sit idle while tasks are queued: it takes back the task it waits for if no thread has
// started it, else runs other queued tasks until its own is done. Hence:
// - a task may post and join tasks of its own (a re-plan posts its simulations) and the pool
//   never deadlocks: a join waits only for a task that some thread is running;
// - the pool has one thread fewer than the cores, since the thread that joins works too; with
//   one core it has none and every task runs in the join that wants it.
//
// Limits: tasks must not throw (the runtime's code returns Result); every posted task must be
// joined before the objects it reads go away (SimulationBatch joins in its destructor).

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace strata {

class SimulationPool {
 public:
  struct Task;
  using Ticket = std::shared_ptr<Task>;

  // `threads` working threads (0: none; every task runs in its join).
  explicit SimulationPool(unsigned threads);
  // One fewer than the cores the machine reports (the joining thread is the last one).
  static unsigned default_threads();
  // Runs what is still queued, then stops the threads.
  ~SimulationPool();
  SimulationPool(const SimulationPool&) = delete;
  SimulationPool& operator=(const SimulationPool&) = delete;

  Ticket post(std::function<void()> work);
  void join(const Ticket& ticket);

 private:
  // Takes the task at the queue's front (or `wanted`, if queued) under the lock; null if none.
  Ticket take_locked(const Ticket* wanted);
  void run(const Ticket& task);  // without the lock held
  void work();                   // a thread's loop

  std::mutex mu_;
  std::condition_variable changed_;  // a task was queued or finished, or the pool stops
  std::deque<Ticket> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace strata
