#include "model/simulation_pool.h"

#include <algorithm>

#include "common/assert.h"

namespace strata {

struct SimulationPool::Task {
  enum class State { kQueued, kRunning, kDone };
  std::function<void()> work;
  State state = State::kQueued;
};

SimulationPool::SimulationPool(unsigned threads) {
  threads_.reserve(threads);
  for (unsigned t = 0; t < threads; ++t) threads_.emplace_back([this] { work(); });
}

unsigned SimulationPool::default_threads() {
  const unsigned cores = std::thread::hardware_concurrency();
  return cores > 1 ? cores - 1 : 0;
}

SimulationPool::~SimulationPool() {
  for (;;) {
    Ticket task;
    {
      std::lock_guard lock(mu_);
      task = take_locked(nullptr);
      if (!task) {
        stopping_ = true;
        break;
      }
    }
    run(task);
  }
  changed_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

SimulationPool::Ticket SimulationPool::post(std::function<void()> work) {
  auto task = std::make_shared<Task>();
  task->work = std::move(work);
  {
    std::lock_guard lock(mu_);
    STRATA_ASSERT(!stopping_);
    queue_.push_back(task);
  }
  changed_.notify_all();
  return task;
}

void SimulationPool::join(const Ticket& ticket) {
  STRATA_ASSERT(ticket != nullptr);
  std::unique_lock lock(mu_);
  while (ticket->state != Task::State::kDone) {
    // Its own task if no thread has it, else any queued one: the joining thread works too.
    Ticket task = take_locked(&ticket);
    if (!task) {
      changed_.wait(lock);
      continue;
    }
    lock.unlock();
    run(task);
    lock.lock();
  }
}

SimulationPool::Ticket SimulationPool::take_locked(const Ticket* wanted) {
  if (queue_.empty()) return nullptr;
  auto at = queue_.begin();
  if (wanted != nullptr && (*wanted)->state == Task::State::kQueued) {
    at = std::find(queue_.begin(), queue_.end(), *wanted);
    STRATA_ASSERT(at != queue_.end());
  }
  Ticket task = std::move(*at);
  queue_.erase(at);
  task->state = Task::State::kRunning;
  return task;
}

void SimulationPool::run(const Ticket& task) {
  task->work();
  task->work = nullptr;  // what it captured goes now, not when the last ticket does
  {
    std::lock_guard lock(mu_);
    task->state = Task::State::kDone;
  }
  changed_.notify_all();
}

void SimulationPool::work() {
  std::unique_lock lock(mu_);
  for (;;) {
    Ticket task = take_locked(nullptr);
    if (!task) {
      if (stopping_) return;
      changed_.wait(lock);
      continue;
    }
    lock.unlock();
    run(task);
    lock.lock();
  }
}

}  // namespace strata
