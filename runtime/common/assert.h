// Invariant checks that stay on in release builds (TigerBeetle style). They guard against bugs in
// Strata itself, never against bad input: bad input is a Status.
#pragma once

#include <cstdio>
#include <cstdlib>

#define STRATA_ASSERT(cond)                                                                 \
  do {                                                                                      \
    if (__builtin_expect(!(cond), 0)) {                                                     \
      std::fprintf(stderr, "strata: invariant violated at %s:%d: %s\n", __FILE__, __LINE__, \
                   #cond);                                                                  \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)
