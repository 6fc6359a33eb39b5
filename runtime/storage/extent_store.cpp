#include "storage/extent_store.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <latch>
#include <optional>
#include <span>
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

// The logical bytes of the index-th block of a range of `bytes`: whole blocks but the last.
uint64_t block_in_range(uint64_t bytes, uint64_t index, uint64_t block_bytes) {
  return std::min(block_bytes, bytes - index * block_bytes);
}

}  // namespace

Result<std::unique_ptr<ExtentStore>> ExtentStore::open(BackingDevice device, io::IoEngine& engine,
                                                       const ExtentStoreOptions& options) {
  if (device.fd() < 0) return invalid_argument("extent store: the backing device is closed");
  if (!is_power_of_two(options.block_bytes) || options.block_bytes < device.alignment()) {
    return invalid_argument("extent store: block_bytes is " + std::to_string(options.block_bytes) +
                            "; it must be a power of two of at least the device's alignment (" +
                            std::to_string(device.alignment()) + " bytes)");
  }
  STRATA_ASSIGN_OR_RETURN(
      auto allocator,
      ExtentAllocator::create(device.capacity(), device.alignment(), options.max_extents));
  auto file = engine.register_file(device.fd());
  if (!file) {
    return std::move(file).take_status().with_context("registering " + device.path() +
                                                      " with the " + engine.name() + " engine");
  }
  std::unique_ptr<ExtentStore> store(
      new ExtentStore(std::move(device), engine, *file, std::move(allocator), options));
  if (options.verify_checksums) {
    STRATA_ASSIGN_OR_RETURN(store->content_thread_,
                            ContentThread::start(&ExtentStore::on_content_thread, store.get()));
  }
  return store;
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
  // The block records are sized for the capacity the allocator will reserve and allocated
  // before the lock; a size the allocator refuses gets its message instead.
  std::optional<ExtentContent> content;
  if (bytes > 0 && bytes <= capacity()) {
    STRATA_ASSIGN_OR_RETURN(auto created,
                            ExtentContent::create(align_up(bytes, alignment()),
                                                  options_.block_bytes, options_.verify_checksums),
                            "allocating " + std::to_string(bytes) + " bytes");
    content.emplace(std::move(created));
  }
  std::lock_guard lock(mutex_);
  auto offset = allocator_.allocate(bytes);
  if (!offset) return std::move(offset).take_status();
  Extent extent{next_id_++, *offset, allocator_.reserved_length(bytes)};
  STRATA_ASSERT(content.has_value() && extent.capacity == align_up(bytes, alignment()));
  const bool inserted =
      records_.emplace(extent.id, Record{extent.offset, extent.capacity, std::move(*content)})
          .second;
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
    return Status::error(STRATA_E_STATE, describe_extent(extent.id, extent.offset) +
                                             " is not allocated (freed already, or from another "
                                             "store)");
  }
  const Record& record = it->second;
  if (record.offset != extent.offset || record.capacity != extent.capacity) {
    return Status::error(STRATA_E_STATE, describe_extent(extent.id, extent.offset) +
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
  if (record.content.io_in_flight()) {
    return Status::error(STRATA_E_STATE, "freeing " + describe_extent(extent.id, extent.offset) +
                                             " while I/O on it is in flight");
  }
  // The table and the allocator agree on every live extent, so this cannot fail.
  const Status freed = allocator_.free(record.offset, record.capacity);
  STRATA_ASSERT(freed.is_ok());
  records_.erase(extent.id);
  return Status::ok();
}

Status ExtentStore::check_request(const ExtentIo* io, const void* buffer, const char* what) const {
  if (io == nullptr || io->on_complete == nullptr) {
    return invalid_argument(std::string(what) + ": no completion callback");
  }
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
  STRATA_TRY(check_request(io, buffer, "extent write"));
  if (bytes == 0 || bytes > extent.capacity) {
    return invalid_argument("writing " + std::to_string(bytes) + " bytes to " +
                            describe_extent(extent.id, extent.offset) + " of capacity " +
                            std::to_string(extent.capacity));
  }
  return submit_write(extent, 0, buffer, bytes, bytes, io, buffer_index, /*whole=*/true);
}

Status ExtentStore::write_range_async(const Extent& extent, uint64_t offset, const void* buffer,
                                      uint64_t bytes, uint64_t content_bytes, ExtentIo* io,
                                      int32_t buffer_index) {
  STRATA_TRY(check_request(io, buffer, "extent write"));
  return submit_write(extent, offset, buffer, bytes, content_bytes, io, buffer_index,
                      /*whole=*/false);
}

Status ExtentStore::submit_write(const Extent& extent, uint64_t offset, const void* buffer,
                                 uint64_t bytes, uint64_t content_bytes, ExtentIo* io,
                                 int32_t buffer_index, bool whole) {
  {
    std::lock_guard lock(mutex_);
    STRATA_ASSIGN_OR_RETURN(auto found, find_locked(extent), "writing");
    ExtentContent& content = found->content;
    STRATA_TRY(content.check_write(extent, offset, bytes, content_bytes, whole));
    content.start(io, extent, offset, bytes, content_bytes, /*write=*/true, whole);
    ++in_flight_;
  }
  io->request = io::IoRequest{};
  io->request.op = io::IoOp::kWrite;
  io->request.on_complete = &ExtentStore::on_write_done;
  prepare(extent, io, const_cast<void*>(buffer), buffer_index);  // the engine only reads it
  // Hashed once admitted (the pending slots of its blocks are this write's alone now), before
  // the write is issued and outside the lock: the caller may not touch the buffer until
  // completion anyway. With checksums, on the content thread (content_thread.h): the caller is
  // often the scheduler, holding its lock while it issues transfers.
  if (content_thread_ != nullptr) {
    content_thread_->post(io);
    return Status::ok();
  }
  hash_write(io);
  return submit_prepared(io);
}

void ExtentStore::hash_write(ExtentIo* io) const {
  // The slots' place is fixed once the write is admitted; no lock needed to find them.
  const std::span<uint64_t> pending = io->content->pending_hashes(*io);
  const auto* bytes_in = static_cast<const unsigned char*>(io->request.buffer);
  for (uint64_t i = 0; i < pending.size(); ++i) {
    pending[i] = checksum(bytes_in + i * options_.block_bytes,
                          block_in_range(io->bytes, i, options_.block_bytes));
  }
}

void ExtentStore::on_content_thread(ExtentIo* io, void* context) {
  ExtentStore& store = *static_cast<ExtentStore*>(context);
  if (!io->write) {
    finish_read(io, &store);
    return;
  }
  store.hash_write(io);
  Status submitted = store.submit_prepared(io);
  if (submitted) return;
  // Refused after write_async had returned OK: the caller hears it as the write's outcome.
  io->status = std::move(submitted);
  io->on_complete(io, io->context);
}

void ExtentStore::prepare(const Extent& extent, ExtentIo* io, void* buffer, int32_t buffer_index) {
  io->status = Status::ok();
  io->store = this;
  io->request.file = file_;
  io->request.buffer = buffer;
  // A ranged request covers whole blocks (multiples of the alignment) but for the content's
  // tail, so the padding of its transfer stays inside its own last block.
  io->request.length = align_up(io->bytes, device_.alignment());
  io->request.offset = extent.offset + io->offset;
  io->request.buffer_index = buffer_index;
  io->request.context = io;
}

Status ExtentStore::submit_prepared(ExtentIo* io) {
  Status submitted = engine_.submit(&io->request);
  if (!submitted) {
    std::lock_guard lock(mutex_);
    const auto it = records_.find(io->extent_id);
    STRATA_ASSERT(it != records_.end());  // a record with I/O in flight cannot be freed
    it->second.content.withdraw(io);
    ++(io->write ? stats_.write_errors : stats_.read_errors);
    finish_locked();
    return std::move(submitted).with_context(ExtentContent::describe(*io, it->second.offset));
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
    record.content.finish(io, status.is_ok());
    if (status.is_ok()) {
      ++store.stats_.writes;
      store.stats_.bytes_written += io->bytes;
    } else {
      ++store.stats_.write_errors;
      status = std::move(status).with_context(ExtentContent::describe(*io, record.offset));
    }
    store.finish_locked();
  }
  io->status = std::move(status);
  io->on_complete(io, io->context);
}

Status ExtentStore::read_async(const Extent& extent, void* buffer, uint64_t buffer_bytes,
                               ExtentIo* io, int32_t buffer_index) {
  STRATA_TRY(check_request(io, buffer, "extent read"));
  return submit_read(extent, 0, buffer, 0, buffer_bytes, io, buffer_index, /*whole=*/true);
}

Status ExtentStore::read_range_async(const Extent& extent, uint64_t offset, void* buffer,
                                     uint64_t bytes, ExtentIo* io, int32_t buffer_index) {
  STRATA_TRY(check_request(io, buffer, "extent read"));
  // The caller sizes a ranged read's buffer by the rule; there is no length to check it by.
  return submit_read(extent, offset, buffer, bytes, align_up(bytes, alignment()), io, buffer_index,
                     /*whole=*/false);
}

Status ExtentStore::submit_read(const Extent& extent, uint64_t offset, void* buffer, uint64_t bytes,
                                uint64_t buffer_bytes, ExtentIo* io, int32_t buffer_index,
                                bool whole) {
  {
    std::lock_guard lock(mutex_);
    STRATA_ASSIGN_OR_RETURN(auto found, find_locked(extent), "reading");
    ExtentContent& content = found->content;
    if (whole) bytes = content.length();
    STRATA_TRY(content.check_read(extent, offset, bytes, whole));
    if (buffer_bytes < align_up(bytes, device_.alignment())) {
      return invalid_argument("reading " + describe_extent(extent.id, extent.offset) + " of " +
                              std::to_string(bytes) + " bytes needs a buffer of " +
                              std::to_string(align_up(bytes, device_.alignment())) +
                              " bytes; got " + std::to_string(buffer_bytes));
    }
    content.start(io, extent, offset, bytes, 0, /*write=*/false, whole);
    ++in_flight_;
  }
  io->request = io::IoRequest{};
  io->request.op = io::IoOp::kRead;
  io->request.on_complete = &ExtentStore::on_read_done;
  prepare(extent, io, buffer, buffer_index);
  return submit_prepared(io);
}

void ExtentStore::on_read_done(io::IoRequest* request, void* context) {
  auto* io = static_cast<ExtentIo*>(context);
  ExtentStore& store = *static_cast<ExtentStore*>(io->store);
  io->status = io::request_status(*request);
  // Hashing here would keep the engine's one thread from reaping and submitting meanwhile
  // (content_thread.h); a failed read has nothing to verify.
  if (store.content_thread_ != nullptr && io->status.is_ok()) {
    store.content_thread_->post(io);
    return;
  }
  finish_read(io, &store);
}

void ExtentStore::finish_read(ExtentIo* io, void* context) {
  ExtentStore& store = *static_cast<ExtentStore*>(context);
  Status status = std::move(io->status);
  // Verified before on_complete and outside the lock, so that a caller never sees unverified
  // bytes reported as a successful read. The recorded hashes of this read's blocks cannot change
  // while it is in flight (until finish_locked below): no write over them is admitted.
  uint64_t mismatches = 0;
  uint64_t first_bad = 0;
  uint64_t expected = 0;
  uint64_t actual = 0;
  const uint64_t block_bytes = store.options_.block_bytes;
  if (status.is_ok()) {
    const std::span<const uint64_t> hashes = io->content->hashes(*io);
    const auto* bytes_in = static_cast<const unsigned char*>(io->request.buffer);
    for (uint64_t i = 0; i < hashes.size(); ++i) {
      const uint64_t hash =
          checksum(bytes_in + i * block_bytes, block_in_range(io->bytes, i, block_bytes));
      if (hash == hashes[i]) continue;
      if (mismatches++ == 0) {
        first_bad = i;
        expected = hashes[i];
        actual = hash;
      }
    }
  }
  {
    std::lock_guard lock(store.mutex_);
    const auto it = store.records_.find(io->extent_id);
    STRATA_ASSERT(it != store.records_.end());
    Record& record = it->second;
    if (!status.is_ok()) {
      ++store.stats_.read_errors;
      status = std::move(status).with_context(ExtentContent::describe(*io, record.offset));
    } else if (mismatches > 0) {
      ++store.stats_.read_errors;
      store.stats_.checksum_failures += mismatches;
      const uint64_t bad_offset = io->offset + first_bad * block_bytes;
      const uint64_t bad_bytes = block_in_range(io->bytes, first_bad, block_bytes);
      status = Status::error(
          STRATA_E_CORRUPT,
          ExtentContent::describe(*io, record.offset) +
              (io->whole ? " (" + std::to_string(io->bytes) + " bytes)" : std::string()) +
              ": checksum mismatch in block [" + std::to_string(bad_offset) + ", " +
              std::to_string(bad_offset + bad_bytes) + "), expected xxh3 " + hex64(expected) +
              ", got " + hex64(actual) +
              (mismatches > 1 ? " (" + std::to_string(mismatches - 1) +
                                    " more of the range's blocks mismatched)"
                              : std::string()) +
              (record.content.write_failed_over(bad_offset / block_bytes)
                   ? "; the last write to this extent failed while covering this block and "
                     "overwrote part of it"
                   : "; the data on the device changed since it was written"));
    } else {
      ++store.stats_.reads;
      store.stats_.bytes_read += io->bytes;
    }
    record.content.finish(io, status.is_ok());
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

// Runs one asynchronous call to completion: the waiter owns the ExtentIo on its stack.
template <typename Submit>
Result<uint64_t> run_blocking(Submit submit) {
  std::latch done(1);
  ExtentIo io;
  io.on_complete = [](ExtentIo*, void* context) {
    static_cast<std::latch*>(context)->count_down();
  };
  io.context = &done;
  STRATA_TRY(submit(&io));
  done.wait();
  if (!io.status) return std::move(io.status);
  return io.bytes;
}

Status status_of(Result<uint64_t> result) {
  return result ? Status::ok() : std::move(result).take_status();
}

}  // namespace

Status ExtentStore::write(const Extent& extent, const void* buffer, uint64_t bytes,
                          int32_t buffer_index) {
  return status_of(run_blocking(
      [&](ExtentIo* io) { return write_async(extent, buffer, bytes, io, buffer_index); }));
}

Result<uint64_t> ExtentStore::read(const Extent& extent, void* buffer, uint64_t buffer_bytes,
                                   int32_t buffer_index) {
  return run_blocking(
      [&](ExtentIo* io) { return read_async(extent, buffer, buffer_bytes, io, buffer_index); });
}

Status ExtentStore::write_range(const Extent& extent, uint64_t offset, const void* buffer,
                                uint64_t bytes, uint64_t content_bytes, int32_t buffer_index) {
  return status_of(run_blocking([&](ExtentIo* io) {
    return write_range_async(extent, offset, buffer, bytes, content_bytes, io, buffer_index);
  }));
}

Result<uint64_t> ExtentStore::read_range(const Extent& extent, uint64_t offset, void* buffer,
                                         uint64_t bytes, int32_t buffer_index) {
  return run_blocking([&](ExtentIo* io) {
    return read_range_async(extent, offset, buffer, bytes, io, buffer_index);
  });
}

Result<uint64_t> ExtentStore::content_bytes(const Extent& extent) const {
  std::lock_guard lock(mutex_);
  STRATA_ASSIGN_OR_RETURN(auto found, find_locked(extent));
  if (!found->content.readable()) {
    return Status::error(STRATA_E_STATE,
                         describe_extent(extent.id, extent.offset) + " holds no readable content");
  }
  return found->content.length();
}

ExtentStoreStats ExtentStore::stats() const {
  std::lock_guard lock(mutex_);
  ExtentStoreStats s = stats_;
  s.extents = records_.size();
  s.space = allocator_.stats();
  return s;
}

}  // namespace strata::storage
