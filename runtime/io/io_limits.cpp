#include "io/io_limits.h"

#include <string>

namespace strata::io {

Status validate_options(const IoEngineOptions& options) {
  if (options.queue_depth == 0 || options.queue_depth > kMaxQueueDepth) {
    return invalid_argument("io engine: queue_depth " + std::to_string(options.queue_depth) +
                            " is outside 1.." + std::to_string(kMaxQueueDepth));
  }
  if (options.block_size == 0 || options.block_size > kMaxBlockSize ||
      !is_aligned(options.block_size, kIoAlignment)) {
    return invalid_argument("io engine: block_size " + std::to_string(options.block_size) +
                            " must be a multiple of " + std::to_string(kIoAlignment) +
                            " between 4 KiB and 1 GiB");
  }
  if (options.threads == 0 || options.threads > kMaxThreads) {
    return invalid_argument("io engine: threads " + std::to_string(options.threads) +
                            " is outside 1.." + std::to_string(kMaxThreads));
  }
  return Status::ok();
}

}  // namespace strata::io
