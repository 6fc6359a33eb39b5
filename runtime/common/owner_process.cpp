#include "common/owner_process.h"

#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <csignal>
#include <fstream>
#include <sstream>

namespace strata {
namespace {

// Field 22 of /proc/PID/stat (starttime), or "" when the process does not exist or cannot be read.
std::string start_time_of(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  // Field 2 (comm) is in parentheses and may hold spaces: count fields after its last ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return "";
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  for (int index = 3; index <= 22 && (rest >> field); ++index) {
    if (index == 22) return field;
  }
  return "";
}

bool parse_pid(std::string_view text, long* pid) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *pid);
  return ec == std::errc() && end == text.data() + text.size() && *pid > 0;
}

}  // namespace

std::string owner_tag() {
  const long pid = static_cast<long>(::getpid());
  return std::to_string(pid) + "-" + start_time_of(pid);
}

bool owner_alive(std::string_view tag) {
  const size_t dash = tag.find('-');
  long pid = 0;
  if (!parse_pid(tag.substr(0, dash), &pid)) return true;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  if (dash == std::string_view::npos) return true;  // a pid alone: alive as far as we can tell
  const std::string now = start_time_of(pid);
  // Unreadable /proc (another pid namespace, hidepid): alive, as far as we can tell.
  if (now.empty()) return true;
  return now == tag.substr(dash + 1);
}

}  // namespace strata
