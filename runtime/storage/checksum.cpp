#include "storage/checksum.h"

#include <xxhash.h>

namespace strata::storage {

uint64_t checksum(const void* data, size_t bytes) {
  return XXH3_64bits(data, bytes);
}

}  // namespace strata::storage
