// Names of what Strata creates in a directory the user named (swap files, file-per-tensor
// directories, benchmark files), made so that a later process can tell whether the creator is
// still alive, and orphans - left by a process that died without removing them (SIGKILL, a
// crash, a power cut) - can be found and removed safely.
//
//   strata-<pid>-<boot>-<start>-<random><suffix>
//   e.g. strata-4242-5f3c9a1e-183562-1c0ffee5deadbeef.swap
//
// <pid>-<boot>-<start> is the creator's stamp (common/owner_process.h: the pid, the boot and the
// start time tell a live owner from a reused pid or an earlier boot).
//
// Liveness by pid cannot see processes of another pid namespace (a container sharing the
// directory), so the owner also holds an flock(LOCK_EX) on what it created for as long as it
// lives (the kernel drops it at exit, however the process ends). An orphan is removed only when
// both say so: its owner is not alive by pid and its lock can be taken. The pid check covers the
// instant between creating a file and locking it; the lock covers other namespaces.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/owner_process.h"
#include "common/status.h"

namespace strata::storage {

// A fresh owner-stamped name for this process; creators retry with a new one on EEXIST, a few
// times (the random part makes a collision a deliberate act).
std::string generated_name(const char* suffix);
inline constexpr int kGeneratedNameAttempts = 8;

// The owner of a name is a process stamp (common/owner_process.h).
using strata::owner_alive;
using strata::OwnerStamp;

// The stamp in a name made by generated_name() with one of Strata's suffixes; nullopt for any
// other name (which Strata never touches).
std::optional<OwnerStamp> parse_owned_name(const std::string& name);

struct Orphan {
  std::string name;  // inside the directory
  OwnerStamp owner;
  uint64_t bytes = 0;  // allocated on disk (a file-per-tensor directory: its files)
  bool directory = false;
};

// What is left in `dir` by owners that are no longer alive and whose lock is free. Only names of
// Strata's own making are considered; a directory that cannot be read is an error.
Result<std::vector<Orphan>> find_orphans(const std::string& dir);

// Removes one orphan found by find_orphans, checking again under its lock that no live process
// owns it. STRATA_E_STATE when the owner turned out to be alive; nothing is removed then.
Status remove_orphan(const std::string& dir, const std::string& name);

// Removes every orphan in `dir`; returns how many went (errors on single entries are skipped:
// this is housekeeping at runtime creation, never a reason to fail it).
int remove_orphans(int dir_fd);

// Takes the owner lock on a descriptor of something just created (LOCK_EX, never blocks).
Status lock_as_owner(int fd, const std::string& path);

}  // namespace strata::storage
