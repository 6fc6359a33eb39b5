#include "storage/output_path.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/unique_fd.h"
#include "storage/owned_names.h"

namespace strata::storage {

Status check_output_path(const std::string& path, const std::string& option) {
  const std::string what = option + " " + path;
  if (path.empty()) return invalid_argument(option + ": an empty path");
  if (path.back() == '/') return invalid_argument(what + " names a directory; give a file name");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return invalid_argument(what + " is a directory; give a file name");
    UniqueFd existing(::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK));
    if (!existing.valid())
      return errno_status(STRATA_E_INVALID, what + " cannot be written", errno);
  } else if (errno != ENOENT) {
    return errno_status(STRATA_E_INVALID, what, errno);
  }
  // A file beside it, created and removed: proves the directory exists and takes new files.
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd.valid()) {
    return errno_status(STRATA_E_INVALID, what + ": its directory " + dir + " is unusable", errno);
  }
  const std::string probe = generated_name(".swap");
  UniqueFd created(::openat(dir_fd.get(), probe.c_str(),
                            O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!created.valid()) {
    return errno_status(STRATA_E_INVALID, what + ": cannot create files in " + dir, errno);
  }
  ::unlinkat(dir_fd.get(), probe.c_str(), 0);
  return Status::ok();
}

}  // namespace strata::storage
