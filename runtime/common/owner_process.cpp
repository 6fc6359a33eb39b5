#include "common/owner_process.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <sstream>

namespace strata {
namespace {

std::string read_boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  std::string hex;
  for (char c : id) {
    if (std::isxdigit(static_cast<unsigned char>(c)) != 0) hex += c;
    if (hex.size() == 8) return hex;
  }
  return "00000000";  // no /proc: liveness then rests on the pid and the lock
}

const std::string& boot_id() {
  static const std::string id = read_boot_id();
  return id;
}

// Field 22 of /proc/PID/stat; nullopt when there is no such process (or no /proc).
std::optional<uint64_t> start_ticks_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  // The command name (field 2) is in parentheses and may hold spaces or ')': skip to the last.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i) {
    if (!(rest >> field)) return std::nullopt;
  }
  uint64_t ticks = 0;
  const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), ticks);
  if (ec != std::errc() || end != field.data() + field.size()) return std::nullopt;
  return ticks;
}

template <typename T>
bool parse_decimal(std::string_view text, size_t max_digits, T* out) {
  if (text.empty() || text.size() > max_digits) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

}  // namespace

OwnerStamp this_process_stamp() {
  OwnerStamp stamp;
  stamp.pid = ::getpid();
  stamp.boot = boot_id();
  stamp.start_ticks = start_ticks_of(stamp.pid).value_or(0);
  return stamp;
}

std::string format_stamp(const OwnerStamp& stamp) {
  return std::to_string(stamp.pid) + "-" + stamp.boot + "-" + std::to_string(stamp.start_ticks);
}

std::optional<OwnerStamp> parse_stamp(std::string_view text) {
  const size_t first = text.find('-');
  if (first == std::string_view::npos) return std::nullopt;
  const size_t second = text.find('-', first + 1);
  if (second == std::string_view::npos) return std::nullopt;
  OwnerStamp stamp;
  long pid = 0;
  const std::string_view boot = text.substr(first + 1, second - first - 1);
  if (!parse_decimal(text.substr(0, first), 9, &pid) || pid <= 0 || boot.size() != 8 ||
      !std::all_of(boot.begin(), boot.end(),
                   [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }) ||
      !parse_decimal(text.substr(second + 1), 19, &stamp.start_ticks)) {
    return std::nullopt;
  }
  stamp.pid = static_cast<pid_t>(pid);
  stamp.boot = boot;
  return stamp;
}

bool owner_alive(const OwnerStamp& owner) {
  if (owner.boot != boot_id()) return false;  // that boot is over
  const std::optional<uint64_t> start = start_ticks_of(owner.pid);
  return start.has_value() && *start == owner.start_ticks;
}

}  // namespace strata
