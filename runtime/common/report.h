// Plain-text output shared by `strata plan`, `strata doctor` and `strata bench ...`: rates and a
// table a person reads at a glance.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata {

// Decimal gigabytes per second, as fio and drive datasheets report them.
double gbps(uint64_t bytes, double seconds);

// Left column left-aligned, the rest right-aligned; widths fit the widest cell.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void add_row(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string render() const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

// "%.2f" without iostream ceremony.
std::string fixed(double value, int decimals = 2);

// A relative change as a percentage with its sign written once: 0.032 -> "+3.2%", -0.557 ->
// "-55.7%", and "0.0%" for anything that rounds to zero (never "-0.0%" or "(--5.3%)").
std::string signed_percent(double fraction, int decimals = 1);

}  // namespace strata
