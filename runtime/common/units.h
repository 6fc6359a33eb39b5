// Byte sizes as people write them ("4K", "1M", "2G", "1.5G") and as they read them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace strata {

// Parses a non-negative byte count with an optional K/M/G/T suffix (powers of 1024; an optional
// trailing "iB" or "B" is accepted). Returns nullopt on anything else, including overflow.
std::optional<uint64_t> parse_bytes(std::string_view text);

// "1.50 GiB", "512.00 MiB", "4096 B": rounded to the nearest hundredth of the unit.
std::string format_bytes(uint64_t bytes);

// format_bytes rounded up at its hundredth: for a requirement ("recommended 123.18 GiB" of
// 123.1738), so that the printed figure, given back (--host-ram 123.18G), meets it. Rounded to
// nearest it read 123.17, which does not.
std::string format_bytes_up(uint64_t bytes);

}  // namespace strata
