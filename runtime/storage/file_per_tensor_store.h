// FilePerTensorStore: the NVMe tier laid out the way DeepSpeed's ZeRO-Infinity lays it out - one
// swap file per tensor in a directory on a mounted file system, each request opening the file,
// stat'ing it, transferring with O_DIRECT and closing it again (its aio swapper does open, fstat
// and close around every read and write). It is the baseline's I/O path for `strata bench
// finetune`, selected with strata_config.nvme_layout; Strata's own layout is ExtentStore.
//
// Files
//  - The directory must exist. The store makes a private subdirectory in it, with an
//    owner-stamped name (storage/owned_names.h, "strata-<pid>-<boot>-<start>-<random>.tensors"),
//    mode 0700, created without following links, and one file per extent inside it, "<id>.swp",
//    mode 0600, O_CREAT|O_EXCL|O_NOFOLLOW on its first write. It holds the subdirectory's owner
//    lock while open; orphans of dead owners in the directory are removed before it makes one.
//  - A file is removed when its extent is freed, and the subdirectory on close (unless kept: then
//    it is renamed to "<name>.kept", which is no longer an owner-stamped name), or
//    when the process dies of SIGINT, SIGTERM or SIGHUP (common/interrupt_cleanup.h).
//  - Space is not reserved up front (DeepSpeed does not): capacity_bytes bounds the bytes the
//    extents may hold, and a disk that fills up anyway is STRATA_E_NOSPACE on the write.
//  - No checksums: DeepSpeed verifies nothing it reads back.
//
// Content: the extent store's rules without checksums (extent_content.h), in blocks of
// kBlockBytes (1 MiB, the extent store's default, so a caller streams the same chunks on either
// layout): a ranged request preads / pwrites its range at the same offset in the tensor's file;
// a block is readable once a write over it succeeded, a failed write makes the blocks it covered
// "failed" (STRATA_E_STATE) until a write over them succeeds, and requests in flight on one
// tensor may not overlap a write's blocks. A write that would create the file while another one
// is creating it waits for that creation on its I/O thread.
//
// I/O runs on the store's own threads (DeepSpeed's aio thread_count, default 1) with
// pread/pwrite, one request at a time per thread; completions run on those threads.
//
// Thread rules: every member may be called from any thread concurrently.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/interrupt_cleanup.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "storage/extent_content.h"
#include "storage/swap_store.h"

namespace strata::storage {

struct FilePerTensorOptions {
  std::string dir;              // an existing directory on a mounted file system
  uint64_t capacity_bytes = 0;  // bytes all files may hold; 0 = half the free space
  uint32_t threads = 1;         // I/O threads (1 .. 64)
  bool keep = false;            // leave the files in place on close
  bool allow_buffered = false;  // where O_DIRECT is refused (tmpfs), use buffered I/O
};

class FilePerTensorStore final : public SwapStore {
 public:
  static Result<std::unique_ptr<FilePerTensorStore>> open(const FilePerTensorOptions& options);
  FilePerTensorStore(const FilePerTensorStore&) = delete;
  FilePerTensorStore& operator=(const FilePerTensorStore&) = delete;
  ~FilePerTensorStore() override;

  Status close() override;
  Result<Extent> allocate(uint64_t bytes) override;
  Status free(const Extent& extent) override;
  Status write_async(const Extent& extent, const void* buffer, uint64_t bytes, ExtentIo* io,
                     int32_t buffer_index = -1) override;
  Status read_async(const Extent& extent, void* buffer, uint64_t buffer_bytes, ExtentIo* io,
                    int32_t buffer_index = -1) override;
  Status write_range_async(const Extent& extent, uint64_t offset, const void* buffer,
                           uint64_t bytes, uint64_t content_bytes, ExtentIo* io,
                           int32_t buffer_index = -1) override;
  Status read_range_async(const Extent& extent, uint64_t offset, void* buffer, uint64_t bytes,
                          ExtentIo* io, int32_t buffer_index = -1) override;

  uint64_t block_bytes() const override { return kBlockBytes; }
  uint64_t alignment() const override { return kAlignment; }
  uint64_t memory_alignment() const override { return kAlignment; }
  uint64_t capacity() const override { return capacity_; }
  ExtentStoreStats stats() const override;

  // The subdirectory holding the files, and the path one extent's file has (or will have).
  const std::string& directory() const { return path_; }
  std::string file_path(const Extent& extent) const;

 private:
  static constexpr uint64_t kAlignment = 4096;
  // 1 byte of host memory per block (1 MiB per TiB); 4 KiB blocks would cost the baseline
  // 256 MiB per TiB that DeepSpeed does not spend.
  static constexpr uint64_t kBlockBytes = uint64_t{1} << 20;

  struct Record {
    uint64_t capacity = 0;
    ExtentContent content;  // its blocks and its requests in flight
    bool has_file = false;  // the file exists (a write was attempted)
    bool creating = false;  // the write creating the file is in flight
  };
  struct Request {
    ExtentIo* io = nullptr;  // its range: io->offset, io->bytes
    void* buffer = nullptr;
    uint64_t transfer = 0;  // bytes moved: the logical length rounded up to kAlignment
    bool write = false;
    bool create = false;        // the extent's first write: the file must not exist yet
    bool after_create = false;  // queued while the creating write was in flight
  };

  FilePerTensorStore(UniqueFd dir_fd, std::string path, uint64_t capacity,
                     const FilePerTensorOptions& options);

  Result<Record*> find_locked(const Extent& extent);
  Status submit_write(const Extent& extent, uint64_t offset, const void* buffer, uint64_t bytes,
                      uint64_t content_bytes, ExtentIo* io, bool whole);
  Status submit_read(const Extent& extent, uint64_t offset, void* buffer, uint64_t bytes,
                     uint64_t buffer_bytes, ExtentIo* io, bool whole);
  void enqueue_locked(const Request& request);
  void io_thread_main();
  // The extent's id travels in request.io->extent_id, set by enqueue_locked.
  Status transfer(const Request& request);  // open, fstat, pread/pwrite, close
  void finish(const Request& request, Status status);
  static std::string file_name(uint64_t id);

  UniqueFd dir_fd_;
  UniqueFd parent_fd_;          // where the subdirectory is, for on_signal_
  InterruptCleanup on_signal_;  // armed until close() removes the subdirectory (or keeps it)
  const std::string path_;
  const uint64_t capacity_;
  const FilePerTensorOptions options_;
  bool direct_io_ = true;

  mutable std::mutex mutex_;
  std::condition_variable work_;          // requests queued, or stopping
  std::condition_variable idle_;          // in_flight_ dropped to 0
  std::condition_variable file_created_;  // a creating write opened (or failed to open) its file
  std::deque<Request> queue_;
  std::unordered_map<uint64_t, Record> records_;
  uint64_t next_id_ = 1;
  uint64_t used_ = 0;
  uint64_t in_flight_ = 0;
  bool stopping_ = false;
  bool closed_ = false;
  ExtentStoreStats stats_;
  std::vector<std::thread> threads_;
};

}  // namespace strata::storage
