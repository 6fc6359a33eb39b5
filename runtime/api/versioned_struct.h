// The one rule for every versioned struct of the C API (docs/c-api.md, "Versioned structs").
//
// A struct that starts with `size_t struct_size` may come from an older header (smaller) or a
// newer one (larger) than this library's. struct_size must be a multiple of 8, at least the size
// the struct had in the first header that shipped it (kFirstVersionSize: no real program passes
// less, and accepting less would let a call succeed with its essential fields unread or
// unwritten, an acquire without its data pointer), and at most 64 KiB. Every versioned struct is
// 8-byte aligned and its fields are at most 8 bytes and naturally aligned, so a multiple of 8
// never cuts a field in two.
//  - In (the library reads it): fields that lie within struct_size are read; fields beyond it
//    take the defaults the caller of read_struct_in passes (the *_init values). Bytes past this
//    library's sizeof are fields it does not know: they must be zero (their defaults), else
//    STRATA_E_UNSUPPORTED, since ignoring a setting the caller made would be a silent departure.
//  - Out (the library writes it): fields within struct_size are written; bytes past this
//    library's sizeof are zeroed, so a newer caller reads 0 for what this library cannot know.
#pragma once

#include <strata/strata.h>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <string>

#include "common/status.h"

namespace strata::api {

inline constexpr size_t kStructSizeAlignment = 8;
inline constexpr size_t kMaxStructSize = 65536;

template <typename T>
concept VersionedStruct = requires(T t) {
  { t.struct_size } -> std::convertible_to<size_t>;
}
&&alignof(T) == kStructSizeAlignment&& offsetof(T, struct_size) == 0;

// The size each struct had in the first header that shipped it. Only strata_config has grown
// since (trace_events, planned_tensors, the ZeRO-Infinity sizes and nvme_layout came after
// numa_node), and strata_tensor_desc (flags) and strata_stats (the by-kind NVMe counters);
// every other struct is still its first version.
template <VersionedStruct T>
inline constexpr size_t kFirstVersionSize = sizeof(T);
template <>
inline constexpr size_t kFirstVersionSize<strata_config> =
    (offsetof(strata_config, numa_node) + sizeof(int) + kStructSizeAlignment - 1) /
    kStructSizeAlignment* kStructSizeAlignment;

// strata_tensor_desc gained flags (STRATA_TENSOR_READ_ONLY) after home_tier.
template <>
inline constexpr size_t kFirstVersionSize<strata_tensor_desc> =
    (offsetof(strata_tensor_desc, home_tier) + sizeof(strata_tier) + kStructSizeAlignment - 1) /
    kStructSizeAlignment* kStructSizeAlignment;

// strata_stats gained the by-kind NVMe counters after pinned_budget_bytes.
template <>
inline constexpr size_t kFirstVersionSize<strata_stats> = offsetof(strata_stats,
                                                                   nvme_bytes_read_by_kind);

// Where the first version's fields end. A struct of exactly its first version's size is read up
// to there: strata_config's numa_node ends 4 bytes short of the 8-byte boundary, and a first
// version's padding there is no field, though trace_events now lies in those bytes.
template <VersionedStruct T>
inline constexpr size_t kFirstVersionFieldsEnd = kFirstVersionSize<T>;
template <>
inline constexpr size_t kFirstVersionFieldsEnd<strata_config> = offsetof(strata_config, numa_node) +
                                                                sizeof(int);

template <VersionedStruct T>
Status check_struct_size(size_t struct_size, const char* what) {
  constexpr size_t kMin = kFirstVersionSize<T>;
  static_assert(kMin % kStructSizeAlignment == 0 && kMin <= sizeof(T));
  if (struct_size < kMin || struct_size > kMaxStructSize ||
      struct_size % kStructSizeAlignment != 0) {
    return invalid_argument(std::string(what) + ".struct_size is " + std::to_string(struct_size) +
                            ": set it to sizeof(" + what + ") (a multiple of 8, at least " +
                            std::to_string(kMin) + " (its first version), at most 65536)");
  }
  return Status::ok();
}

// The caller's struct merged over `defaults`, or why it cannot be read.
template <VersionedStruct T>
Result<T> read_struct_in(const T* in, T defaults, const char* what) {
  if (in == nullptr) return invalid_argument(std::string(what) + " is NULL");
  const size_t size = in->struct_size;
  STRATA_TRY(check_struct_size<T>(size, what));
  if (size > sizeof(T)) {
    const auto* extra = reinterpret_cast<const unsigned char*>(in) + sizeof(T);
    if (std::any_of(extra, extra + (size - sizeof(T)), [](unsigned char b) { return b != 0; })) {
      return unsupported(std::string(what) + " sets fields this library (" + strata_version() +
                         ") does not know; use a newer libstrata");
    }
  }
  const size_t fields =
      size == kFirstVersionSize<T> ? kFirstVersionFieldsEnd<T> : std::min(size, sizeof(T));
  std::memcpy(&defaults, in, fields);
  defaults.struct_size = sizeof(T);
  return defaults;
}

// Checks an out-struct before any work is done, so a bad size fails before side effects.
template <VersionedStruct T>
Status check_struct_out(const T* out, const char* what) {
  if (out == nullptr) return invalid_argument(std::string(what) + " is NULL");
  return check_struct_size<T>(out->struct_size, what);
}

// Writes `value` into the caller's struct (checked by check_struct_out) as far as it reaches.
template <VersionedStruct T>
void write_struct_out(T* out, T value) {
  const size_t size = out->struct_size;
  value.struct_size = size;
  std::memcpy(out, &value, std::min(size, sizeof(T)));
  if (size > sizeof(T)) {
    std::memset(reinterpret_cast<unsigned char*>(out) + sizeof(T), 0, size - sizeof(T));
  }
}

// strata_tensor_desc has no _init function: the defaults read_struct_in merges a caller's desc
// into (an fp32 parameter of no layer, at home on NVMe), for fields a smaller desc would lack.
inline strata_tensor_desc default_tensor_desc() {
  strata_tensor_desc d{};
  d.struct_size = sizeof d;
  d.dtype = STRATA_DTYPE_F32;
  d.kind = STRATA_KIND_PARAMETER;
  d.layer = -1;
  d.home_tier = STRATA_TIER_NVME;
  return d;
}

// Element i of a caller's array of versioned structs: the array's stride is the struct_size of
// its first element (the caller's sizeof), so an array from an older or newer header is walked
// as the caller laid it out.
template <VersionedStruct T>
Result<T> read_array_element_in(const T* array, size_t i, T defaults, const char* what) {
  const size_t stride = array[0].struct_size;
  STRATA_TRY(check_struct_size<T>(stride, what));
  const auto* element =
      reinterpret_cast<const T*>(reinterpret_cast<const unsigned char*>(array) + i * stride);
  if (element->struct_size != stride) {
    return invalid_argument(std::string(what) + "[" + std::to_string(i) + "].struct_size is " +
                            std::to_string(element->struct_size) + ", element 0's is " +
                            std::to_string(stride) + ": every element must have the same");
  }
  return read_struct_in(element, defaults, what);
}

}  // namespace strata::api
