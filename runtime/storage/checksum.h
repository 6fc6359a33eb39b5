// Content checksums for NVMe extents: XXH3-64. It runs at memory bandwidth on one core (see
// docs/storage.md for the measurement), well above an NVMe drive's 3-7 GB/s, so every extent
// is checksummed on write and verified on read without becoming the bottleneck. It detects
// corruption (bit rot, torn or misdirected writes, writes behind Strata's back); it is not a
// cryptographic MAC and does not defend against a deliberate forger.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::storage {

uint64_t checksum(const void* data, size_t bytes);

}  // namespace strata::storage
