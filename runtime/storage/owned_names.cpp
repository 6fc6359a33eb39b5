#include "storage/owned_names.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <random>

#include "common/owner_process.h"
#include "common/unique_fd.h"

namespace strata::storage {
namespace {

// Everything generated_name() is called with; other names are never Strata's.
constexpr const char* kSuffixes[] = {".swap", ".tensors", ".bench-io"};

bool has_owned_suffix(const std::string& name, std::string* stem) {
  for (const char* suffix : kSuffixes) {
    const size_t n = std::strlen(suffix);
    if (name.size() > n && name.compare(name.size() - n, n, suffix) == 0) {
      *stem = name.substr(0, name.size() - n);
      return true;
    }
  }
  return false;
}

bool all_of(const std::string& s, int (*is)(int)) {
  if (s.empty()) return false;
  for (char c : s) {
    if (is(static_cast<unsigned char>(c)) == 0) return false;
  }
  return true;
}

// Bytes allocated to a file, or to the plain files of a directory.
uint64_t allocated_bytes(int dir_fd, const std::string& name, bool directory) {
  struct stat st {};
  if (!directory) {
    return ::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0
               ? static_cast<uint64_t>(st.st_blocks) * 512
               : 0;
  }
  const int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return 0;
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    ::close(fd);
    return 0;
  }
  uint64_t total = 0;
  while (dirent* e = ::readdir(d)) {
    if (::fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode)) {
      total += static_cast<uint64_t>(st.st_blocks) * 512;
    }
  }
  ::closedir(d);
  return total;
}

// Opens `name` for its owner lock: never through a symlink, never blocking on a FIFO.
UniqueFd open_for_lock(int dir_fd, const std::string& name, bool directory) {
  const int flags = O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | (directory ? O_DIRECTORY : 0);
  return UniqueFd(::openat(dir_fd, name.c_str(), flags));
}

Status remove_locked_directory(int dir_fd, int fd, const std::string& name,
                               const std::string& path) {
  DIR* d = ::fdopendir(::dup(fd));
  if (d == nullptr) return errno_status(STRATA_E_IO, "reading " + path, errno);
  Status status = Status::ok();
  while (dirent* e = ::readdir(d)) {
    const std::string entry = e->d_name;
    if (entry == "." || entry == "..") continue;
    struct stat st {};
    std::string where = path;
    where += '/';
    where += entry;
    if (::fstatat(fd, entry.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || S_ISDIR(st.st_mode)) {
      status = io_error(where + " is not a file Strata made; left in place");
      continue;
    }
    if (::unlinkat(fd, entry.c_str(), 0) != 0 && errno != ENOENT) {
      status = errno_status(STRATA_E_IO, "removing " + where, errno);
    }
  }
  ::closedir(d);
  if (!status) return status;
  if (::unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR) != 0) {
    return errno_status(STRATA_E_IO, "removing " + path, errno);
  }
  return Status::ok();
}

Status remove_orphan_at(int dir_fd, const std::string& dir, const std::string& name) {
  const std::string path = dir + (dir.empty() || dir.back() == '/' ? "" : "/") + name;
  const std::optional<OwnerStamp> owner = parse_owned_name(name);
  if (!owner) return invalid_argument(path + " is not a name Strata makes; not touched");
  if (owner_alive(*owner)) {
    return Status::error(STRATA_E_STATE, path + " belongs to running process " +
                                             std::to_string(owner->pid) + "; not removed");
  }
  struct stat at_path {};
  if (::fstatat(dir_fd, name.c_str(), &at_path, AT_SYMLINK_NOFOLLOW) != 0) {
    return errno_status(STRATA_E_INVALID, path, errno);
  }
  const bool directory = S_ISDIR(at_path.st_mode);
  if (!directory && !S_ISREG(at_path.st_mode)) {
    return invalid_argument(path + " is neither a file nor a directory; not touched");
  }
  UniqueFd fd = open_for_lock(dir_fd, name, directory);
  if (!fd.valid()) return errno_status(STRATA_E_IO, "opening " + path, errno);
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return Status::error(STRATA_E_STATE, path +
                                               " is locked by a live process (another pid "
                                               "namespace?); not removed");
    }
    return errno_status(STRATA_E_IO, "locking " + path, errno);
  }
  // Under the lock, the name must still be what was opened.
  struct stat ours {};
  if (::fstat(fd.get(), &ours) != 0 ||
      ::fstatat(dir_fd, name.c_str(), &at_path, AT_SYMLINK_NOFOLLOW) != 0 ||
      ours.st_dev != at_path.st_dev || ours.st_ino != at_path.st_ino) {
    return io_error(path + " changed while being removed; left in place");
  }
  if (directory) return remove_locked_directory(dir_fd, fd.get(), name, path);
  if (::unlinkat(dir_fd, name.c_str(), 0) != 0) {
    return errno_status(STRATA_E_IO, "removing " + path, errno);
  }
  return Status::ok();
}

}  // namespace

std::string generated_name(const char* suffix) {
  std::random_device entropy;
  const uint64_t salt = (uint64_t{entropy()} << 32) | entropy();
  char random[17];
  std::snprintf(random, sizeof(random), "%016" PRIx64, salt);
  return "strata-" + format_stamp(this_process_stamp()) + "-" + random + suffix;
}

std::optional<OwnerStamp> parse_owned_name(const std::string& name) {
  std::string stem;
  if (name.rfind("strata-", 0) != 0 || !has_owned_suffix(name, &stem)) return std::nullopt;
  // "<stamp>-<16 hex digits>"
  const size_t dash = stem.rfind('-');
  if (dash == std::string::npos || dash < 7) return std::nullopt;
  const std::string random = stem.substr(dash + 1);
  if (random.size() != 16 || !all_of(random, ::isxdigit)) return std::nullopt;
  return parse_stamp(std::string_view(stem).substr(7, dash - 7));
}

Result<std::vector<Orphan>> find_orphans(const std::string& dir) {
  UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd.valid()) return errno_status(STRATA_E_INVALID, "reading " + dir, errno);
  DIR* d = ::fdopendir(::dup(dir_fd.get()));
  if (d == nullptr) return errno_status(STRATA_E_IO, "reading " + dir, errno);
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  std::vector<Orphan> orphans;
  for (const std::string& name : names) {
    const std::optional<OwnerStamp> owner = parse_owned_name(name);
    if (!owner || owner_alive(*owner)) continue;
    struct stat st {};
    if (::fstatat(dir_fd.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    const bool directory = S_ISDIR(st.st_mode);
    if (!directory && !S_ISREG(st.st_mode)) continue;
    UniqueFd fd = open_for_lock(dir_fd.get(), name, directory);
    if (!fd.valid()) continue;
    if (::flock(fd.get(), LOCK_SH | LOCK_NB) != 0) continue;  // a live owner holds it
    orphans.push_back({name, *owner, allocated_bytes(dir_fd.get(), name, directory), directory});
  }
  return orphans;
}

Status remove_orphan(const std::string& dir, const std::string& name) {
  UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd.valid()) return errno_status(STRATA_E_INVALID, "opening " + dir, errno);
  return remove_orphan_at(dir_fd.get(), dir, name);
}

int remove_orphans(int dir_fd) {
  DIR* d = ::fdopendir(::dup(dir_fd));
  if (d == nullptr) return 0;
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    if (parse_owned_name(e->d_name)) names.emplace_back(e->d_name);
  }
  ::closedir(d);
  int removed = 0;
  for (const std::string& name : names) {
    if (remove_orphan_at(dir_fd, "", name).is_ok()) ++removed;
  }
  return removed;
}

Status lock_as_owner(int fd, const std::string& path) {
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    return errno_status(STRATA_E_IO, "taking the owner lock on " + path, errno);
  }
  return Status::ok();
}

}  // namespace strata::storage
