// The NVMe tier's backing store: one preallocated swap file in a directory the user named, or a
// raw block device named explicitly. Strata manages the space inside it itself (ExtentAllocator);
// there is never a file per tensor.
//
// Swap file mode
//  - The directory must exist. The file is created inside it with O_CREAT|O_EXCL|O_NOFOLLOW and
//    mode 0600: an existing file or a symlink at the path is refused, never followed or reused,
//    and no other user can read the tensors spilled into it.
//  - The space is reserved up front with fallocate(), so running out of disk is reported once at
//    startup ("asked X, free Y on PATH") rather than as an I/O error in the middle of a step.
//  - The file is removed when the BackingDevice is destroyed, unless keep is set. Removal goes
//    through the directory descriptor and only if the name still refers to the file that was
//    created, so a file someone put in its place is not removed. If the process dies of SIGINT,
//    SIGTERM or SIGHUP first, common/interrupt_cleanup.h removes it; if it dies of anything else
//    (SIGKILL, a crash), the next runtime or `strata doctor` on the same directory recognises
//    the orphan by its name and its free owner lock (storage/owned_names.h).
//
// Raw device mode
//  - Only a path given explicitly; it must be a block device (S_ISBLK). It is opened with O_EXCL,
//    which the kernel refuses (EBUSY) while the device is mounted or otherwise claimed. It is
//    never created, truncated or removed.
//
// Both modes use O_DIRECT: tensors are streamed once and must not evict the host's page cache or
// count against host memory. Where the file system refuses O_DIRECT (tmpfs on older kernels), the
// open fails with STRATA_E_UNSUPPORTED unless allow_buffered is set (tests, `strata doctor`).
#pragma once

#include <cstdint>
#include <string>

#include "common/interrupt_cleanup.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "storage/owned_names.h"

namespace strata::storage {

struct BackingDeviceOptions {
  // Exactly one of swap_dir and raw_device is set.
  std::string swap_dir;
  std::string raw_device;

  // Name of the swap file inside swap_dir. Empty: an owner-stamped name (storage/owned_names.h,
  // "strata-<pid>-<boot>-<start>-<random>.swap"), retried with a new random part if that name
  // exists; orphans of dead owners in swap_dir are removed first. A name given here is never
  // retried: if it exists, open fails.
  std::string swap_file_name;

  // Swap file: bytes to preallocate, 0 = half of the file system's free space.
  // Raw device: bytes of the device to use from offset 0, 0 = all of it.
  // Rounded down to the direct-I/O alignment.
  uint64_t capacity_bytes = 0;

  // Swap file: leave it in place on close. A generated name is then renamed to "<name>.kept", so
  // that it is no longer taken for an orphan once this process has exited.
  bool keep = false;
  bool allow_buffered = false;  // fall back to buffered I/O where O_DIRECT is refused
};

// The swap file size used when none is given: half the free space, so that the rest of the file
// system (checkpoints, logs, datasets) keeps room to grow. Rounded down to alignment.
uint64_t default_swap_capacity(uint64_t free_bytes, uint64_t alignment);

// Free bytes on the file system of dir_fd for an unprivileged writer (f_bavail excludes the root
// reserve); path is for the message.
Result<uint64_t> free_bytes_of(int dir_fd, const std::string& path);

class BackingDevice {
 public:
  static Result<BackingDevice> open(const BackingDeviceOptions& options);

  BackingDevice(BackingDevice&& other) noexcept;
  BackingDevice& operator=(BackingDevice&& other) noexcept;
  BackingDevice(const BackingDevice&) = delete;
  BackingDevice& operator=(const BackingDevice&) = delete;
  ~BackingDevice();

  // Removes the swap file (unless kept) and closes the descriptors. Idempotent; the destructor
  // calls it and drops the status.
  Status close();

  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }
  uint64_t capacity() const { return capacity_; }
  // File offsets and lengths of direct I/O must be multiples of alignment(); buffers must start
  // at a multiple of memory_alignment(). Both are powers of two and at least 4096.
  uint64_t alignment() const { return alignment_; }
  uint64_t memory_alignment() const { return memory_alignment_; }
  bool direct_io() const { return direct_io_; }
  bool is_raw_device() const { return raw_device_; }
  bool kept() const { return keep_; }

 private:
  BackingDevice() = default;
  static Result<BackingDevice> open_swap_file(const BackingDeviceOptions& options);
  static Result<BackingDevice> open_raw_device(const BackingDeviceOptions& options);
  Status probe_alignment();
  Status remove_swap_file();
  Status rename_kept_file();

  UniqueFd fd_;
  UniqueFd dir_fd_;        // swap file mode: the directory, for unlinkat
  std::string path_;       // full path, for messages
  std::string file_name_;  // swap file name inside the directory
  uint64_t capacity_ = 0;
  uint64_t alignment_ = 0;
  uint64_t memory_alignment_ = 0;
  bool direct_io_ = false;
  bool raw_device_ = false;
  bool keep_ = false;
  bool owns_file_ = false;       // swap file created by us and not yet removed
  bool generated_name_ = false;  // file_name_ is owner-stamped (an orphan once we are gone)
  InterruptCleanup on_signal_;   // armed while owns_file_ and not keep_
};

}  // namespace strata::storage
