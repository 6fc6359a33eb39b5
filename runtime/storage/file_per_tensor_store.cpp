#include "storage/file_per_tensor_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "common/align.h"
#include "common/assert.h"
#include "common/units.h"
#include "storage/backing_device.h"

namespace strata::storage {

namespace {

constexpr uint32_t kMaxThreads = 64;

// pread/pwrite [offset, offset + bytes) of the file, resubmitting short transfers and
// interrupted calls.
Status transfer_all(int fd, void* buffer, uint64_t offset, uint64_t bytes, bool write,
                    const std::string& path) {
  uint64_t done = 0;
  while (done < bytes) {
    auto* at = static_cast<unsigned char*>(buffer) + done;
    const auto where = static_cast<off_t>(offset + done);
    const ssize_t n =
        write ? ::pwrite(fd, at, bytes - done, where) : ::pread(fd, at, bytes - done, where);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      return errno_status(err == ENOSPC ? STRATA_E_NOSPACE : STRATA_E_IO,
                          std::string(write ? "writing " : "reading ") + path, err);
    }
    if (n == 0) {
      return Status::error(STRATA_E_CORRUPT, path + " ends at byte " +
                                                 std::to_string(offset + done) + " of " +
                                                 std::to_string(offset + bytes));
    }
    done += static_cast<uint64_t>(n);
  }
  return Status::ok();
}

Status check_request(const ExtentIo* io, const void* buffer, uint64_t alignment, const char* what) {
  if (io == nullptr || io->on_complete == nullptr) {
    return invalid_argument(std::string(what) + ": no completion");
  }
  if (buffer == nullptr || reinterpret_cast<uintptr_t>(buffer) % alignment != 0) {
    return invalid_argument(std::string(what) + ": the buffer must be aligned to " +
                            std::to_string(alignment) + " bytes");
  }
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<FilePerTensorStore>> FilePerTensorStore::open(
    const FilePerTensorOptions& options) {
  if (options.dir.empty()) return invalid_argument("file-per-tensor NVMe tier: no directory");
  if (options.threads == 0 || options.threads > kMaxThreads) {
    return invalid_argument("file-per-tensor NVMe tier: threads is " +
                            std::to_string(options.threads) + ", allowed 1.." +
                            std::to_string(kMaxThreads));
  }
  UniqueFd parent(::open(options.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!parent.valid()) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return errno_status(STRATA_E_INVALID, "NVMe directory " + options.dir + " (it must exist)",
                          err);
    }
    return errno_status(STRATA_E_IO, "opening NVMe directory " + options.dir, err);
  }
  STRATA_ASSIGN_OR_RETURN(auto free, free_bytes_of(parent.get(), options.dir));
  const uint64_t free_bytes = free;
  const uint64_t capacity = options.capacity_bytes != 0
                                ? align_down(options.capacity_bytes, kAlignment)
                                : default_swap_capacity(free_bytes, kAlignment);
  if (capacity == 0) {
    return Status::error(STRATA_E_NOSPACE, "file-per-tensor NVMe tier: no room on " + options.dir +
                                               " (free " + format_bytes(free_bytes) + ")");
  }
  if (capacity > free_bytes) {
    return Status::error(STRATA_E_NOSPACE, "file-per-tensor NVMe tier: asked " +
                                               format_bytes(capacity) + ", free " +
                                               format_bytes(free_bytes) + " on " + options.dir +
                                               "; lower nvme_capacity_bytes or free space there");
  }

  (void)remove_orphans(parent.get());
  // A private subdirectory: mkdirat fails on any existing name, links included, and the
  // descriptor opened with O_NOFOLLOW pins the directory that was made.
  for (int attempt = 0;; ++attempt) {
    const std::string name = generated_name(".tensors");
    if (::mkdirat(parent.get(), name.c_str(), 0700) != 0) {
      const int err = errno;
      if (err == EEXIST && attempt + 1 < kGeneratedNameAttempts) continue;
      return errno_status(err == ENOSPC ? STRATA_E_NOSPACE : STRATA_E_IO,
                          "creating " + options.dir + "/" + name, err);
    }
    UniqueFd dir(
        ::openat(parent.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dir.valid()) {
      const int err = errno;
      ::unlinkat(parent.get(), name.c_str(), AT_REMOVEDIR);
      return errno_status(STRATA_E_IO, "opening " + options.dir + "/" + name, err);
    }
    const std::string path = options.dir + (options.dir.back() == '/' ? "" : "/") + name;
    InterruptCleanup on_signal =
        InterruptCleanup::arm(parent.get(), name, InterruptCleanup::What::kDirectory);
    if (Status locked = lock_as_owner(dir.get(), path); !locked) {
      on_signal.disarm();
      ::unlinkat(parent.get(), name.c_str(), AT_REMOVEDIR);
      return locked;
    }
    std::unique_ptr<FilePerTensorStore> store(
        new FilePerTensorStore(std::move(dir), path, capacity, options));
    store->parent_fd_ = std::move(parent);
    store->on_signal_ = std::move(on_signal);
    // Whether this file system takes O_DIRECT, found once on a probe file. A refused
    // open(O_CREAT|O_DIRECT) may have created the file anyway: it goes before anything else.
    const int probe = ::openat(store->dir_fd_.get(), "probe",
                               O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_DIRECT, 0600);
    const int probe_errno = errno;
    if (probe >= 0) ::close(probe);
    ::unlinkat(store->dir_fd_.get(), "probe", 0);
    if (probe < 0 && probe_errno == EINVAL && options.allow_buffered) {
      store->direct_io_ = false;
    } else if (probe < 0 && probe_errno == EINVAL) {
      (void)store->close();
      return unsupported("the file system of " + options.dir +
                         " refuses O_DIRECT (tmpfs or a FUSE mount?); put the NVMe tier on a "
                         "local file system");
    } else if (probe < 0) {
      (void)store->close();
      return errno_status(STRATA_E_IO, "creating a file in " + path, probe_errno);
    }
    return store;
  }
}

FilePerTensorStore::FilePerTensorStore(UniqueFd dir_fd, std::string path, uint64_t capacity,
                                       const FilePerTensorOptions& options)
    : dir_fd_(std::move(dir_fd)), path_(std::move(path)), capacity_(capacity), options_(options) {
  threads_.reserve(options.threads);
  for (uint32_t i = 0; i < options.threads; ++i) {
    threads_.emplace_back([this] { io_thread_main(); });
  }
}

FilePerTensorStore::~FilePerTensorStore() {
  (void)close();
}

Status FilePerTensorStore::close() {
  {
    std::unique_lock lock(mutex_);
    if (closed_) return Status::ok();
    idle_.wait(lock, [&] { return in_flight_ == 0; });
    stopping_ = true;
    closed_ = true;
  }
  work_.notify_all();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  on_signal_.disarm();
  if (options_.keep) {
    // Renamed out of the owner-stamped pattern: once this process is gone, a kept directory must
    // not be taken for an orphan.
    if (::rename(path_.c_str(), (path_ + ".kept").c_str()) != 0) {
      return errno_status(STRATA_E_IO, "renaming the kept directory " + path_, errno);
    }
    return Status::ok();
  }
  Status status = Status::ok();
  for (const auto& [id, record] : records_) {
    if (record.has_file && ::unlinkat(dir_fd_.get(), file_name(id).c_str(), 0) != 0 &&
        errno != ENOENT && status.is_ok()) {
      status = errno_status(STRATA_E_IO, "removing " + path_ + "/" + file_name(id), errno);
    }
  }
  records_.clear();
  // The directory goes through its parent's path; it is empty unless someone put files there.
  if (::rmdir(path_.c_str()) != 0 && status.is_ok()) {
    status = errno_status(STRATA_E_IO, "removing " + path_, errno);
  }
  return status;
}

std::string FilePerTensorStore::file_name(uint64_t id) {
  return std::to_string(id) + ".swp";
}

std::string FilePerTensorStore::file_path(const Extent& extent) const {
  return path_ + "/" + file_name(extent.id);
}

Result<Extent> FilePerTensorStore::allocate(uint64_t bytes) {
  if (bytes == 0) return invalid_argument("allocate: 0 bytes");
  if (bytes > capacity_) {
    return Status::error(STRATA_E_NOSPACE, "file-per-tensor NVMe tier: " + format_bytes(bytes) +
                                               " is more than its capacity " +
                                               format_bytes(capacity_) +
                                               "; raise nvme_capacity_bytes");
  }
  const uint64_t padded = align_up(bytes, kAlignment);
  // Block records before the lock: allocation stays off the paths that hold it.
  STRATA_ASSIGN_OR_RETURN(auto content,
                          ExtentContent::create(padded, kBlockBytes, /*checksums=*/false),
                          "allocating " + std::to_string(bytes) + " bytes");
  std::lock_guard lock(mutex_);
  if (closed_) return Status::error(STRATA_E_STATE, "the NVMe tier is closed");
  if (padded > capacity_ - used_) {
    return Status::error(STRATA_E_NOSPACE,
                         "file-per-tensor NVMe tier full: " + format_bytes(padded) + " asked, " +
                             format_bytes(capacity_ - used_) + " free of " +
                             format_bytes(capacity_) + "; raise nvme_capacity_bytes");
  }
  const uint64_t id = next_id_++;
  records_.emplace(id, Record{padded, std::move(content)});
  used_ += padded;
  return Extent{id, 0, padded};
}

Result<FilePerTensorStore::Record*> FilePerTensorStore::find_locked(const Extent& extent) {
  if (closed_) return Status::error(STRATA_E_STATE, "the NVMe tier is closed");
  auto it = records_.find(extent.id);
  if (it == records_.end() || it->second.capacity != extent.capacity) {
    return Status::error(STRATA_E_STATE,
                         "extent " + std::to_string(extent.id) + " is unknown or was freed");
  }
  return &it->second;
}

Status FilePerTensorStore::free(const Extent& extent) {
  std::lock_guard lock(mutex_);
  STRATA_ASSIGN_OR_RETURN(auto record, find_locked(extent));
  if ((record)->content.io_in_flight()) {
    return Status::error(STRATA_E_STATE,
                         "extent " + std::to_string(extent.id) + " has I/O in flight");
  }
  Status status = Status::ok();
  if ((record)->has_file && ::unlinkat(dir_fd_.get(), file_name(extent.id).c_str(), 0) != 0 &&
      errno != ENOENT) {
    status = errno_status(STRATA_E_IO, "removing " + file_path(extent), errno);
  }
  used_ -= (record)->capacity;
  records_.erase(extent.id);
  return status;
}

Status FilePerTensorStore::write_async(const Extent& extent, const void* buffer, uint64_t bytes,
                                       ExtentIo* io, int32_t /*buffer_index*/) {
  STRATA_TRY(check_request(io, buffer, kAlignment, "write"));
  if (bytes == 0 || bytes > extent.capacity) {
    return invalid_argument("write of " + std::to_string(bytes) + " bytes to an extent of " +
                            std::to_string(extent.capacity));
  }
  return submit_write(extent, 0, buffer, bytes, bytes, io, /*whole=*/true);
}

Status FilePerTensorStore::write_range_async(const Extent& extent, uint64_t offset,
                                             const void* buffer, uint64_t bytes,
                                             uint64_t content_bytes, ExtentIo* io,
                                             int32_t /*buffer_index*/) {
  STRATA_TRY(check_request(io, buffer, kAlignment, "write"));
  return submit_write(extent, offset, buffer, bytes, content_bytes, io, /*whole=*/false);
}

Status FilePerTensorStore::submit_write(const Extent& extent, uint64_t offset, const void* buffer,
                                        uint64_t bytes, uint64_t content_bytes, ExtentIo* io,
                                        bool whole) {
  std::lock_guard lock(mutex_);
  STRATA_ASSIGN_OR_RETURN(auto record, find_locked(extent));
  STRATA_TRY(record->content.check_write(extent, offset, bytes, content_bytes, whole));
  Request request{io, const_cast<void*>(buffer), align_up(bytes, kAlignment), /*write=*/true};
  request.create = !record->has_file;
  request.after_create = record->creating;
  record->has_file = true;
  record->creating = record->creating || request.create;
  record->content.start(io, extent, offset, bytes, content_bytes, /*write=*/true, whole);
  enqueue_locked(request);
  return Status::ok();
}

Status FilePerTensorStore::read_async(const Extent& extent, void* buffer, uint64_t buffer_bytes,
                                      ExtentIo* io, int32_t /*buffer_index*/) {
  STRATA_TRY(check_request(io, buffer, kAlignment, "read"));
  return submit_read(extent, 0, buffer, 0, buffer_bytes, io, /*whole=*/true);
}

Status FilePerTensorStore::read_range_async(const Extent& extent, uint64_t offset, void* buffer,
                                            uint64_t bytes, ExtentIo* io,
                                            int32_t /*buffer_index*/) {
  STRATA_TRY(check_request(io, buffer, kAlignment, "read"));
  return submit_read(extent, offset, buffer, bytes, align_up(bytes, kAlignment), io,
                     /*whole=*/false);
}

Status FilePerTensorStore::submit_read(const Extent& extent, uint64_t offset, void* buffer,
                                       uint64_t bytes, uint64_t buffer_bytes, ExtentIo* io,
                                       bool whole) {
  std::lock_guard lock(mutex_);
  STRATA_ASSIGN_OR_RETURN(auto record, find_locked(extent));
  if (whole) bytes = record->content.length();
  STRATA_TRY(record->content.check_read(extent, offset, bytes, whole));
  const uint64_t transfer = align_up(bytes, kAlignment);
  if (buffer_bytes < transfer) {
    return invalid_argument("read: the buffer holds " + std::to_string(buffer_bytes) +
                            " bytes, the content needs " + std::to_string(transfer));
  }
  record->content.start(io, extent, offset, bytes, 0, /*write=*/false, whole);
  enqueue_locked(Request{io, buffer, transfer, /*write=*/false});
  return Status::ok();
}

void FilePerTensorStore::enqueue_locked(const Request& request) {
  request.io->store = this;
  queue_.push_back(request);
  ++in_flight_;
  work_.notify_one();
}

void FilePerTensorStore::io_thread_main() {
  for (;;) {
    Request next;
    {
      std::unique_lock lock(mutex_);
      work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and close() waited for every request
      next = queue_.front();
      queue_.pop_front();
    }
    finish(next, transfer(next));
  }
}

// What DeepSpeed's swapper does per request: open the tensor's file, fstat it, transfer, close.
Status FilePerTensorStore::transfer(const Request& request) {
  const uint64_t id = request.io->extent_id;
  const std::string name = file_name(id);
  if (request.after_create) {
    // The creating write was queued first, so another thread has taken it already.
    std::unique_lock lock(mutex_);
    file_created_.wait(lock, [&] { return !records_.at(id).creating; });
  }
  int flags = O_RDWR | O_NOFOLLOW | O_CLOEXEC | (direct_io_ ? O_DIRECT : 0);
  if (request.create) flags |= O_CREAT | O_EXCL;
  UniqueFd fd(::openat(dir_fd_.get(), name.c_str(), flags, 0600));
  if (request.create) {
    {
      std::lock_guard lock(mutex_);
      records_.at(id).creating = false;
    }
    file_created_.notify_all();
  }
  if (!fd.valid()) {
    const int err = errno;
    return errno_status(err == ENOSPC ? STRATA_E_NOSPACE : STRATA_E_IO,
                        "opening " + path_ + "/" + name, err);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return errno_status(STRATA_E_IO, "fstat of " + path_ + "/" + name, errno);
  }
  const uint64_t end = request.io->offset + request.transfer;
  if (!request.write && static_cast<uint64_t>(st.st_size) < end) {
    return Status::error(STRATA_E_CORRUPT, path_ + "/" + name + " holds " +
                                               std::to_string(st.st_size) + " bytes, " +
                                               std::to_string(end) + " expected");
  }
  return transfer_all(fd.get(), request.buffer, request.io->offset, request.transfer, request.write,
                      path_ + "/" + name);
}

void FilePerTensorStore::finish(const Request& request, Status status) {
  ExtentIo* io = request.io;
  const uint64_t id = io->extent_id;
  {
    std::lock_guard lock(mutex_);
    auto it = records_.find(id);
    STRATA_ASSERT(it != records_.end());  // free() refuses extents with I/O in flight
    Record& record = it->second;
    record.content.finish(io, status.is_ok());
    if (request.write && status.is_ok()) {
      ++stats_.writes;
      stats_.bytes_written += io->bytes;
    } else if (request.write) {
      ++stats_.write_errors;
      // A first write that could not create the file: the next one must create it.
      if (request.create &&
          ::faccessat(dir_fd_.get(), file_name(id).c_str(), F_OK, AT_SYMLINK_NOFOLLOW) != 0) {
        record.has_file = false;
      }
    } else if (status.is_ok()) {
      ++stats_.reads;
      stats_.bytes_read += io->bytes;
    } else {
      ++stats_.read_errors;
    }
  }
  io->status = std::move(status);
  if (!io->status.is_ok()) io->bytes = 0;
  io->on_complete(io, io->context);
  {
    std::lock_guard lock(mutex_);
    if (--in_flight_ == 0) idle_.notify_all();
  }
}

ExtentStoreStats FilePerTensorStore::stats() const {
  std::lock_guard lock(mutex_);
  ExtentStoreStats s = stats_;
  s.extents = records_.size();
  s.space.capacity = capacity_;
  s.space.used_bytes = used_;
  s.space.free_bytes = capacity_ - used_;
  s.space.largest_free = capacity_ - used_;
  s.space.free_extents = 1;
  s.space.allocated_extents = records_.size();
  return s;
}

}  // namespace strata::storage
