#include "storage/extent_store.h"

#include <cinttypes>
#include <cstdio>
#include <latch>
#include <string>
#include <utility>

#include "common/align.h"
#include "common/assert.h"
#include "storage/checksum.h"

namespace strata::storage {

namespace {

std::string hex64(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof(text), "%016" PRIx64, value);
  return text;
}

std::string describe(uint64_t id, uint64_t offset) {
  return "extent #" + std::to_string(id) + " at offset " + std::to_string(offset);
}

}  // namespace

Result<std::unique_ptr<ExtentStore>> ExtentStore::open(BackingDevice device, io::IoEngine& engine,
                                                       const ExtentStoreOptions& options) {
  if (device.fd() < 0) return invalid_argument("extent store: the backing device is closed");
  STRATA_ASSIGN_OR_RETURN(
      auto allocator,
      ExtentAllocator::create(device.capacity(), device.alignment(), options.max_extents));
  auto file = engine.register_file(device.fd());
  if (!file) {
    return std::move(file).take_status().with_context("registering " + device.path() +
                                                      " with the " + engine.name() + " engine");
  }
  return std::unique_ptr<ExtentStore>(
      new ExtentStore(std::move(device), engine, *file, std::move(allocator), options));
}

ExtentStore::ExtentStore(BackingDevice device, io::IoEngine& engine, uint32_t file,
                         ExtentAllocator allocator, const ExtentStoreOptions& options)
    : device_(std::move(device)),
      engine_(engine),
      file_(file),
      options_(options),
      allocator_(std::move(allocator)) {}

ExtentStore::~ExtentStore() {
  (void)close();
}

Status ExtentStore::close() {
  {
    // Completions reference this object; the device must not close under a request either.
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [this] { return in_flight_ == 0; });
  }
  return device_.close();
}

Result<Extent> ExtentStore::allocate(uint64_t bytes) {
  std::lock_guard lock(mutex_);
  auto offset = allocator_.allocate(bytes);
  if (!offset) return std::move(offset).take_status();
  Extent extent{next_id_++, *offset, allocator_.reserved_length(bytes)};
  Record record;
  record.offset = extent.offset;
  record.capacity = extent.capacity;
  const bool inserted = records_.emplace(extent.id, record).second;
  STRATA_ASSERT(inserted);
  return extent;
}

Result<ExtentStore::Record*> ExtentStore::find_locked(const Extent& extent) {
  STRATA_ASSIGN_OR_RETURN(auto found, std::as_const(*this).find_locked(extent));
  return const_cast<Record*>(found);
}

Result<const ExtentStore::Record*> ExtentStore::find_locked(const Extent& extent) const {
  const auto it = records_.find(extent.id);
  if (it == records_.end()) {
    return Status::error(STRATA_E_STATE, describe(extent.id, extent.offset) +
                                             " is not allocated (freed already, or from another "
                                             "store)");
  }
  const Record& record = it->second;
  if (record.offset != extent.offset || record.capacity != extent.capacity) {
    return Status::error(STRATA_E_STATE, describe(extent.id, extent.offset) +
                                             ": the handle does not match the extent (offset " +
                                             std::to_string(record.offset) + ", capacity " +
                                             std::to_string(record.capacity) + ")");
  }
  return &record;
}

Status ExtentStore::free(const Extent& extent) {
  std::lock_guard lock(mutex_);
  STRATA_ASSIGN_OR_RETURN(auto found, find_locked(extent), "freeing");
  Record& record = *found;
  if (record.writing || record.readers > 0) {
    return Status::error(STRATA_E_STATE, "freeing " + describe(extent.id, extent.offset) +
                                             " while I/O on it is in flight");
  }
  // The table and the allocator agree on every live extent, so this cannot fail.
  const Status freed = allocator_.free(record.offset, record.capacity);
  STRATA_ASSERT(freed.is_ok());
  records_.erase(extent.id);
  return Status::ok();
}

Status ExtentStore::check_buffer(const void* buffer, const char* what) const {
  if (buffer == nullptr) return invalid_argument(std::string(what) + ": buffer is NULL");
  if (!is_aligned(buffer, device_.memory_alignment())) {
    return invalid_argument(std::string(what) + ": buffer is not aligned to " +
                            std::to_string(device_.memory_alignment()) +
                            " bytes, as direct I/O requires");
  }
  return Status::ok();
}

Status ExtentStore::write_async(const Extent& extent, const void* buffer, uint64_t bytes,
                                ExtentIo* io, int32_t buffer_index) {
  if (io == nullptr || io->on_complete == nullptr) {
    return invalid_argument("extent write: no completion callback");
  }
  STRATA_TRY(check_buffer(buffer, "extent write"));
  if (bytes == 0 || bytes > extent.capacity) {
    return invalid_argument("writing " + std::to_string(bytes) + " bytes to " +
                            describe(extent.id, extent.offset) + " of capacity " +
                            std::to_string(extent.capacity));
  }
  // Hashed before the write is issued and outside the lock: the caller may not touch the buffer
  // until completion anyway, and this keeps engine threads free for completions.
  const uint64_t hash = options_.verify_checksums ? checksum(buffer, bytes) : 0;
  {
    std::lock_guard lock(mutex_);
    STRATA_ASSIGN_OR_RETURN(auto found, find_locked(extent), "writing");
    Record& record = *found;
    if (record.writing || record.readers > 0) {
      return Status::error(STRATA_E_STATE, "writing " + describe(extent.id, extent.offset) +
                                               " while another I/O on it is in flight");
    }
    record.writing = true;
    ++in_flight_;
  }

  io->status = Status::ok();
  io->bytes = bytes;
  io->store = this;
  io->extent_id = extent.id;
  io->expected_checksum = hash;
  io->request = io::IoRequest{};
  io->request.op = io::IoOp::kWrite;
  io->request.file = file_;
  io->request.buffer = const_cast<void*>(buffer);  // the engine only reads a write's buffer
  io->request.length = align_up(bytes, device_.alignment());
  io->request.offset = extent.offset;
  io->request.buffer_index = buffer_index;
  io->request.on_complete = &ExtentStore::on_write_done;
  io->request.context = io;

  Status submitted = engine_.submit(&io->request);
  if (!submitted) {
    std::lock_guard lock(mutex_);
    auto found = find_locked(extent);
    STRATA_ASSERT(found.is_ok());  // a record with I/O in flight cannot be freed
    (*found)->writing = false;
    ++stats_.write_errors;
    finish_locked();
    return std::move(submitted).with_context("writing " + describe(extent.id, extent.offset));
  }
  return Status::ok();
}

void ExtentStore::on_write_done(io::IoRequest* request, void* context) {
  auto* io = static_cast<ExtentIo*>(context);
  ExtentStore& store = *static_cast<ExtentStore*>(io->store);
  Status status = io::request_status(*request);
  {
    std::lock_guard lock(store.mutex_);
    const auto it = store.records_.find(io->extent_id);
    STRATA_ASSERT(it != store.records_.end());
    Record& record = it->second;
    STRATA_ASSERT(record.writing);
    record.writing = false;
    if (status.is_ok()) {
      record.content = Content::kWritten;
      record.length = io->bytes;
      record.checksum = io->expected_checksum;
      record.last_write_failed = false;
      ++store.stats_.writes;
      store.stats_.bytes_written += io->bytes;
    } else {
      // The previous record stays: with a checksum it still tells whether the old bytes survived.
      // Without one nothing can, so the content is given up rather than trusted.
      record.last_write_failed = true;
      if (!store.options_.verify_checksums && record.content == Content::kWritten) {
        record.content = Content::kFailed;
      }
      ++store.stats_.write_errors;
      status = std::move(status).with_context("writing " + describe(io->extent_id, record.offset));
    }
    store.finish_locked();
  }
  io->status = std::move(status);
  io->on_complete(io, io->context);
}

Status ExtentStore::read_async(const Extent& extent, void* buffer, uint64_t buffer_bytes,
                               ExtentIo* io, int32_t buffer_index) {
  if (io == nullptr || io->on_complete == nullptr) {
    return invalid_argument("extent read: no completion callback");
  }
  STRATA_TRY(check_buffer(buffer, "extent read"));
  uint64_t length = 0;
  uint64_t expected = 0;
  {
    std::lock_guard lock(mutex_);
    STRATA_ASSIGN_OR_RETURN(auto found, find_locked(extent), "reading");
    Record& record = *found;
    if (record.writing) {
      return Status::error(STRATA_E_STATE, "reading " + describe(extent.id, extent.offset) +
                                               " while a write to it is in flight");
    }
    if (record.content == Content::kNone) {
      return Status::error(STRATA_E_STATE,
                           "reading " + describe(extent.id, extent.offset) +
                               (record.last_write_failed ? ", whose only write failed"
                                                         : ", which was never written"));
    }
    if (record.content == Content::kFailed) {
      return Status::error(STRATA_E_STATE, "reading " + describe(extent.id, extent.offset) +
                                               ": its last write failed and, without checksums, "
                                               "what it holds is unknown; write it again");
    }
    length = record.length;
    expected = record.checksum;
    if (buffer_bytes < align_up(length, device_.alignment())) {
      return invalid_argument("reading " + describe(extent.id, extent.offset) + " of " +
                              std::to_string(length) + " bytes needs a buffer of " +
                              std::to_string(align_up(length, device_.alignment())) +
                              " bytes; got " + std::to_string(buffer_bytes));
    }
    ++record.readers;
    ++in_flight_;
  }

  io->status = Status::ok();
  io->bytes = length;
  io->store = this;
  io->extent_id = extent.id;
  io->expected_checksum = expected;
  io->request = io::IoRequest{};
  io->request.op = io::IoOp::kRead;
  io->request.file = file_;
  io->request.buffer = buffer;
  io->request.length = align_up(length, device_.alignment());
  io->request.offset = extent.offset;
  io->request.buffer_index = buffer_index;
  io->request.on_complete = &ExtentStore::on_read_done;
  io->request.context = io;

  Status submitted = engine_.submit(&io->request);
  if (!submitted) {
    std::lock_guard lock(mutex_);
    auto found = find_locked(extent);
    STRATA_ASSERT(found.is_ok());
    --(*found)->readers;
    ++stats_.read_errors;
    finish_locked();
    return std::move(submitted).with_context("reading " + describe(extent.id, extent.offset));
  }
  return Status::ok();
}

void ExtentStore::on_read_done(io::IoRequest* request, void* context) {
  auto* io = static_cast<ExtentIo*>(context);
  ExtentStore& store = *static_cast<ExtentStore*>(io->store);
  Status status = io::request_status(*request);
  uint64_t actual = 0;
  bool mismatch = false;
  // Verified here, on the engine thread, so that a caller never sees unverified bytes reported
  // as a successful read.
  if (status.is_ok() && store.options_.verify_checksums) {
    actual = checksum(request->buffer, io->bytes);
    mismatch = actual != io->expected_checksum;
  }
  {
    std::lock_guard lock(store.mutex_);
    const auto it = store.records_.find(io->extent_id);
    STRATA_ASSERT(it != store.records_.end());
    Record& record = it->second;
    STRATA_ASSERT(record.readers > 0);
    --record.readers;
    if (!status.is_ok()) {
      ++store.stats_.read_errors;
      status = std::move(status).with_context("reading " + describe(io->extent_id, record.offset));
    } else if (mismatch) {
      ++store.stats_.read_errors;
      ++store.stats_.checksum_failures;
      status = Status::error(
          STRATA_E_CORRUPT,
          "reading " + describe(io->extent_id, record.offset) + " (" + std::to_string(io->bytes) +
              " bytes): checksum mismatch, expected xxh3 " + hex64(io->expected_checksum) +
              ", got " + hex64(actual) +
              (record.last_write_failed
                   ? "; the last write to this extent failed and overwrote part of it"
                   : "; the data on the device changed since it was written"));
    } else {
      ++store.stats_.reads;
      store.stats_.bytes_read += io->bytes;
    }
    store.finish_locked();
  }
  io->status = std::move(status);
  io->on_complete(io, io->context);
}

void ExtentStore::finish_locked() {
  STRATA_ASSERT(in_flight_ > 0);
  if (--in_flight_ == 0) idle_.notify_all();
}

namespace {

// Completion for the blocking forms: the waiter owns the ExtentIo on its stack.
void count_down(ExtentIo*, void* context) {
  static_cast<std::latch*>(context)->count_down();
}

}  // namespace

Status ExtentStore::write(const Extent& extent, const void* buffer, uint64_t bytes,
                          int32_t buffer_index) {
  std::latch done(1);
  ExtentIo io;
  io.on_complete = &count_down;
  io.context = &done;
  STRATA_TRY(write_async(extent, buffer, bytes, &io, buffer_index));
  done.wait();
  return std::move(io.status);
}

Result<uint64_t> ExtentStore::read(const Extent& extent, void* buffer, uint64_t buffer_bytes,
                                   int32_t buffer_index) {
  std::latch done(1);
  ExtentIo io;
  io.on_complete = &count_down;
  io.context = &done;
  STRATA_TRY(read_async(extent, buffer, buffer_bytes, &io, buffer_index));
  done.wait();
  if (!io.status) return std::move(io.status);
  return io.bytes;
}

Result<uint64_t> ExtentStore::content_bytes(const Extent& extent) const {
  std::lock_guard lock(mutex_);
  STRATA_ASSIGN_OR_RETURN(auto found, find_locked(extent));
  const Record& record = *found;
  if (record.content != Content::kWritten) {
    return Status::error(STRATA_E_STATE,
                         describe(extent.id, extent.offset) + " holds no readable content");
  }
  return record.length;
}

ExtentStoreStats ExtentStore::stats() const {
  std::lock_guard lock(mutex_);
  ExtentStoreStats s = stats_;
  s.extents = records_.size();
  s.space = allocator_.stats();
  return s;
}

}  // namespace strata::storage
