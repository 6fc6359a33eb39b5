// Picks and builds an I/O engine. Callers depend on IoEngine only.
#pragma once

#include <memory>
#include <optional>
#include <string_view>

#include "common/status.h"
#include "io/io_engine.h"

namespace strata::io {

enum class IoEngineKind { kAuto, kUring, kPsync };

// kAuto: io_uring when probe_uring() says it works, else psync. kUring: STRATA_E_UNSUPPORTED
// with the probe's reason where io_uring is unavailable. kPsync: always.
Result<std::unique_ptr<IoEngine>> make_io_engine(IoEngineKind kind, const IoEngineOptions& options);

// "auto" / "uring" / "io_uring" / "psync" <-> IoEngineKind, for the CLI and config.
std::optional<IoEngineKind> parse_io_engine_kind(std::string_view text);
const char* io_engine_kind_name(IoEngineKind kind);

}  // namespace strata::io
