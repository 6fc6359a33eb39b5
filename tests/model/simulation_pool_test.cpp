#include "model/simulation_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace strata {
namespace {

// Every posted task runs once, whatever the thread count, and join returns only after it has.
TEST(SimulationPool, EveryTaskRunsOnceAndJoinReturnsAfterIt) {
  for (unsigned threads : {0u, 1u, 3u}) {
    SimulationPool pool(threads);
    std::vector<int> ran(64, 0);
    std::vector<SimulationPool::Ticket> tickets;
    for (size_t k = 0; k < ran.size(); ++k) tickets.push_back(pool.post([&, k] { ++ran[k]; }));
    for (size_t k = 0; k < ran.size(); ++k) {
      pool.join(tickets[k]);
      EXPECT_EQ(ran[k], 1) << threads << " threads, task " << k;
    }
  }
}

// A re-plan posts its simulations and joins them from inside a task: with every thread busy in
// such a task (or with none at all) the joins take their own tasks back instead of waiting.
TEST(SimulationPool, TasksThatPostAndJoinTasksOfTheirOwnDoNotDeadlock) {
  for (unsigned threads : {0u, 1u, 2u}) {
    SimulationPool pool(threads);
    std::atomic<int> leaves{0};
    std::vector<SimulationPool::Ticket> outer;
    for (int k = 0; k < 8; ++k) {
      outer.push_back(pool.post([&] {
        std::vector<SimulationPool::Ticket> inner;
        for (int i = 0; i < 4; ++i) inner.push_back(pool.post([&] { ++leaves; }));
        for (const SimulationPool::Ticket& t : inner) pool.join(t);
      }));
    }
    for (const SimulationPool::Ticket& t : outer) pool.join(t);
    EXPECT_EQ(leaves.load(), 32) << threads << " threads";
  }
}

// With no threads of its own the pool runs a task in the join that wants it, not before.
TEST(SimulationPool, WithNoThreadsATaskRunsInItsJoin) {
  SimulationPool pool(0);
  bool ran = false;
  const SimulationPool::Ticket t = pool.post([&] { ran = true; });
  EXPECT_FALSE(ran);
  pool.join(t);
  EXPECT_TRUE(ran);
}

}  // namespace
}  // namespace strata
