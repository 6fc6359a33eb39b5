#include "storage/content_thread.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <latch>
#include <mutex>
#include <thread>
#include <vector>

namespace strata::storage {
namespace {

struct Seen {
  std::mutex mutex;
  std::vector<ExtentIo*> order;
  std::vector<std::thread::id> threads;
  std::latch* all_done = nullptr;
};

void record(ExtentIo* io, void* context) {
  auto* seen = static_cast<Seen*>(context);
  {
    std::lock_guard lock(seen->mutex);
    seen->order.push_back(io);
    seen->threads.push_back(std::this_thread::get_id());
  }
  seen->all_done->count_down();
}

// Requests are worked in the order they were posted (writes reach the engine in the order the
// store admitted them), all on one thread that is not the poster's.
TEST(ContentThread, WorksPostedRequestsInOrderOnItsOwnThread) {
  constexpr int kRequests = 200;
  std::vector<ExtentIo> ios(kRequests);
  std::latch all_done(kRequests);
  Seen seen;
  seen.all_done = &all_done;
  {
    auto thread = ContentThread::start(&record, &seen);
    ASSERT_TRUE(thread.is_ok()) << thread.status().message();
    for (ExtentIo& io : ios) (*thread)->post(&io);
    all_done.wait();
  }  // destroyed with nothing waiting: joins
  ASSERT_EQ(seen.order.size(), ios.size());
  for (int i = 0; i < kRequests; ++i) EXPECT_EQ(seen.order[i], &ios[i]) << i;
  for (const std::thread::id id : seen.threads) {
    EXPECT_EQ(id, seen.threads.front());
    EXPECT_NE(id, std::this_thread::get_id());
  }
}

// Posts from several threads at once all arrive, each exactly once.
TEST(ContentThread, TakesPostsFromManyThreadsAtOnce) {
  constexpr int kPosters = 4;
  constexpr int kEach = 250;
  std::vector<ExtentIo> ios(kPosters * kEach);
  std::latch all_done(kPosters * kEach);
  Seen seen;
  seen.all_done = &all_done;
  auto thread = ContentThread::start(&record, &seen);
  ASSERT_TRUE(thread.is_ok()) << thread.status().message();
  std::vector<std::thread> posters;
  for (int p = 0; p < kPosters; ++p) {
    posters.emplace_back([&, p] {
      for (int i = 0; i < kEach; ++i) (*thread)->post(&ios[p * kEach + i]);
    });
  }
  for (std::thread& t : posters) t.join();
  all_done.wait();
  std::vector<ExtentIo*> sorted = seen.order;
  std::sort(sorted.begin(), sorted.end());
  ASSERT_EQ(sorted.size(), ios.size());
  for (size_t i = 0; i < ios.size(); ++i) EXPECT_EQ(sorted[i], &ios[i]);
}

}  // namespace
}  // namespace strata::storage
