#include "common/status.h"

#include <cstring>

namespace strata {

Status errno_status(int code, const std::string& what, int errno_value) {
  return Status::error(code, what + ": " + std::strerror(errno_value) + " (errno " +
                                 std::to_string(errno_value) + ")");
}

}  // namespace strata
