#include "storage/content_thread.h"

#include <system_error>

#include "common/assert.h"

namespace strata::storage {

Result<std::unique_ptr<ContentThread>> ContentThread::start(Work work, void* context) {
  STRATA_ASSERT(work != nullptr);
  std::unique_ptr<ContentThread> thread(new ContentThread(work, context));
  try {
    thread->thread_ = std::thread([t = thread.get()] { t->run(); });
  } catch (const std::system_error& e) {
    return Status::error(STRATA_E_NOMEM,
                         std::string("starting the extent store's content thread: ") + e.what());
  }
  return thread;
}

ContentThread::~ContentThread() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  posted_.notify_one();
  if (thread_.joinable()) thread_.join();
  STRATA_ASSERT(head_ == nullptr);  // the owner waited for all its I/O in flight
}

void ContentThread::post(ExtentIo* io) {
  io->next_in_content_queue = nullptr;
  // Notified under the lock: once it is released the thread may finish this request, the
  // store's close() see nothing in flight and its owner destroy this object, condition
  // variable included, before a notify made after the unlock (ThreadSanitizer found it).
  std::lock_guard lock(mutex_);
  if (tail_ == nullptr) {
    head_ = io;
  } else {
    tail_->next_in_content_queue = io;
  }
  tail_ = io;
  posted_.notify_one();
}

void ContentThread::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    posted_.wait(lock, [this] { return head_ != nullptr || stopping_; });
    if (head_ == nullptr) return;  // stopping, and nothing is left
    ExtentIo* io = head_;
    head_ = io->next_in_content_queue;
    if (head_ == nullptr) tail_ = nullptr;
    lock.unlock();
    work_(io, context_);  // the store does not touch `io` after handing it on
    lock.lock();
  }
}

}  // namespace strata::storage
