// Whether this test binary runs under AddressSanitizer or ThreadSanitizer, which replace mlock
// with a no-op and own the process's RSS: tests that measure either skip those checks. gcc
// defines __SANITIZE_*__; clang answers __has_feature.
#pragma once

namespace strata::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace strata::testing
