#include "finetune/deepspeed_aio.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/align.h"

namespace strata::bench::finetune {
namespace {

constexpr uint64_t kDirectAlignment = 4096;
constexpr uint32_t kMaxThreads = 64;
constexpr uint32_t kMaxQueueDepth = 4096;

uint64_t micros_since(std::chrono::steady_clock::time_point epoch) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::steady_clock::now() - epoch)
                                   .count());
}

}  // namespace

struct AioHandle::Request {
  uint64_t ticket = 0;
  std::string path;
  std::byte* buffer = nullptr;
  uint64_t bytes = 0;
  bool is_read = true;
  int fd = -1;
  uint32_t parts_left = 0;  // guarded by the handle's mutex
  Status status;            // the first failure of its parts, guarded likewise
  uint64_t begin_us = 0;
};

AioHandle::AioHandle(Options options, OnDone on_done)
    : options_(std::move(options)), on_done_(std::move(on_done)) {}

Result<std::unique_ptr<AioHandle>> AioHandle::create(const Options& options, OnDone on_done) {
  if (options.threads < 1 || options.threads > kMaxThreads) {
    return invalid_argument("aio intra_op_parallelism " + std::to_string(options.threads) +
                            " is outside 1.." + std::to_string(kMaxThreads));
  }
  if (options.queue_depth < 1 || options.queue_depth > kMaxQueueDepth) {
    return invalid_argument("aio queue_depth " + std::to_string(options.queue_depth) +
                            " is outside 1.." + std::to_string(kMaxQueueDepth));
  }
  if (options.block_bytes < kDirectAlignment || options.block_bytes % kDirectAlignment != 0) {
    return invalid_argument("aio block_size " + std::to_string(options.block_bytes) +
                            " is not a multiple of 4 KiB");
  }
  auto handle = std::unique_ptr<AioHandle>(new AioHandle(options, std::move(on_done)));
  for (uint32_t t = 0; t < options.threads; ++t) {
    auto worker = std::make_unique<Worker>();
    const int rc = io_setup(static_cast<int>(options.queue_depth), &worker->context);
    if (rc < 0) {
      for (auto& w : handle->workers_) io_destroy(w->context);
      handle->workers_.clear();
      return errno_status(STRATA_E_IO, "io_setup for the '" + options.name + "' aio handle", -rc);
    }
    handle->workers_.push_back(std::move(worker));
  }
  for (auto& w : handle->workers_) {
    Worker* raw = w.get();
    raw->thread = std::thread([h = handle.get(), raw] { h->run(*raw); });
  }
  return handle;
}

AioHandle::~AioHandle() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  work_.notify_all();
  for (auto& w : workers_) {
    if (w->thread.joinable()) w->thread.join();
    io_destroy(w->context);
  }
}

Result<uint64_t> AioHandle::read(const std::string& path, void* buffer, uint64_t bytes) {
  return submit(path, buffer, bytes, true);
}

Result<uint64_t> AioHandle::write(const std::string& path, const void* buffer, uint64_t bytes) {
  return submit(path, const_cast<void*>(buffer), bytes, false);
}

Result<uint64_t> AioHandle::submit(const std::string& path, void* buffer, uint64_t bytes,
                                   bool is_read) {
  if (bytes == 0 || bytes % kDirectAlignment != 0 ||
      reinterpret_cast<uintptr_t>(buffer) % kDirectAlignment != 0) {
    return invalid_argument("aio request for '" + path +
                            "': O_DIRECT needs a 4 KiB aligned buffer and size");
  }
  auto request = std::make_shared<Request>();
  request->path = path;
  request->buffer = static_cast<std::byte*>(buffer);
  request->bytes = bytes;
  request->is_read = is_read;
  request->begin_us = micros_since(options_.epoch);
  // deepspeed_py_io_handle.cpp:71-91 (reads: get_file_size, then open_file) and 112-128
  // (writes: open_file), on the submitting thread; the file is closed when the op completes
  // (line 188).
  if (is_read) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      return errno_status(STRATA_E_IO, "stat '" + path + "'", errno);
    }
    if (static_cast<uint64_t>(st.st_size) != bytes) {
      return Status::error(STRATA_E_CORRUPT, "'" + path + "' has " + std::to_string(st.st_size) +
                                                 " bytes, the request " + std::to_string(bytes));
    }
    request->fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  } else {
    request->fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  }
  if (request->fd < 0) return errno_status(STRATA_E_IO, "open '" + path + "'", errno);
  // intra_op_parallelism: the file in `threads` contiguous, block-aligned parts.
  const uint64_t threads = workers_.size();
  const uint64_t part = align_up((bytes + threads - 1) / threads, options_.block_bytes);
  std::vector<Part> parts;
  for (uint64_t begin = 0; begin < bytes; begin += part) {
    parts.push_back({request, begin, std::min(bytes, begin + part)});
  }
  uint64_t ticket = 0;
  {
    std::lock_guard lock(mutex_);
    ticket = next_ticket_++;
    request->ticket = ticket;
    request->parts_left = static_cast<uint32_t>(parts.size());
    for (size_t i = 0; i < parts.size(); ++i) workers_[i]->queue.push_back(std::move(parts[i]));
  }
  work_.notify_all();
  return ticket;
}

void AioHandle::run(Worker& worker) {
  for (;;) {
    Part part;
    {
      std::unique_lock lock(mutex_);
      work_.wait(lock, [&] { return stop_ || !worker.queue.empty(); });
      if (worker.queue.empty()) return;  // stopping, nothing left
      part = std::move(worker.queue.front());
      worker.queue.pop_front();
    }
    finish(part.request, transfer(worker, part));
  }
}

Status AioHandle::transfer(Worker& worker, const Part& part) {
  const Request& r = *part.request;
  const uint64_t blocks = (part.end - part.begin + options_.block_bytes - 1) / options_.block_bytes;
  std::vector<iocb> cbs(options_.queue_depth);
  std::vector<iocb*> free_cbs;
  free_cbs.reserve(cbs.size());
  for (iocb& cb : cbs) free_cbs.push_back(&cb);
  std::vector<io_event> events(options_.queue_depth);
  uint64_t next = 0, completed = 0;
  Status status;
  while (completed < blocks) {
    // Keep queue_depth blocks in flight (overlap_events), unless a block failed.
    while (status.is_ok() && next < blocks && !free_cbs.empty()) {
      iocb* cb = free_cbs.back();
      free_cbs.pop_back();
      const uint64_t offset = part.begin + next * options_.block_bytes;
      const uint64_t length = std::min<uint64_t>(options_.block_bytes, part.end - offset);
      if (r.is_read) {
        io_prep_pread(cb, r.fd, r.buffer + offset, length, static_cast<long long>(offset));
      } else {
        io_prep_pwrite(cb, r.fd, r.buffer + offset, length, static_cast<long long>(offset));
      }
      // libaio's per-request user word is a pointer; it carries the block's length back.
      // NOLINTNEXTLINE(performance-no-int-to-ptr)
      cb->data = reinterpret_cast<void*>(static_cast<uintptr_t>(length));
      const int rc = io_submit(worker.context, 1, &cb);
      if (rc != 1) {
        free_cbs.push_back(cb);
        status = errno_status(STRATA_E_IO, "io_submit for '" + r.path + "'", rc < 0 ? -rc : EIO);
        break;
      }
      ++next;
    }
    const uint64_t in_flight = next - completed;
    if (in_flight == 0) break;  // failed before submitting the rest
    const int n =
        io_getevents(worker.context, 1, static_cast<long>(in_flight), events.data(), nullptr);
    if (n < 0) {
      if (n == -EINTR) continue;
      return errno_status(STRATA_E_IO, "io_getevents for '" + r.path + "'", -n);
    }
    for (int i = 0; i < n; ++i) {
      const auto expected = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(events[i].data));
      const auto res = static_cast<int64_t>(events[i].res);
      if (status.is_ok() && (res < 0 || static_cast<uint64_t>(res) != expected)) {
        status = res < 0
                     ? errno_status(STRATA_E_IO, "aio on '" + r.path + "'", static_cast<int>(-res))
                     : Status::error(STRATA_E_IO, "short aio transfer on '" + r.path + "'");
      }
      free_cbs.push_back(events[i].obj);
      ++completed;
    }
  }
  return status;
}

void AioHandle::finish(const std::shared_ptr<Request>& request, const Status& status) {
  bool last = false;
  {
    std::lock_guard lock(mutex_);
    if (!status.is_ok() && request->status.is_ok()) request->status = status;
    last = --request->parts_left == 0;
  }
  if (!last) return;
  Status result = request->status;
  if (::close(request->fd) != 0 && result.is_ok()) {
    result = errno_status(STRATA_E_IO, "close '" + request->path + "'", errno);
  }
  if (on_done_) {
    on_done_(options_.name, request->is_read, request->path, request->begin_us,
             micros_since(options_.epoch), request->bytes);
  }
  {
    std::lock_guard lock(mutex_);
    if (!result.is_ok() && first_failure_.is_ok()) first_failure_ = result;
    (request->is_read ? read_bytes_ : written_bytes_) += request->bytes;
    done_tickets_.push_back(request->ticket);
    std::sort(done_tickets_.begin(), done_tickets_.end());
    size_t consumed = 0;
    while (consumed < done_tickets_.size() && done_tickets_[consumed] == completed_below_) {
      ++completed_below_;
      ++consumed;
    }
    done_tickets_.erase(done_tickets_.begin(),
                        done_tickets_.begin() + static_cast<std::ptrdiff_t>(consumed));
  }
  done_.notify_all();
}

Status AioHandle::wait(uint64_t ticket) {
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return completed_below_ > ticket; });
  Status failure = std::exchange(first_failure_, Status::ok());
  return failure;
}

Status AioHandle::wait_all() {
  uint64_t last = 0;
  {
    std::lock_guard lock(mutex_);
    last = next_ticket_ - 1;
  }
  return last == 0 ? Status::ok() : wait(last);
}

uint64_t AioHandle::bytes_read() const {
  std::lock_guard lock(mutex_);
  return read_bytes_;
}

uint64_t AioHandle::bytes_written() const {
  std::lock_guard lock(mutex_);
  return written_bytes_;
}

}  // namespace strata::bench::finetune
