#include "io/uring_engine.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string>

#include "common/assert.h"
#include "io/io_limits.h"

namespace strata::io {

namespace {

// Set on the I/O thread, so that calls made from an on_complete callback run inline instead of
// waiting for the thread that is making the callback.
thread_local const UringEngine* tls_io_thread_of = nullptr;

// user_data of the armed eventfd read; block completions carry their block slot index.
constexpr uint64_t kWakeTag = std::numeric_limits<uint64_t>::max();

Status setup_error(int errno_value) {
  switch (errno_value) {
    case ENOMEM:
      return errno_status(STRATA_E_LIMIT,
                          "io_uring_queue_init (locked memory: raise RLIMIT_MEMLOCK)", errno_value);
    case ENOSYS:
    case EPERM:
    case EACCES:
      return errno_status(STRATA_E_UNSUPPORTED,
                          "io_uring_queue_init (io_uring disabled by kernel, sysctl or seccomp)",
                          errno_value);
    default:
      return errno_status(STRATA_E_UNSUPPORTED, "io_uring_queue_init", errno_value);
  }
}

Status register_error(const char* what, int errno_value) {
  switch (errno_value) {
    case ENOMEM:
      return errno_status(STRATA_E_LIMIT,
                          std::string(what) + " (locked memory: raise RLIMIT_MEMLOCK)",
                          errno_value);
    case EFAULT:
    case EINVAL:
    case EBADF:
      return errno_status(STRATA_E_INVALID, what, errno_value);
    case EOPNOTSUPP:
      return errno_status(STRATA_E_UNSUPPORTED,
                          std::string(what) + " (file-backed memory cannot be registered)",
                          errno_value);
    default:
      return errno_status(STRATA_E_IO, what, errno_value);
  }
}

}  // namespace

Result<std::unique_ptr<UringEngine>> UringEngine::create(const IoEngineOptions& options) {
  STRATA_TRY(validate_options(options));
  std::unique_ptr<UringEngine> engine(new UringEngine(options));
  if (!engine->wake_fd_.valid()) {
    return errno_status(STRATA_E_LIMIT, "eventfd for the io_uring engine", errno);
  }
  engine->thread_ = std::thread([e = engine.get()] { e->io_thread_main(); });
  std::unique_lock lock(engine->mutex_);
  engine->command_done_.wait(lock, [&] { return engine->setup_done_; });
  if (!engine->setup_status_) {
    Status status = std::move(engine->setup_status_);
    lock.unlock();
    return status;  // The destructor joins the thread, which has already returned.
  }
  return engine;
}

UringEngine::UringEngine(const IoEngineOptions& options)
    : options_(options),
      wake_fd_(::eventfd(0, EFD_CLOEXEC)),
      submit_each_block_(options.block_size >= kSubmitEachBlockBytes),
      blocks_(options.queue_depth),
      active_(options.queue_depth + 1),
      ready_(options.queue_depth),
      pending_(options.queue_depth) {
  free_blocks_.reserve(blocks_.size());
  for (uint32_t i = blocks_.size(); i-- > 0;) {
    free_blocks_.push_back(i);
  }
  free_active_.reserve(active_.size());
  for (uint32_t i = active_.size(); i-- > 0;) {
    free_active_.push_back(i);
  }
  commands_.reserve(8);
  running_commands_.reserve(8);
}

UringEngine::~UringEngine() {
  bool wake = false;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    wake = std::exchange(waiting_, false);
  }
  if (wake) {
    wake_io_thread();
  }
  if (thread_.joinable()) {
    thread_.join();
  }
}

void UringEngine::io_thread_main() {
  tls_io_thread_of = this;
  Status status = setup_ring();
  const bool ok = status.is_ok();
  {
    std::lock_guard lock(mutex_);
    setup_status_ = std::move(status);
    setup_done_ = true;
  }
  command_done_.notify_all();
  if (!ok) {
    return;
  }
  run_loop();
  STRATA_ASSERT(sqes_in_kernel_ == 0 && current_ == nullptr && ready_.empty());
  io_uring_queue_exit(&ring_);
}

Status UringEngine::setup_ring() {
  // Best first: SINGLE_ISSUER|DEFER_TASKRUN (6.1) runs completion work only when this thread
  // waits; COOP_TASKRUN (5.19) at least avoids interrupting it; plain rings work from 5.6.
  struct FlagSet {
    unsigned flags;
    const char* label;
  };
  static constexpr FlagSet kFlagSets[] = {
      {IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN, "single_issuer+defer_taskrun"},
      {IORING_SETUP_COOP_TASKRUN, "coop_taskrun"},
      {0, "no taskrun flags"},
  };
  // One SQE per block slot plus the eventfd read; the kernel rounds up to a power of two and
  // makes the completion ring twice as large, so completions never overflow.
  const unsigned entries = options_.queue_depth + 1;
  const char* label = nullptr;
  int rc = -EINVAL;
  for (const FlagSet& set : kFlagSets) {
    io_uring_params params{};
    params.flags = set.flags;
    rc = io_uring_queue_init_params(entries, &ring_, &params);
    if (rc == 0) {
      label = set.label;
      break;
    }
    if (rc != -EINVAL) {
      break;  // EINVAL = flags unknown to this kernel: try the next set
    }
  }
  if (rc < 0) {
    return setup_error(-rc);
  }

  // Saves an fdget/fdput per io_uring_enter; harmless to lack.
  (void)io_uring_register_ring_fd(&ring_);
  fixed_files_ = io_uring_register_files_sparse(&ring_, kMaxFiles) == 0;
  fixed_buffers_ = io_uring_register_buffers_sparse(&ring_, kMaxBuffers) == 0;
  arm_wakeup();
  const int submitted = io_uring_submit(&ring_);
  if (submitted < 0) {
    io_uring_queue_exit(&ring_);
    return errno_status(STRATA_E_UNSUPPORTED, "io_uring_submit of the wakeup read", -submitted);
  }
  name_ = std::string("io_uring (") + label + (fixed_files_ ? ", fixed files" : "") +
          (fixed_buffers_ ? ", fixed buffers" : ", no fixed buffers") + ")";
  return Status::ok();
}

void UringEngine::arm_wakeup() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  STRATA_ASSERT(sqe != nullptr);  // the ring has one entry beyond queue_depth for this read
  io_uring_prep_read(sqe, wake_fd_.get(), &wake_value_, sizeof wake_value_, 0);
  io_uring_sqe_set_data64(sqe, kWakeTag);
}

void UringEngine::wake_io_thread() {
  const uint64_t one = 1;
  ssize_t n;
  do {
    n = ::write(wake_fd_.get(), &one, sizeof one);
  } while (n < 0 && errno == EINTR);
  // An eventfd write only fails when the counter would overflow 2^64 - 2: impossible here.
  STRATA_ASSERT(n == sizeof one);
}

void UringEngine::run_loop() {
  for (;;) {
    bool stop = false;
    {
      std::lock_guard lock(mutex_);
      running_commands_.swap(commands_);
      bool took = false;
      while (!ready_.full()) {
        IoRequest* request = pending_.pop();
        if (request == nullptr) {
          break;
        }
        ready_.push(request);
        took = true;
      }
      if (took) {
        space_ready_.notify_all();
      }
      stop = stopping_ && pending_.empty() && running_commands_.empty() && ready_.empty() &&
             current_ == nullptr && sqes_in_kernel_ == 0;
    }
    if (!running_commands_.empty()) {
      for (Command* command : running_commands_) {
        execute(*command);
      }
      {
        std::lock_guard lock(mutex_);
        for (Command* command : running_commands_) {
          command->done = true;
        }
      }
      running_commands_.clear();
      command_done_.notify_all();
    }
    if (stop) {
      return;
    }

    issue_blocks();

    // Sleep in the kernel only when there is nothing else to do; and ask for an eventfd write
    // only when a new request could actually be issued (a free block slot). With every slot
    // busy, the next completion wakes the thread anyway, so saturated submitters skip the write.
    bool block = false;
    if (io_uring_cq_ready(&ring_) == 0) {
      std::lock_guard lock(mutex_);
      const bool can_issue = !free_blocks_.empty();
      const bool idle = sqes_in_kernel_ == 0 && current_ == nullptr && ready_.empty();
      block = commands_.empty() && !(can_issue && !pending_.empty()) && !(stopping_ && idle);
      if (block && can_issue) {
        waiting_ = true;
      }
      STRATA_ASSERT(!block || waiting_ || sqes_in_kernel_ > 0);
    }
    const int rc =
        block ? io_uring_submit_and_wait(&ring_, 1) : io_uring_submit_and_get_events(&ring_);
    // EINTR: a signal; EAGAIN / EBUSY: the kernel is short of resources or completions are
    // pending; all three clear up by reaping and trying again.
    STRATA_ASSERT(rc >= 0 || rc == -EINTR || rc == -EAGAIN || rc == -EBUSY || rc == -ETIME);
    if (block) {
      std::lock_guard lock(mutex_);
      waiting_ = false;
    }

    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&ring_, &cqe) == 0) {
      const uint64_t tag = io_uring_cqe_get_data64(cqe);
      const int result = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);  // before callbacks, which may run for a while
      on_cqe(tag, result);
    }
  }
}

void UringEngine::on_cqe(uint64_t tag, int result) {
  if (tag == kWakeTag) {
    // The eventfd read completed (a caller wrote it); re-arm it for the next sleep.
    STRATA_ASSERT(result == sizeof wake_value_ || result == -EINTR || result == -EAGAIN ||
                  result == -ECANCELED);
    arm_wakeup();
    return;
  }
  STRATA_ASSERT(tag < blocks_.size() && sqes_in_kernel_ > 0);
  --sqes_in_kernel_;
  Block& block = blocks_[tag];
  if (hook_ != nullptr) {
    result = hook_->after_transfer(block.cursor.attempt(), result);
  }
  int error = 0;
  switch (advance_block(block.cursor, result, &active_[block.active].moved, &error)) {
    case BlockStep::kFinished:
      finish_block(static_cast<uint32_t>(tag), 0);
      break;
    case BlockStep::kResubmit:
      start_attempt(static_cast<uint32_t>(tag));
      break;
    case BlockStep::kFailed:
      finish_block(static_cast<uint32_t>(tag), error);
      break;
  }
}

void UringEngine::issue_blocks() {
  while (!free_blocks_.empty()) {
    if (current_ == nullptr) {
      IoRequest* request = ready_.pop();
      if (request == nullptr) {
        return;
      }
      // Every active request but current_ has a block in flight, so a slot is free.
      STRATA_ASSERT(!free_active_.empty());
      current_ = &active_[free_active_.back()];
      free_active_.pop_back();
      *current_ = Active{};
      current_->request = request;
    }
    Active& active = *current_;
    IoRequest* request = active.request;
    const uint32_t index = free_blocks_.back();
    free_blocks_.pop_back();
    Block& block = blocks_[index];
    block.cursor = BlockCursor{};
    block.cursor.op = request->op;
    block.cursor.file = request->file;
    block.cursor.buffer = static_cast<char*>(request->buffer) + active.next;
    block.cursor.offset = request->offset + active.next;
    block.cursor.remaining = std::min<uint64_t>(options_.block_size, request->length - active.next);
    block.active = static_cast<uint32_t>(&active - active_.data());
    block.buffer_index = request->buffer_index;
    active.next += block.cursor.remaining;
    active.in_flight++;
    if (active.next == request->length) {
      active.all_issued = true;
      current_ = nullptr;
    }
    start_attempt(index);
  }
}

void UringEngine::start_attempt(uint32_t index) {
  Block& block = blocks_[index];
  for (;;) {
    if (hook_ != nullptr) {
      const int injected = hook_->before_transfer(block.cursor.attempt());
      STRATA_ASSERT(injected <= 0);
      if (injected < 0) {
        // Handled as if the kernel had completed the attempt with that error.
        int error = 0;
        const BlockStep step =
            advance_block(block.cursor, injected, &active_[block.active].moved, &error);
        if (step == BlockStep::kResubmit) {
          continue;
        }
        finish_block(index, error);
        return;
      }
    }
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    STRATA_ASSERT(sqe != nullptr);  // at most one SQE per block slot, and the ring has that many
    const BlockCursor& c = block.cursor;
    const int fd = fixed_files_ ? static_cast<int>(c.file) : registry_.fd(c.file);
    const auto length = static_cast<unsigned>(c.remaining);  // <= block_size <= 1 GiB
    if (fixed_buffers_ && block.buffer_index >= 0) {
      if (c.op == IoOp::kRead) {
        io_uring_prep_read_fixed(sqe, fd, c.buffer, length, c.offset, block.buffer_index);
      } else {
        io_uring_prep_write_fixed(sqe, fd, c.buffer, length, c.offset, block.buffer_index);
      }
    } else if (c.op == IoOp::kRead) {
      io_uring_prep_read(sqe, fd, c.buffer, length, c.offset);
    } else {
      io_uring_prep_write(sqe, fd, c.buffer, length, c.offset);
    }
    if (fixed_files_) {
      sqe->flags |= IOSQE_FIXED_FILE;
    }
    io_uring_sqe_set_data64(sqe, index);
    ++sqes_in_kernel_;
    // Large blocks go to the kernel one per io_uring_enter. Submitted together, the block plug
    // merges adjacent ones into requests larger than block_size (measured: 2-3 MB writes from
    // 1 MiB blocks), leaving fewer, bigger requests in the device's queue and ~5% less write
    // throughput; the split that often follows (NVMe MDTS) only adds work. At these sizes a
    // syscall per block costs well under 1% of a core. Small blocks stay batched, where the
    // syscalls would dominate and merging is what the plug is for.
    if (submit_each_block_) {
      const int rc = io_uring_submit(&ring_);
      // On EAGAIN / EBUSY the SQE stays queued and the loop's next submit takes it.
      STRATA_ASSERT(rc >= 0 || rc == -EAGAIN || rc == -EBUSY || rc == -EINTR);
    }
    return;
  }
}

void UringEngine::finish_block(uint32_t index, int error) {
  Active& active = active_[blocks_[index].active];
  free_blocks_.push_back(index);
  STRATA_ASSERT(active.in_flight > 0);
  active.in_flight--;
  if (error != 0 && active.error == 0) {
    active.error = error;
    // Issue no more of this request; the blocks already in the kernel drain first.
    active.all_issued = true;
    if (current_ == &active) {
      current_ = nullptr;
    }
  }
  if (active.all_issued && active.in_flight == 0) {
    IoRequest* request = active.request;
    request->error = active.error;
    request->transferred = active.moved;
    free_active_.push_back(static_cast<uint32_t>(&active - active_.data()));
    request->on_complete(request, request->context);
  }
}

Status UringEngine::submit(IoRequest* request) {
  if (request == nullptr) {
    return invalid_argument("submit: null request");
  }
  STRATA_TRY(registry_.validate(*request));
  request->error = 0;
  request->transferred = 0;
  bool wake = false;
  {
    std::unique_lock lock(mutex_);
    if (tls_io_thread_of == this) {
      if (pending_.full()) {
        pending_.push_overflow(request);
      } else {
        pending_.push(request);
      }
    } else {
      space_ready_.wait(lock, [this] { return !pending_.full(); });
      pending_.push(request);
    }
    wake = std::exchange(waiting_, false);
  }
  if (wake) {
    wake_io_thread();
  }
  return Status::ok();
}

Status UringEngine::run_command(Command& command) {
  if (tls_io_thread_of == this) {
    execute(command);
  } else {
    bool wake = false;
    {
      std::lock_guard lock(mutex_);
      commands_.push_back(&command);
      wake = std::exchange(waiting_, false);
    }
    if (wake) {
      wake_io_thread();
    }
    std::unique_lock lock(mutex_);
    command_done_.wait(lock, [&] { return command.done; });
  }
  if (command.result == 0) {
    return Status::ok();
  }
  switch (command.kind) {
    case Command::Kind::kFile:
      return register_error("io_uring_register_files_update", -command.result);
    case Command::Kind::kSetBuffer:
      return register_error("io_uring_register_buffers_update_tag", -command.result);
    case Command::Kind::kClearBuffer:
      return register_error("io_uring_register_buffers_update_tag (clear)", -command.result);
  }
  return Status::error(STRATA_E_INTERNAL, "unknown io_uring command");
}

void UringEngine::execute(Command& command) {
  int rc = 0;
  switch (command.kind) {
    case Command::Kind::kFile:
      if (fixed_files_) {
        rc = io_uring_register_files_update(&ring_, command.index, &command.fd, 1);
      }
      break;
    case Command::Kind::kSetBuffer:
    case Command::Kind::kClearBuffer:
      if (fixed_buffers_) {
        // A null, empty iovec turns the slot back into a sparse (empty) entry.
        iovec iov{};
        if (command.kind == Command::Kind::kSetBuffer) {
          iov = {command.base, command.bytes};
        }
        const __u64 tag = 0;  // no completion when the kernel drops the old buffer
        rc = io_uring_register_buffers_update_tag(&ring_, command.index, &iov, &tag, 1);
      }
      break;
  }
  command.result = rc < 0 ? rc : 0;
}

Result<uint32_t> UringEngine::register_file(int fd) {
  auto index = registry_.reserve_file(fd);
  if (!index) {
    return index;
  }
  Command command{Command::Kind::kFile};
  command.index = *index;
  command.fd = fd;
  Status status = run_command(command);
  if (!status) {
    registry_.abandon_file(*index);
    return std::move(status).with_context("register_file(" + std::to_string(fd) + ")");
  }
  registry_.publish_file(*index, fd);
  return index;
}

Result<int32_t> UringEngine::register_buffer(void* base, uint64_t bytes) {
  auto index = registry_.reserve_buffer(base, bytes);
  if (!index) {
    return index;
  }
  Command command{Command::Kind::kSetBuffer};
  command.index = static_cast<uint32_t>(*index);
  command.base = base;
  command.bytes = bytes;
  Status status = run_command(command);
  if (!status) {
    registry_.abandon_buffer(*index);
    return std::move(status).with_context("register_buffer of " + std::to_string(bytes) + " bytes");
  }
  registry_.publish_buffer(*index);
  return index;
}

Status UringEngine::unregister_buffer(int32_t index) {
  auto range = registry_.begin_unregister_buffer(index);
  if (!range) {
    return std::move(range).take_status();
  }
  Command command{Command::Kind::kClearBuffer};
  command.index = static_cast<uint32_t>(index);
  Status status = run_command(command);
  // The slot is free either way: a later registration replaces whatever the kernel still holds.
  registry_.release_buffer(index);
  return status;
}

}  // namespace strata::io
