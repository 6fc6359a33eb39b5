#include "common/report.h"

#include <algorithm>
#include <cstdio>

namespace strata {

double gbps(uint64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
}

std::string fixed(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  return buffer;
}

std::string signed_percent(double fraction, int decimals) {
  const std::string magnitude = fixed(100.0 * (fraction < 0 ? -fraction : fraction), decimals);
  const bool zero = magnitude.find_first_not_of("0.") == std::string::npos;
  return (zero ? "" : fraction < 0 ? "-" : "+") + magnitude + "%";
}

std::string Table::render() const {
  std::vector<size_t> widths;
  for (const auto& row : rows_) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  std::string out;
  for (size_t r = 0; r < rows_.size(); ++r) {
    const auto& row = rows_[r];
    for (size_t i = 0; i < row.size(); ++i) {
      const std::string pad(widths[i] - row[i].size(), ' ');
      out += i == 0 ? row[i] + pad : "  " + pad + row[i];
    }
    out += '\n';
    if (r == 0) {
      size_t total = 0;
      for (size_t w : widths) total += w + 2;
      out += std::string(total - 2, '-') + '\n';
    }
  }
  return out;
}

}  // namespace strata
