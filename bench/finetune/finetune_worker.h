// The worker process of `strata bench finetune`: one strategy, one runtime, K training steps
// driven through the public C API exactly as a framework would drive it, measured from inside
// the process (so that peak host memory is this strategy's alone).
//
// It talks to the parent over one pipe, one JSON object per line:
//   {"event":"progress", "strategy", "step", "phase", "unit", "fraction"}
//   {"event":"metrics", "strategy", "host_bytes", "pinned_bytes", "device_bytes",
//    "nvme_read_bytes", "nvme_write_bytes", "stall_seconds"}        (about every 250 ms)
//   {"event":"result", ...}                                          (once, at the end)
//   {"event":"error", "message"}                                     (instead of a result)
#pragma once

#include <string>

#include "finetune/finetune_options.h"

namespace strata::bench::finetune {

// Runs the experiment for a Strata contender, writing events to `fd`. trace_path: where to
// write this worker's trace (its own spans plus the runtime's); empty: no trace. Returns the
// process exit code (0, or 1 after an "error" event).
int run_strata_worker(const FinetunePlan& plan, const Contender& contender, int fd,
                      const std::string& trace_path);

// The same for a DeepSpeed contender (deepspeed_worker.cpp): DeepSpeed ZeRO-3's step with its
// buffers, files and aio handles, and the same events.
int run_deepspeed_worker(const FinetunePlan& plan, const Contender& contender, int fd,
                         const std::string& trace_path);

}  // namespace strata::bench::finetune
