#include "common/status.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstring>

namespace strata {

std::string errno_text(int errno_value) {
  char buffer[256];
  // GNU strerror_r: returns the message, in `buffer` or a static string of its own.
  return ::strerror_r(errno_value, buffer, sizeof buffer);
}

Status errno_status(int code, const std::string& what, int errno_value) {
  std::string message =
      what + ": " + errno_text(errno_value) + " (errno " + std::to_string(errno_value) + ")";
  // Running out of file descriptors is a limit the user can raise, whichever call met it: say
  // which limit, its value and how, instead of a bare I/O or "unsupported" error.
  if (errno_value == EMFILE || errno_value == ENFILE) {
    rlimit limit{};
    ::getrlimit(RLIMIT_NOFILE, &limit);
    message += errno_value == EMFILE
                   ? ": the open-file limit RLIMIT_NOFILE is " + std::to_string(limit.rlim_cur) +
                         " (hard " + std::to_string(limit.rlim_max) +
                         "); raise it (ulimit -n, LimitNOFILE= in systemd, docker run --ulimit "
                         "nofile=...) or close files"
                   : ": the system-wide file table is full (fs.file-max)";
    return Status::error(STRATA_E_LIMIT, std::move(message));
  }
  return Status::error(code, std::move(message));
}

}  // namespace strata
