// ContentThread: where the extent store hashes a write and verifies a read, away from the
// threads that must not wait on XXH3.
//
// Two threads used to hash. The io_uring engine's one owner thread (io/uring_engine.h) verified
// every finished read, and while it hashed it neither reaped completions nor submitted blocks:
// on the main job a profile found it hashing two thirds of its time, the drive's queue draining
// behind it. And the caller of write_async hashed the write before issuing it, which for the
// scheduler means inside its lock, where every acquire and release waits on it. Both now hand
// the request over:
//
//   write_async (caller): admit --post()--> [FIFO] --> hash, submit to the engine
//   engine thread:        read done --post()--> [FIFO] --> verify, settle, on_complete
//
// One thread, first in first out (writes reach the engine in the order they were admitted), and
// no allocation: the queue is linked through ExtentIo::next_in_content_queue, and a request is in
// it only between its hand-over and its turn. A caller still never sees unverified bytes reported
// as read. Thread rules: post() from any thread; the owner destroys it only once nothing it
// posted is still waiting (the extent store waits for all its I/O in flight first).
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "common/status.h"
#include "storage/swap_store.h"

namespace strata::storage {

class ContentThread {
 public:
  using Work = void (*)(ExtentIo* io, void* context);

  static Result<std::unique_ptr<ContentThread>> start(Work work, void* context);
  ContentThread(const ContentThread&) = delete;
  ContentThread& operator=(const ContentThread&) = delete;
  ~ContentThread();  // stops the thread once the queue is empty

  // Queues `io` for work(io, context); wakes the thread. Never waits on the hashing.
  void post(ExtentIo* io);

 private:
  ContentThread(Work work, void* context) : work_(work), context_(context) {}
  void run();

  const Work work_;
  void* const context_;
  std::mutex mutex_;
  std::condition_variable posted_;
  ExtentIo* head_ = nullptr;  // oldest
  ExtentIo* tail_ = nullptr;
  bool stopping_ = false;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace strata::storage
