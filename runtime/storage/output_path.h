// Output files named on the command line (--trace, --plot, ...), checked before a command starts
// its work: a path that cannot be written fails in the first second with exit status 2, instead
// of losing a finished benchmark's result (or a plan's trace) at the end. Used by `strata bench`
// and `strata plan`.
#pragma once

#include <string>

#include "common/status.h"

namespace strata::storage {

// OK when `path` can be created or overwritten, and files can be created beside it (commands
// write partial and data files next to their outputs). Nothing is left behind by the check, and
// an existing file is not modified. `option` names the flag in the message ("--trace").
Status check_output_path(const std::string& path, const std::string& option);

}  // namespace strata::storage
