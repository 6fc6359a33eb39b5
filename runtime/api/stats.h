// strata_get_stats' internal half: one strata_stats assembled from the records that own each
// fact, none of them copied into a second count.
//
//   in use, by tier, kind and peak  the scheduler (sched::Scheduler::usage()), which charges every
//                                   tensor's buffers and extents
//   pinned reserved                 the pinned arena: pages mapped, the recycler's kept buffers
//                                   included
//   device reserved                 the device arena's slab (held from open to close)
//   NVMe reserved                   the swap file or device's capacity
//   NVMe bytes read / written       the extent store (successful, verified transfers)
//   OS figures                      /proc/self/status and the runtime's sampler
//   pinned budget                   the runtime's config, as given or as automatic sizing set it
//
// The host tier (pageable buffers of Strata's own) is always 0: Strata holds host memory pinned.
#pragma once

#include <strata/strata.h>

namespace strata::api {

class Runtime;

// Every field of the current strata_stats; the caller copies out what its struct_size holds.
strata_stats collect_stats(Runtime& runtime);

}  // namespace strata::api
