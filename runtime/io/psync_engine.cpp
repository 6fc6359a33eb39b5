#include "io/psync_engine.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "common/assert.h"
#include "io/io_limits.h"

namespace strata::io {

namespace {

// Set on each worker so that submit() can tell a resubmission from inside on_complete (which
// must not block on the queue the same workers drain) from an ordinary caller.
thread_local const PsyncEngine* tls_worker_of = nullptr;

}  // namespace

Result<std::unique_ptr<PsyncEngine>> PsyncEngine::create(const IoEngineOptions& options) {
  STRATA_TRY(validate_options(options));
  return std::unique_ptr<PsyncEngine>(new PsyncEngine(options));
}

PsyncEngine::PsyncEngine(const IoEngineOptions& options)
    : options_(options), pending_(options.queue_depth), active_(options.threads + 1) {
  free_slots_.reserve(active_.size());
  for (uint32_t i = 0; i < active_.size(); ++i) {
    free_slots_.push_back(i);
  }
  workers_.reserve(options.threads);
  for (uint32_t i = 0; i < options.threads; ++i) {
    workers_.emplace_back([this] { worker_loop(); });
  }
}

PsyncEngine::~PsyncEngine() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto& worker : workers_) {
    worker.join();
  }
  STRATA_ASSERT(pending_.empty() && current_ == nullptr);
  STRATA_ASSERT(free_slots_.size() == active_.size());
}

Result<uint32_t> PsyncEngine::register_file(int fd) {
  auto index = registry_.reserve_file(fd);
  if (!index) {
    return index;
  }
  registry_.publish_file(*index, fd);
  return index;
}

Result<int32_t> PsyncEngine::register_buffer(void* base, uint64_t bytes) {
  // pread needs no registration; the index still lets requests name the buffer and be checked
  // against it exactly as io_uring would check them.
  auto index = registry_.reserve_buffer(base, bytes);
  if (!index) {
    return index;
  }
  registry_.publish_buffer(*index);
  return index;
}

Status PsyncEngine::unregister_buffer(int32_t index) {
  auto range = registry_.begin_unregister_buffer(index);
  if (!range) {
    return std::move(range).take_status();
  }
  registry_.release_buffer(index);
  return Status::ok();
}

Status PsyncEngine::submit(IoRequest* request) {
  if (request == nullptr) {
    return invalid_argument("submit: null request");
  }
  STRATA_TRY(registry_.validate(*request));
  request->error = 0;
  request->transferred = 0;
  {
    std::unique_lock lock(mutex_);
    if (tls_worker_of == this) {
      if (pending_.full()) {
        pending_.push_overflow(request);
      } else {
        pending_.push(request);
      }
    } else {
      space_ready_.wait(lock, [this] { return !pending_.full(); });
      pending_.push(request);
    }
  }
  work_ready_.notify_one();
  return Status::ok();
}

bool PsyncEngine::has_claimable_work() const {
  return (current_ != nullptr && !current_->all_issued) || !pending_.empty();
}

void PsyncEngine::worker_loop() {
  tls_worker_of = this;
  std::unique_lock lock(mutex_);
  for (;;) {
    work_ready_.wait(lock, [this] { return stopping_ || has_claimable_work(); });
    if (!has_claimable_work()) {
      STRATA_ASSERT(stopping_);
      return;  // Blocks still in flight belong to other workers, which complete them.
    }

    if (current_ == nullptr) {
      STRATA_ASSERT(!free_slots_.empty());
      const uint32_t slot = free_slots_.back();
      free_slots_.pop_back();
      current_ = &active_[slot];
      *current_ = Active{};
      current_->request = pending_.pop();
      space_ready_.notify_one();
    }

    // Claim the next block of the oldest request.
    Active* active = current_;
    IoRequest* request = active->request;
    BlockCursor block;
    block.op = request->op;
    block.file = request->file;
    block.buffer = static_cast<char*>(request->buffer) + active->next;
    block.offset = request->offset + active->next;
    block.remaining = std::min<uint64_t>(options_.block_size, request->length - active->next);
    active->next += block.remaining;
    active->in_flight++;
    if (active->next == request->length) {
      active->all_issued = true;
      current_ = nullptr;
    }
    if (has_claimable_work()) {
      work_ready_.notify_one();
    }

    lock.unlock();
    uint64_t moved = 0;
    const int error = transfer_block(block, &moved);
    lock.lock();

    active->in_flight--;
    active->moved += moved;
    if (error != 0 && active->error == 0) {
      active->error = error;
      // Stop handing out this request's blocks; the ones in flight drain first.
      active->all_issued = true;
      if (current_ == active) {
        current_ = nullptr;
      }
    }
    if (active->all_issued && active->in_flight == 0) {
      request->error = active->error;
      request->transferred = active->moved;
      free_slots_.push_back(static_cast<uint32_t>(active - active_.data()));
      lock.unlock();
      request->on_complete(request, request->context);
      lock.lock();
    }
  }
}

int PsyncEngine::transfer_block(BlockCursor& block, uint64_t* moved) {
  const int fd = registry_.fd(block.file);
  for (;;) {
    int result = 0;
    if (hook_ != nullptr) {
      result = hook_->before_transfer(block.attempt());
    }
    if (result == 0) {
      const ssize_t n =
          block.op == IoOp::kRead
              ? ::pread(fd, block.buffer, block.remaining, static_cast<off_t>(block.offset))
              : ::pwrite(fd, block.buffer, block.remaining, static_cast<off_t>(block.offset));
      // remaining <= block_size <= 1 GiB, so the count fits an int.
      result = n < 0 ? -errno : static_cast<int>(n);
      if (hook_ != nullptr) {
        result = hook_->after_transfer(block.attempt(), result);
      }
    }
    int error = 0;
    switch (advance_block(block, result, moved, &error)) {
      case BlockStep::kFinished:
        return 0;
      case BlockStep::kFailed:
        return error;
      case BlockStep::kResubmit:
        if (result < 0) {
          std::this_thread::yield();  // EAGAIN: give the device a moment
        }
        break;
    }
  }
}

}  // namespace strata::io
