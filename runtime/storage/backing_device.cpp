#include "storage/backing_device.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <utility>

#include "common/align.h"
#include "common/assert.h"
#include "common/units.h"

namespace strata::storage {

namespace {

bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos;
}

Status swap_no_space(uint64_t asked, uint64_t free, const std::string& dir, const char* why) {
  return Status::error(STRATA_E_NOSPACE,
                       "NVMe swap file: asked " + format_bytes(asked) + " (" +
                           std::to_string(asked) + " bytes), free " + format_bytes(free) + " on " +
                           dir + why +
                           "; lower nvme_capacity_bytes (strata_config), free space there, or "
                           "point nvme_path at a larger file system");
}

}  // namespace

Result<uint64_t> free_bytes_of(int dir_fd, const std::string& path) {
  struct statvfs vfs {};
  if (::fstatvfs(dir_fd, &vfs) != 0) {
    return errno_status(STRATA_E_IO, "statvfs of " + path, errno);
  }
  return static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
}

uint64_t default_swap_capacity(uint64_t free_bytes, uint64_t alignment) {
  return align_down(free_bytes / 2, alignment);
}

Result<BackingDevice> BackingDevice::open(const BackingDeviceOptions& options) {
  const bool has_dir = !options.swap_dir.empty();
  const bool has_raw = !options.raw_device.empty();
  if (has_dir == has_raw) {
    return invalid_argument(
        "NVMe tier: set exactly one of a swap file directory and a raw block device");
  }
  return has_dir ? open_swap_file(options) : open_raw_device(options);
}

Result<BackingDevice> BackingDevice::open_swap_file(const BackingDeviceOptions& options) {
  BackingDevice device;
  const std::string& dir = options.swap_dir;

  // Everything below is relative to this descriptor, so the directory cannot be swapped for
  // another between the checks and the create, and the unlink on close hits the same directory.
  device.dir_fd_.reset(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!device.dir_fd_.valid()) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return errno_status(STRATA_E_INVALID, "NVMe swap directory " + dir + " (it must exist)", err);
    }
    return errno_status(STRATA_E_IO, "opening NVMe swap directory " + dir, err);
  }

  const bool generated = options.swap_file_name.empty();
  if (!generated && !is_plain_file_name(options.swap_file_name)) {
    return invalid_argument("swap file name '" + options.swap_file_name +
                            "' must be a plain name inside the directory");
  }
  // Swap files of processes that died without removing them would otherwise hold their space
  // until someone noticed; only dead owners' files with a free lock go (owned_names.h).
  if (generated) (void)remove_orphans(device.dir_fd_.get());
  for (int attempt = 0;; ++attempt) {
    device.file_name_ = generated ? generated_name(".swap") : options.swap_file_name;
    device.path_ = dir + (dir.back() == '/' ? "" : "/") + device.file_name_;
    // O_EXCL with O_CREAT fails on any existing name, symlinks included (dangling or not), so
    // Strata never writes through a link or into a file it did not create; O_NOFOLLOW says so
    // explicitly. O_DIRECT is set afterwards with fcntl: an open(O_CREAT|O_DIRECT) that the file
    // system refuses with EINVAL has already created the file, and without a descriptor we could
    // not prove it is ours to remove.
    device.fd_.reset(::openat(device.dir_fd_.get(), device.file_name_.c_str(),
                              O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (device.fd_.valid()) break;
    const int err = errno;
    if (err == EEXIST && generated && attempt + 1 < kGeneratedNameAttempts) continue;
    if (err == EEXIST) {
      struct stat st {};
      const bool is_link = ::fstatat(device.dir_fd_.get(), device.file_name_.c_str(), &st,
                                     AT_SYMLINK_NOFOLLOW) == 0 &&
                           S_ISLNK(st.st_mode);
      return Status::error(STRATA_E_INVALID,
                           "NVMe swap file " + device.path_ +
                               (is_link ? " is a symbolic link" : " already exists") +
                               ": Strata only uses a swap file it creates itself; remove it or "
                               "choose another name");
    }
    if (err == EACCES || err == EPERM || err == EROFS) {
      return errno_status(STRATA_E_INVALID, "creating NVMe swap file " + device.path_, err);
    }
    return errno_status(STRATA_E_IO, "creating NVMe swap file " + device.path_, err);
  }
  // From here on, any early return destroys `device`, which removes the half-made file.
  device.owns_file_ = true;
  device.generated_name_ = generated;
  device.on_signal_ =
      InterruptCleanup::arm(device.dir_fd_.get(), device.file_name_, InterruptCleanup::What::kFile);
  STRATA_TRY(lock_as_owner(device.fd_.get(), device.path_));

  const int flags = ::fcntl(device.fd_.get(), F_GETFL);
  if (flags < 0) return errno_status(STRATA_E_IO, "fcntl of " + device.path_, errno);
  if (::fcntl(device.fd_.get(), F_SETFL, flags | O_DIRECT) == 0) {
    device.direct_io_ = true;
  } else if (errno == EINVAL && options.allow_buffered) {
    device.direct_io_ = false;
  } else if (errno == EINVAL) {
    return unsupported("the file system holding " + dir +
                       " refuses O_DIRECT (tmpfs or a FUSE mount?); put the NVMe tier on a "
                       "local file system such as ext4 or xfs");
  } else {
    return errno_status(STRATA_E_IO, "enabling O_DIRECT on " + device.path_, errno);
  }
  STRATA_TRY(device.probe_alignment());

  STRATA_ASSIGN_OR_RETURN(auto free_bytes, free_bytes_of(device.dir_fd_.get(), dir));
  uint64_t capacity = options.capacity_bytes;
  if (capacity == 0) {
    capacity = default_swap_capacity(free_bytes, device.alignment_);
    if (capacity == 0) {
      return Status::error(STRATA_E_NOSPACE, "NVMe tier: no free space on " + dir + " (free " +
                                                 format_bytes(free_bytes) + ")");
    }
  }
  capacity = align_down(capacity, device.alignment_);
  if (capacity == 0) {
    return invalid_argument("NVMe capacity " + std::to_string(options.capacity_bytes) +
                            " bytes is less than the direct-I/O alignment of " +
                            std::to_string(device.alignment_));
  }

  // Checked before fallocate, which (ext4 at least) allocates up to the last free block before
  // it reports ENOSPC, briefly starving everything else on the file system.
  // f_bavail leaves the root reserve alone, even when Strata runs as root.
  if (capacity > free_bytes) return swap_no_space(capacity, free_bytes, dir, "");

  // Preallocating a large file takes a while and a signal can interrupt it (EINTR).
  int rc;
  do {
    rc = ::fallocate(device.fd_.get(), 0, 0, static_cast<off_t>(capacity));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    if (err == ENOSPC || err == EDQUOT || err == EFBIG) {
      auto now_free = free_bytes_of(device.dir_fd_.get(), dir);
      return swap_no_space(capacity, now_free ? *now_free : free_bytes, dir,
                           err == ENOSPC   ? ""
                           : err == EDQUOT ? " (disk quota exceeded)"
                                           : " (larger than the file system's maximum file size)");
    }
    if (err == EOPNOTSUPP) {
      return unsupported("the file system holding " + dir +
                         " cannot preallocate (fallocate: operation not supported); Strata "
                         "needs a file system that can, such as ext4, xfs or btrfs");
    }
    return errno_status(STRATA_E_IO,
                        "preallocating " + format_bytes(capacity) + " for " + device.path_, err);
  }
  device.capacity_ = capacity;
  device.keep_ = options.keep;  // only a complete swap file is ever kept
  if (device.keep_) device.on_signal_.disarm();
  return device;
}

Result<BackingDevice> BackingDevice::open_raw_device(const BackingDeviceOptions& options) {
  BackingDevice device;
  device.path_ = options.raw_device;
  device.raw_device_ = true;

  // Checked before open(): opening a character device can have side effects (a watchdog starts
  // counting, a tape rewinds), and a regular file must never be mistaken for a device.
  struct stat before {};
  if (::stat(device.path_.c_str(), &before) != 0) {
    return errno_status(STRATA_E_INVALID, "raw NVMe device " + device.path_, errno);
  }
  if (!S_ISBLK(before.st_mode)) {
    return invalid_argument("raw NVMe device " + device.path_ +
                            " is not a block device; to use a file system, give a swap file "
                            "directory instead");
  }
  // On a block device O_EXCL claims it exclusively: the kernel refuses it while it is mounted or
  // held by another exclusive opener, so Strata cannot scribble over a live file system.
  int flags = O_RDWR | O_EXCL | O_CLOEXEC | O_DIRECT;
  device.fd_.reset(::open(device.path_.c_str(), flags));
  if (!device.fd_.valid() && errno == EINVAL && options.allow_buffered) {
    flags &= ~O_DIRECT;
    device.fd_.reset(::open(device.path_.c_str(), flags));
  }
  if (!device.fd_.valid()) {
    const int err = errno;
    if (err == EBUSY) {
      return errno_status(STRATA_E_INVALID,
                          "raw NVMe device " + device.path_ + " is in use (mounted or claimed)",
                          err);
    }
    if (err == EACCES || err == EPERM || err == EROFS) {
      return errno_status(STRATA_E_INVALID, "opening raw NVMe device " + device.path_, err);
    }
    if (err == EINVAL) {
      return unsupported("raw NVMe device " + device.path_ + " refuses O_DIRECT");
    }
    return errno_status(STRATA_E_IO, "opening raw NVMe device " + device.path_, err);
  }
  device.direct_io_ = (flags & O_DIRECT) != 0;

  // The path may have been replaced between stat() and open(); the descriptor is the truth.
  struct stat after {};
  if (::fstat(device.fd_.get(), &after) != 0) {
    return errno_status(STRATA_E_IO, "fstat of " + device.path_, errno);
  }
  if (!S_ISBLK(after.st_mode) || after.st_rdev != before.st_rdev) {
    return invalid_argument("raw NVMe device " + device.path_ + " changed while being opened");
  }

  uint64_t device_bytes = 0;
  if (::ioctl(device.fd_.get(), BLKGETSIZE64, &device_bytes) != 0) {
    return errno_status(STRATA_E_IO, "BLKGETSIZE64 on " + device.path_, errno);
  }
  STRATA_TRY(device.probe_alignment());
  uint64_t capacity = options.capacity_bytes == 0 ? device_bytes : options.capacity_bytes;
  if (capacity > device_bytes) {
    return Status::error(STRATA_E_NOSPACE, "raw NVMe device: asked " + format_bytes(capacity) +
                                               ", device " + device.path_ + " has " +
                                               format_bytes(device_bytes));
  }
  capacity = align_down(capacity, device.alignment_);
  if (capacity == 0) {
    return invalid_argument("raw NVMe device " + device.path_ + ": capacity below one block of " +
                            std::to_string(device.alignment_) + " bytes");
  }
  device.capacity_ = capacity;
  return device;
}

Status BackingDevice::probe_alignment() {
  uint64_t offset_align = 0;
  uint64_t memory_align = 0;
#ifdef STATX_DIOALIGN
  // Since Linux 6.1 the kernel states the exact direct-I/O constraints; older kernels leave the
  // bit clear in stx_mask and we fall back to the block size below.
  struct statx stx {};
  if (::statx(fd_.get(), "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
      (stx.stx_mask & STATX_DIOALIGN) != 0 && stx.stx_dio_offset_align != 0) {
    offset_align = stx.stx_dio_offset_align;
    memory_align = stx.stx_dio_mem_align;
  }
#endif
  if (offset_align == 0 && raw_device_) {
    int logical_block = 0;
    if (::ioctl(fd_.get(), BLKSSZGET, &logical_block) == 0 && logical_block > 0) {
      offset_align = static_cast<uint64_t>(logical_block);
    }
  }
  if (offset_align == 0) {
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0) return errno_status(STRATA_E_IO, "fstat of " + path_, errno);
    offset_align = static_cast<uint64_t>(st.st_blksize);
  }
  // 4096 at least: every NVMe drive formatted with 4 KiB sectors needs it, pages are that size,
  // and a uniform unit keeps extents portable between a 512-byte and a 4 KiB device.
  alignment_ = std::max<uint64_t>(kPageSize, next_power_of_two(offset_align));
  memory_alignment_ = std::max<uint64_t>(kPageSize, next_power_of_two(memory_align));
  return Status::ok();
}

Status BackingDevice::remove_swap_file() {
  if (!owns_file_) return Status::ok();
  owns_file_ = false;
  on_signal_.disarm();
  struct stat ours {};
  struct stat at_path {};
  if (::fstat(fd_.get(), &ours) != 0) return errno_status(STRATA_E_IO, "fstat of " + path_, errno);
  if (::fstatat(dir_fd_.get(), file_name_.c_str(), &at_path, AT_SYMLINK_NOFOLLOW) != 0) {
    return errno_status(STRATA_E_IO, "swap file " + path_ + " vanished before removal", errno);
  }
  if (at_path.st_dev != ours.st_dev || at_path.st_ino != ours.st_ino) {
    return io_error("swap file " + path_ +
                    " was replaced by another file behind Strata's back; leaving that one alone");
  }
  if (::unlinkat(dir_fd_.get(), file_name_.c_str(), 0) != 0) {
    return errno_status(STRATA_E_IO, "removing swap file " + path_, errno);
  }
  return Status::ok();
}

Status BackingDevice::rename_kept_file() {
  if (!owns_file_ || !generated_name_) return Status::ok();
  const std::string kept = file_name_ + ".kept";
  if (::renameat(dir_fd_.get(), file_name_.c_str(), dir_fd_.get(), kept.c_str()) != 0) {
    return errno_status(STRATA_E_IO, "renaming the kept swap file " + path_, errno);
  }
  path_ += ".kept";
  file_name_ = kept;
  return Status::ok();
}

Status BackingDevice::close() {
  Status status = keep_ ? rename_kept_file() : remove_swap_file();
  owns_file_ = false;
  on_signal_.disarm();
  fd_.reset();
  dir_fd_.reset();
  return status;
}

BackingDevice::BackingDevice(BackingDevice&& other) noexcept
    : fd_(std::move(other.fd_)),
      dir_fd_(std::move(other.dir_fd_)),
      path_(std::move(other.path_)),
      file_name_(std::move(other.file_name_)),
      capacity_(other.capacity_),
      alignment_(other.alignment_),
      memory_alignment_(other.memory_alignment_),
      direct_io_(other.direct_io_),
      raw_device_(other.raw_device_),
      keep_(other.keep_),
      owns_file_(std::exchange(other.owns_file_, false)),
      generated_name_(other.generated_name_),
      on_signal_(std::move(other.on_signal_)) {}

BackingDevice& BackingDevice::operator=(BackingDevice&& other) noexcept {
  if (this != &other) {
    (void)close();
    fd_ = std::move(other.fd_);
    dir_fd_ = std::move(other.dir_fd_);
    path_ = std::move(other.path_);
    file_name_ = std::move(other.file_name_);
    capacity_ = other.capacity_;
    alignment_ = other.alignment_;
    memory_alignment_ = other.memory_alignment_;
    direct_io_ = other.direct_io_;
    raw_device_ = other.raw_device_;
    keep_ = other.keep_;
    owns_file_ = std::exchange(other.owns_file_, false);
    generated_name_ = other.generated_name_;
    on_signal_ = std::move(other.on_signal_);
  }
  return *this;
}

BackingDevice::~BackingDevice() {
  (void)close();
}

}  // namespace strata::storage
