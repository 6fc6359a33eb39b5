// Who made a file, in a form that survives the maker: "<pid>-<start time>" of a process. Files
// that Strata leaves only while it runs (checkpoint temporaries) carry their maker's tag in their
// name, so that the next process can tell a stale one (its maker is gone: killed, crashed) from
// one still being written, and remove only the first. The start time (clock ticks since boot,
// /proc/PID/stat field 22) tells a reused pid from the original maker.
#pragma once

#include <string>
#include <string_view>

namespace strata {

// This process's tag, "<pid>-<start time>".
std::string owner_tag();

// False only when the tag's process is certainly gone: no such pid, or a pid whose start time
// differs (reused). A tag that does not parse, or a process we may not inspect, counts as alive:
// a file is never removed on a guess.
bool owner_alive(std::string_view tag);

}  // namespace strata
