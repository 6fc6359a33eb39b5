#include "common/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>

namespace strata {

std::optional<uint64_t> parse_bytes(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0) return std::nullopt;
  const std::string number(text.substr(0, i));
  if (number.find('.') != number.rfind('.')) return std::nullopt;
  std::string_view suffix = text.substr(i);
  uint64_t multiplier = 1;
  if (!suffix.empty()) {
    switch (std::toupper(static_cast<unsigned char>(suffix[0]))) {
      case 'K':
        multiplier = 1ULL << 10;
        break;
      case 'M':
        multiplier = 1ULL << 20;
        break;
      case 'G':
        multiplier = 1ULL << 30;
        break;
      case 'T':
        multiplier = 1ULL << 40;
        break;
      case 'B':
        multiplier = 1;
        break;
      default:
        return std::nullopt;
    }
    // "G", "GB", "GiB", in any case: all binary (RAM and budgets are sold and set that way).
    std::string rest(suffix.substr(1));
    for (char& ch : rest) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (multiplier == 1) {
      if (!rest.empty()) return std::nullopt;
    } else if (!(rest.empty() || rest == "b" || rest == "ib")) {
      return std::nullopt;
    }
  }
  char* end = nullptr;
  const long double value = std::strtold(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(value)) return std::nullopt;
  // Rounded as long double and converted directly: llround's long long overflows above 2^63
  // (it turned "10000000000000000000" into 2^63), and 2^64 itself does not fit a uint64_t.
  const long double bytes = std::roundl(value * static_cast<long double>(multiplier));
  if (bytes >= 18446744073709551616.0L) return std::nullopt;
  return static_cast<uint64_t>(bytes);
}

namespace {

std::string format_bytes_rounded(uint64_t bytes, bool up) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  // Up: the least hundredth at or above the value (a figure already at a hundredth stays).
  if (up) value = std::ceil(value * 100.0 - 1e-7) / 100.0;
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.2f %s", value, kUnits[unit]);
  return buffer;
}

}  // namespace

std::string format_bytes(uint64_t bytes) {
  return format_bytes_rounded(bytes, /*up=*/false);
}

std::string format_bytes_up(uint64_t bytes) {
  return format_bytes_rounded(bytes, /*up=*/true);
}

}  // namespace strata
