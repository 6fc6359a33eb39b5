// The bounded queue between submit() and an engine's threads. Not thread-safe: the engine guards
// it with its own mutex, which also guards the state that decides who waits on it.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "common/assert.h"
#include "io/io_engine.h"

namespace strata::io {

class RequestFifo {
 public:
  explicit RequestFifo(uint32_t capacity) : ring_(capacity) { STRATA_ASSERT(capacity > 0); }

  bool full() const { return count_ == ring_.size(); }
  bool empty() const { return count_ == 0 && overflow_.empty(); }

  void push(IoRequest* request) {
    STRATA_ASSERT(!full());
    ring_[(head_ + count_) % ring_.size()] = request;
    ++count_;
  }

  // Beyond the bound, for submissions made by the engine's own threads (from an on_complete
  // callback): blocking there would wait for the very thread that drains the queue. Allocates,
  // but only on that rare path.
  void push_overflow(IoRequest* request) { overflow_.push_back(request); }

  IoRequest* pop() {
    if (count_ > 0) {
      IoRequest* request = ring_[head_];
      head_ = (head_ + 1) % ring_.size();
      --count_;
      return request;
    }
    if (overflow_.empty()) {
      return nullptr;
    }
    IoRequest* request = overflow_.front();
    overflow_.pop_front();
    return request;
  }

 private:
  std::vector<IoRequest*> ring_;
  size_t head_ = 0;
  size_t count_ = 0;
  std::deque<IoRequest*> overflow_;
};

}  // namespace strata::io
