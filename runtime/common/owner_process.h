// Who made a file, in a form that outlives the maker: the process's stamp, "<pid>-<boot>-<start>".
// Files Strata leaves only while it runs (swap files, checkpoint temporaries) carry their maker's
// stamp in their name, so a later process can tell a stale one (its maker is gone: killed,
// crashed, the machine rebooted) from one still in use, and remove only the first.
//
// <pid> and <start> (the process's start time in clock ticks since boot, /proc/PID/stat field
// 22) identify the process even after its pid is reused; <boot> (8 hex digits of
// /proc/sys/kernel/random/boot_id) says which boot it ran in. A stamp's process is alive when it
// ran in this boot and /proc/<pid> shows the same start time.
//
// Liveness by pid cannot see processes of another pid namespace (a container sharing the
// directory), so the makers also hold an flock on what they made (storage/owned_names.h,
// optim/checkpoint_file.cpp), and removers check both.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace strata {

struct OwnerStamp {
  pid_t pid = 0;
  std::string boot;  // 8 hex digits
  uint64_t start_ticks = 0;
};

// This process's stamp.
OwnerStamp this_process_stamp();

// "<pid>-<boot>-<start>", and back; parse_stamp returns nullopt for anything not of that form.
std::string format_stamp(const OwnerStamp& stamp);
std::optional<OwnerStamp> parse_stamp(std::string_view text);

// Whether the stamped process is running now (same boot, same pid, same start time).
bool owner_alive(const OwnerStamp& owner);

}  // namespace strata
