// libFuzzer target: the input is a program of C API calls run against a small runtime created
// for that input alone (tiny budgets, a few MiB of swap file). Handles, sizes, offsets, flags,
// tiers and struct sizes are drawn from the input, valid and invalid alike. Checked on every call:
//  - it returns STRATA_OK or a known STRATA_E_* code, never STRATA_E_INTERNAL, and a failure
//    leaves a message in strata_last_error;
//  - bytes read back (strata_tensor_read, or an acquire without DISCARD) equal the bytes last
//    written, for every byte the program wrote;
//  - strata_get_stats keeps in use <= reserved, and strata_runtime_destroy succeeds;
//  - the _timeout forms (bounds of 0-20 ms) may answer STRATA_E_TIMEOUT, after which nothing
//    has changed: a timed-out read left the caller's buffer alone, and what a timed-out write
//    or acquire would have changed is checked by the reads that follow.
//
// The program never holds acquisitions that could starve its own next acquire: an acquire waits
// (up to 300 s, by design) for space that only other threads' releases can free, and this
// program is the only thread. Before a call that acquires, it releases what it holds unless the
// pools have room for the held bytes and the new tensor together; before strata_sync and the
// optimizer calls, which acquire or write back tensors of their choosing, it releases everything.
#include <fuzzer/FuzzedDataProvider.h>
#include <strata/strata.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace {

// Out-of-range and garbage values mixed in with valid ones.
constexpr int kMinCode = STRATA_E_INTERNAL;

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "c_api_fuzz: invariant broken: %s: %s\n", what, detail.c_str());
  std::abort();
}

// One directory per fuzzing process, removed at exit; each input's runtime makes and removes its
// own swap file in it.
struct ScratchDir {
  std::string path;
  ScratchDir() {
    const char* base = std::getenv("STRATA_TEST_DIR");
    path = std::string(base != nullptr ? base : "/tmp") + "/c-api-fuzz-XXXXXX";
    if (::mkdtemp(path.data()) == nullptr) fail("mkdtemp", path);
  }
  ~ScratchDir() { std::filesystem::remove_all(path); }
};

const std::string& scratch_dir() {
  static const ScratchDir dir;
  return dir.path;
}

// A struct the program passes in, with the bytes after it that a larger struct_size says are
// there: a caller that claims a newer header's size owns that memory (zero, as the newer
// fields' defaults, or not).
template <typename T>
struct Padded {
  T value{};
  unsigned char tail[64] = {};
};

uint64_t round_up(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

struct Tensor {
  strata_tensor handle = STRATA_TENSOR_NONE;
  uint64_t bytes = 0;
  strata_tier home = STRATA_TIER_NVME;
  // The contents as last written: -1 where undefined (never written, discarded, or modified by
  // the program and released without DIRTY).
  std::vector<int16_t> contents;
  int holds = 0;
  strata_tier held_tier = STRATA_TIER_PINNED;
  void* data = nullptr;
  bool modified = false;  // the program wrote into the acquired buffer
  // No contents in the library's terms (registered and never written, or discarded): a read or a
  // read-mode acquire must be refused (STRATA_E_STATE), never answered with stale bytes.
  bool no_contents = false;
  // Put under the optimizer (as a parameter or its gradient): an optimizer call may rewrite or
  // discard it, so its bytes are undefined afterwards and a read may be refused.
  bool optimized = false;
};

class Program {
 public:
  Program(FuzzedDataProvider& in, strata_runtime* rt, uint64_t pinned, uint64_t device)
      : in_(in), rt_(rt), pinned_budget_(pinned), device_budget_(device) {}

  void run() {
    for (int op = 0; op < 96 && in_.remaining_bytes() > 0; ++op) step();
    release_all();
    verify_all();
  }

 private:
  void check(int rc, const std::string& call_text, bool timeout_allowed = false) {
    const char* call = call_text.c_str();
    // C_API_FUZZ_VERBOSE=1 prints every call: replaying a finding shows the program that made it.
    if (verbose_)
      std::fprintf(stderr, "c_api_fuzz: %s -> %d %s\n", call, rc, rc ? strata_last_error(rt_) : "");
    if (rc > 0 || rc < kMinCode) fail(call, "returned unknown code " + std::to_string(rc));
    // Nothing is injected and nothing waits on another thread: an I/O error, a checksum failure
    // or a timeout here is a bug, as is an internal error.
    if (rc == STRATA_E_INTERNAL || rc == STRATA_E_IO || rc == STRATA_E_CORRUPT ||
        (rc == STRATA_E_TIMEOUT && !timeout_allowed)) {
      fail(call, strata_last_error(rt_));
    }
    if (rc != STRATA_OK && strata_last_error(rt_)[0] == '\0') fail(call, "no last-error message");
  }

  // A handle: a live tensor, a dead one, zero or garbage.
  strata_tensor pick_handle(Tensor** live) {
    *live = nullptr;
    const int how = in_.ConsumeIntegralInRange(0, 9);
    if (how < 7 && !tensors_.empty()) {
      *live = &tensors_[in_.ConsumeIntegralInRange<size_t>(0, tensors_.size() - 1)];
      return (*live)->handle;
    }
    if (how < 8 && !dead_.empty())
      return dead_[in_.ConsumeIntegralInRange<size_t>(0, dead_.size() - 1)];
    if (how < 9) return STRATA_TENSOR_NONE;
    return in_.ConsumeIntegral<uint64_t>();
  }

  strata_tier pick_tier() {
    const int t = in_.ConsumeIntegralInRange(0, 5);
    return t < 4 ? static_cast<strata_tier>(t) : static_cast<strata_tier>(t * 1000 - 7);
  }

  uint64_t pick_bytes() {
    switch (in_.ConsumeIntegralInRange(0, 7)) {
      case 0:
        return 0;
      case 1:
        return in_.ConsumeIntegral<uint64_t>();
      case 2:
        return in_.ConsumeIntegralInRange<uint64_t>(pinned_budget_, 4 * pinned_budget_);
      default:
        return in_.ConsumeIntegralInRange<uint64_t>(1, pinned_budget_ / 2);
    }
  }

  uint64_t held_bytes(bool device_only) const {
    uint64_t total = 0;
    for (const Tensor& t : tensors_) {
      if (t.holds > 0 && (!device_only || t.held_tier == STRATA_TIER_DEVICE)) {
        total += round_up(t.bytes, 4096);
      }
    }
    return total;
  }
  uint64_t home_bytes(strata_tier tier) const {
    uint64_t total = 0;
    for (const Tensor& t : tensors_) {
      if (t.home == tier) total += round_up(t.bytes, 4096);
    }
    return total;
  }

  // Releases what is held unless the new acquisition fits beside it (see the file comment).
  void make_room(const Tensor* target, strata_tier tier) {
    if (target == nullptr) return;
    const uint64_t need = round_up(target->bytes, 4096);
    bool fits = home_bytes(STRATA_TIER_PINNED) + held_bytes(false) + need <= pinned_budget_;
    if (tier == STRATA_TIER_DEVICE) {
      fits = fits && home_bytes(STRATA_TIER_DEVICE) + held_bytes(true) + need <= device_budget_;
    }
    if (!fits) release_all();
  }

  void release_all() {
    for (Tensor& t : tensors_) {
      while (t.holds > 0) release(t, in_.ConsumeBool() ? STRATA_RELEASE_DIRTY : 0);
    }
  }

  void release(Tensor& t, uint32_t flags) {
    const bool dirty = (flags & STRATA_RELEASE_DIRTY) != 0;
    if (t.holds == 1 && dirty && t.contents.size() == t.bytes) {
      const auto* p = static_cast<const uint8_t*>(t.data);
      for (uint64_t i = 0; i < t.bytes; ++i) t.contents[i] = p[i];
    }
    const int rc = strata_release(rt_, t.handle, flags, nullptr);
    check(rc, dirty ? "strata_release (held, dirty)" : "strata_release (held)");
    if (rc != STRATA_OK) fail("strata_release of a held tensor", strata_last_error(rt_));
    if (--t.holds == 0) {
      if (t.modified && !dirty) std::fill(t.contents.begin(), t.contents.end(), -1);
      t.modified = false;
      t.data = nullptr;
    }
  }

  void compare(const Tensor& t, const uint8_t* data, uint64_t offset, uint64_t bytes,
               const char* how) {
    if (t.contents.size() != t.bytes) return;
    for (uint64_t i = 0; i < bytes; ++i) {
      const int16_t want = t.contents[offset + i];
      if (want >= 0 && data[i] != static_cast<uint8_t>(want)) {
        fail(how, "byte " + std::to_string(offset + i) + " of a " + std::to_string(t.bytes) +
                      "-byte tensor is " + std::to_string(data[i]) + ", last written " +
                      std::to_string(want));
      }
    }
  }

  void step() {
    switch (in_.ConsumeIntegralInRange(0, 18)) {
      case 0:
      case 1:
        return op_register();
      case 2:
        return op_malloc();
      case 3:
      case 4:
        return op_write();
      case 5:
        return op_read();
      case 6:
      case 7:
        return op_acquire();
      case 8:
        return op_release();
      case 9:
        return op_discard();
      case 10:
        return op_unregister();
      case 11:
        return op_prefetch();
      case 12:
        return op_loop();
      case 13:
        // A sync waits for write-backs, which may need the pinned room this program's own
        // acquisitions hold: like an acquire, it is never made while holding (file comment).
        release_all();
        return check(strata_sync(rt_), "strata_sync");
      case 14:
        return op_stats();
      case 15:
        return op_schedule();
      case 16:
        return op_trace();
      case 17:
        return op_optimizer();
      default:
        return op_timeout();
    }
  }

  // The _timeout forms, with bounds of 0 to 20 ms: STRATA_E_TIMEOUT is then an answer, after
  // which nothing may have changed (the model is left as it was, and later reads check it).
  void op_timeout() {
    const uint32_t timeout_ms = in_.ConsumeIntegralInRange(0u, 20u);
    switch (in_.ConsumeIntegralInRange(0, 3)) {
      case 0:
        return op_write(timeout_ms);
      case 1:
        return op_read(timeout_ms);
      case 2:
        return op_acquire(timeout_ms);
      default: {
        release_all();  // as for strata_sync (step())
        const int rc = strata_sync_timeout(rt_, timeout_ms);
        return check(rc, "strata_sync_timeout " + std::to_string(timeout_ms),
                     /*timeout_allowed=*/true);
      }
    }
  }

  void op_register() {
    const std::string name = in_.ConsumeRandomLengthString(40);
    Padded<strata_tensor_desc> padded;
    strata_tensor_desc& d = padded.value;
    d.struct_size = in_.ConsumeIntegralInRange(0, 15) == 0
                        ? in_.ConsumeIntegralInRange<size_t>(0, 100)
                        : sizeof d;
    d.name = in_.ConsumeBool() ? name.c_str() : nullptr;
    d.bytes = pick_bytes();
    d.dtype = static_cast<strata_dtype>(in_.ConsumeIntegralInRange(-1, 5));
    d.kind = static_cast<strata_tensor_kind>(in_.ConsumeIntegralInRange(-1, 7));
    d.layer = in_.ConsumeIntegralInRange(-2, 8);
    const int home = in_.ConsumeIntegralInRange(0, 7);
    d.home_tier = home < 5 ? STRATA_TIER_NVME : pick_tier();
    strata_tensor out = STRATA_TENSOR_NONE;
    const int rc =
        strata_tensor_register(rt_, &d, in_.ConsumeIntegralInRange(0, 20) ? &out : nullptr);
    check(rc, "strata_tensor_register bytes " + std::to_string(d.bytes) + " home " +
                  std::to_string(d.home_tier) + " -> " + std::to_string(out));
    if (rc == STRATA_OK) add(out, d.bytes, d.home_tier, /*allocation=*/false);
  }

  void op_malloc() {
    const uint32_t flags = in_.ConsumeIntegralInRange(0, 7) == 0
                               ? in_.ConsumeIntegral<uint32_t>()
                               : in_.ConsumeIntegralInRange(0u, 1u);
    const strata_tier tier = pick_tier();
    strata_tensor out = STRATA_TENSOR_NONE;
    const uint64_t bytes = pick_bytes();
    const int rc = strata_malloc(rt_, bytes, tier, flags, &out);
    check(rc, "strata_malloc bytes " + std::to_string(bytes) + " tier " + std::to_string(tier) +
                  " flags " + std::to_string(flags) + " -> " + std::to_string(out));
    if (rc == STRATA_OK) {
      add(out, bytes, (flags & STRATA_MALLOC_OFFLOADABLE) ? STRATA_TIER_NVME : tier,
          /*allocation=*/true);
    }
  }

  void add(strata_tensor handle, uint64_t bytes, strata_tier home, bool allocation) {
    if (handle == STRATA_TENSOR_NONE) fail("register", "returned OK and handle 0");
    for (const Tensor& t : tensors_) {
      if (t.handle == handle) fail("register", "handed out a live handle twice");
    }
    for (strata_tensor d : dead_) {
      if (d == handle) fail("register", "reused a dead handle");
    }
    Tensor t;
    t.handle = handle;
    t.bytes = bytes;
    t.home = home;
    t.no_contents = !allocation;  // an allocation's contents are undefined, not absent
    // Registration takes any size up to 2^56 (nothing is allocated); the model only follows
    // tensors small enough to ever be resident here. A larger one has no model (empty) and is
    // never compared.
    if (bytes <= (uint64_t{64} << 20)) t.contents.assign(bytes, -1);
    tensors_.push_back(std::move(t));
  }

  // An in-range [offset, offset + bytes) most of the time, anything otherwise.
  void pick_range(const Tensor* t, uint64_t* offset, uint64_t* bytes) {
    if (t != nullptr && in_.ConsumeIntegralInRange(0, 7) != 0) {
      const bool whole = in_.ConsumeBool();
      *offset = whole ? 0 : in_.ConsumeIntegralInRange<uint64_t>(0, t->bytes - 1);
      *bytes = whole ? t->bytes : in_.ConsumeIntegralInRange<uint64_t>(1, t->bytes - *offset);
      return;
    }
    *offset = in_.ConsumeIntegral<uint64_t>() >> in_.ConsumeIntegralInRange(0, 63);
    *bytes = in_.ConsumeIntegral<uint64_t>() >> in_.ConsumeIntegralInRange(0, 63);
  }

  // Caller memory for a copy: only as large as the range may legitimately be, and never more
  // than 64 MiB. A copy goes through the pinned tier, whose budget here is at most 1 MiB, so a
  // larger range can only be refused; if the library accepted one anyway, ASan would report it
  // overrunning this buffer. (Sizing it by a fuzzed tensor of petabytes crashed the harness.)
  static uint64_t buffer_size(const Tensor* t, uint64_t bytes) {
    constexpr uint64_t kMaxCopy = uint64_t{64} << 20;
    return std::min({bytes, t != nullptr ? t->bytes : uint64_t{1} << 20, kMaxCopy});
  }

  // timeout_ms: strata_tensor_write_timeout with that bound; none: strata_tensor_write.
  void op_write(std::optional<uint32_t> timeout_ms = std::nullopt) {
    Tensor* t = nullptr;
    const strata_tensor h = pick_handle(&t);
    uint64_t offset = 0, bytes = 0;
    pick_range(t, &offset, &bytes);
    if (t != nullptr && t->holds == 0) make_room(t, STRATA_TIER_PINNED);
    const uint8_t seed = in_.ConsumeIntegral<uint8_t>();
    std::vector<uint8_t> src(buffer_size(t, bytes));
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(seed + i * 7);
    // A range larger than the tensor must be refused before the source is read.
    const uint8_t* from = in_.ConsumeIntegralInRange(0, 30) ? src.data() : nullptr;
    const int rc = timeout_ms
                       ? strata_tensor_write_timeout(rt_, h, from, offset, bytes, *timeout_ms)
                       : strata_tensor_write(rt_, h, from, offset, bytes);
    check(rc,
          "strata_tensor_write " + std::to_string(h) + " [" + std::to_string(offset) + ", +" +
              std::to_string(bytes) + ")" +
              (timeout_ms ? " within " + std::to_string(*timeout_ms) + " ms" : ""),
          timeout_ms.has_value());
    if (rc != STRATA_OK) return;  // a timed-out write wrote nothing: the model stands
    if (t == nullptr) fail("strata_tensor_write", "accepted a handle that is not live");
    if (bytes > t->bytes || offset > t->bytes - bytes)
      fail("strata_tensor_write", "accepted a bad range");
    if (t->no_contents) std::fill(t->contents.begin(), t->contents.end(), -1);
    t->no_contents = false;
    if (t->contents.size() != t->bytes) return;
    for (uint64_t i = 0; i < bytes; ++i) t->contents[offset + i] = src[i];
  }

  void op_read(std::optional<uint32_t> timeout_ms = std::nullopt) {
    Tensor* t = nullptr;
    const strata_tensor h = pick_handle(&t);
    uint64_t offset = 0, bytes = 0;
    pick_range(t, &offset, &bytes);
    if (t != nullptr && t->holds == 0) make_room(t, STRATA_TIER_PINNED);
    std::vector<uint8_t> dst(buffer_size(t, bytes));
    uint8_t* into = in_.ConsumeIntegralInRange(0, 30) ? dst.data() : nullptr;
    const int rc = timeout_ms ? strata_tensor_read_timeout(rt_, h, into, offset, bytes, *timeout_ms)
                              : strata_tensor_read(rt_, h, into, offset, bytes);
    check(rc, timeout_ms ? "strata_tensor_read_timeout" : "strata_tensor_read",
          timeout_ms.has_value());
    if (rc == STRATA_E_TIMEOUT &&
        std::any_of(dst.begin(), dst.end(), [](uint8_t b) { return b != 0; })) {
      fail("strata_tensor_read_timeout", "timed out having written into the caller's buffer");
    }
    if (rc != STRATA_OK) return;
    if (t == nullptr) fail("strata_tensor_read", "accepted a handle that is not live");
    if (bytes > t->bytes || offset > t->bytes - bytes)
      fail("strata_tensor_read", "accepted a bad range");
    if (t->no_contents && !t->optimized)
      fail("strata_tensor_read", "returned bytes of a tensor with no contents");
    compare(*t, dst.data(), offset, bytes, "strata_tensor_read");
  }

  void op_acquire(std::optional<uint32_t> timeout_ms = std::nullopt) {
    Tensor* t = nullptr;
    const strata_tensor h = pick_handle(&t);
    const strata_tier tier = in_.ConsumeIntegralInRange(0, 7)
                                 ? (in_.ConsumeBool() ? STRATA_TIER_PINNED : STRATA_TIER_DEVICE)
                                 : pick_tier();
    uint32_t flags = in_.ConsumeIntegralInRange(0, 3) == 0 ? STRATA_ACQUIRE_DISCARD : 0;
    if (in_.ConsumeIntegralInRange(0, 15) == 0) flags = in_.ConsumeIntegral<uint32_t>();
    Padded<strata_acquired> padded;
    strata_acquired& a = padded.value;
    a.struct_size = in_.ConsumeIntegralInRange(0, 15) == 0
                        ? in_.ConsumeIntegralInRange<size_t>(0, 64)
                        : sizeof a;
    if (t != nullptr && t->holds == 0) make_room(t, tier);
    // Printed before the call too: an acquire that waits forever shows what it waited for.
    if (verbose_) {
      std::fprintf(stderr, "c_api_fuzz: strata_acquire %llu tier %d flags %u ...\n",
                   static_cast<unsigned long long>(h), static_cast<int>(tier), flags);
    }
    const int rc = timeout_ms ? strata_acquire_timeout(rt_, h, tier, flags, *timeout_ms, &a)
                              : strata_acquire(rt_, h, tier, flags, &a);
    check(rc,
          "strata_acquire " + std::to_string(h) + " tier " + std::to_string(tier) + " flags " +
              std::to_string(flags) +
              (timeout_ms ? " within " + std::to_string(*timeout_ms) + " ms" : ""),
          timeout_ms.has_value());
    if (rc != STRATA_OK) return;  // a timed-out acquire holds nothing: the model stands
    if (t == nullptr) fail("strata_acquire", "accepted a handle that is not live");
    if (a.data == nullptr || a.bytes != t->bytes) fail("strata_acquire", "bad strata_acquired");
    if (t->holds > 0 && a.data != t->data)
      fail("strata_acquire", "a nested acquire moved the data");
    if (t->holds > 0 && t->held_tier != tier)
      fail("strata_acquire", "nested acquire on another tier");
    auto* data = static_cast<uint8_t*>(a.data);
    if ((flags & STRATA_ACQUIRE_DISCARD) != 0) {
      std::fill(t->contents.begin(), t->contents.end(), -1);
      t->modified = true;
    } else {
      if (t->no_contents && !t->optimized && t->holds == 0)
        fail("strata_acquire", "acquired a tensor with no contents for reading");
      // A nested acquire of a buffer this program has written into sees its own bytes.
      if (!t->modified) compare(*t, data, 0, t->bytes, "strata_acquire");
    }
    t->no_contents = false;
    ++t->holds;
    t->held_tier = tier;
    t->data = a.data;
    if (in_.ConsumeBool()) {
      const uint8_t seed = in_.ConsumeIntegral<uint8_t>();
      for (uint64_t i = 0; i < t->bytes; ++i) data[i] = static_cast<uint8_t>(seed ^ (i * 13));
      t->modified = true;
    }
  }

  void op_release() {
    Tensor* t = nullptr;
    const strata_tensor h = pick_handle(&t);
    uint32_t flags = in_.ConsumeBool() ? STRATA_RELEASE_DIRTY : 0;
    if (t != nullptr && t->holds > 0) return release(*t, flags);
    if (in_.ConsumeIntegralInRange(0, 7) == 0) flags = in_.ConsumeIntegral<uint32_t>();
    const int rc = strata_release(rt_, h, flags, nullptr);
    check(rc, "strata_release");
    if (rc == STRATA_OK) fail("strata_release", "released a tensor that is not held");
  }

  void op_discard() {
    Tensor* t = nullptr;
    const strata_tensor h = pick_handle(&t);
    const int rc = strata_tensor_discard(rt_, h);
    check(rc, "strata_tensor_discard " + std::to_string(h));
    if (rc != STRATA_OK) return;
    if (t == nullptr || t->holds > 0) fail("strata_tensor_discard", "accepted a bad handle");
    std::fill(t->contents.begin(), t->contents.end(), -1);
    t->no_contents = true;
  }

  void op_unregister() {
    Tensor* t = nullptr;
    const strata_tensor h = pick_handle(&t);
    const int rc = in_.ConsumeBool() ? strata_tensor_unregister(rt_, h) : strata_free(rt_, h);
    check(rc, "strata_tensor_unregister");
    if (rc != STRATA_OK) return;
    if (t == nullptr || t->holds > 0) fail("strata_tensor_unregister", "accepted a bad handle");
    if (t->optimized) {
      fail("strata_tensor_unregister", "unregistered a parameter or gradient under the optimizer");
    }
    dead_.push_back(h);
    tensors_.erase(tensors_.begin() + (t - tensors_.data()));
  }

  void op_prefetch() {
    Tensor* t = nullptr;
    const strata_tensor h = pick_handle(&t);
    const strata_tier tier = pick_tier();
    check(strata_prefetch(rt_, h, tier),
          "strata_prefetch " + std::to_string(h) + " tier " + std::to_string(tier));
  }

  // The loop calls in a mostly well-formed order, with wrong phases and layers mixed in.
  void op_loop() {
    const auto phase = static_cast<strata_phase>(in_.ConsumeIntegralInRange(-1, 3));
    const int32_t layer = in_.ConsumeIntegralInRange(-2, 6);
    switch (in_.ConsumeIntegralInRange(0, 3)) {
      case 0:
        return check(strata_step_begin(rt_), "strata_step_begin");
      case 1:
        return check(strata_step_end(rt_), "strata_step_end");
      case 2:
        return check(strata_layer_begin(rt_, phase, layer), "strata_layer_begin phase " +
                                                                std::to_string(phase) + " layer " +
                                                                std::to_string(layer));
      default:
        return check(strata_layer_end(rt_, phase, layer), "strata_layer_end");
    }
  }

  void op_stats() {
    strata_stats s{};
    s.struct_size = in_.ConsumeIntegralInRange(0, 7) == 0
                        ? in_.ConsumeIntegralInRange<size_t>(0, 400)
                        : sizeof s;
    const int rc = strata_get_stats(rt_, &s);
    check(rc, "strata_get_stats");
    if (rc != STRATA_OK || s.struct_size != sizeof s) return;
    for (const strata_tier_stats* tier : {&s.pinned, &s.device, &s.nvme}) {
      if (tier->in_use_bytes > tier->reserved_bytes) {
        fail("strata_get_stats", "in use " + std::to_string(tier->in_use_bytes) + " > reserved " +
                                     std::to_string(tier->reserved_bytes));
      }
      if (tier->peak_in_use_bytes < tier->in_use_bytes) fail("strata_get_stats", "peak < now");
    }
  }

  void op_schedule() {
    std::vector<strata_schedule_entry> entries(in_.ConsumeIntegralInRange(0, 12));
    for (auto& e : entries) {
      Tensor* t = nullptr;
      e.phase = static_cast<strata_phase>(in_.ConsumeIntegralInRange(-1, 3));
      e.layer = in_.ConsumeIntegralInRange(-2, 6);
      e.tensor = pick_handle(&t);
      e.tier = in_.ConsumeIntegralInRange(0, 5) ? STRATA_TIER_PINNED : pick_tier();
    }
    check(strata_declare_schedule(rt_, entries.empty() ? nullptr : entries.data(), entries.size()),
          "strata_declare_schedule");
  }

  void op_trace() {
    const std::string path = scratch_dir() + "/trace.json";
    check(strata_export_trace(rt_, in_.ConsumeBool() ? path.c_str() : ""), "strata_export_trace");
  }

  // The optimizer calls, with valid and invalid groups, options, handles, states and paths. The
  // optimizer acquires the tensors it works on and waits for them, so whatever the program holds
  // is released first (the program is the only thread: see the file comment).
  void op_optimizer() {
    release_all();
    const int op = in_.ConsumeIntegralInRange(0, 10);
    if (op <= 2) return op_optimizer_group(op);
    if (op == 3) return op_optimizer_add_param();
    if (op == 4) return op_optimizer_configure();
    if (op == 5 || op == 6) {
      Tensor* t = nullptr;
      const strata_tensor h = pick_handle(&t);
      const int rc = op == 5 ? strata_optimizer_grad_ready(rt_, h)
                             : strata_optimizer_step(rt_, pick_loss_scale(), pick_result());
      check(rc, op == 5 ? "strata_optimizer_grad_ready" : "strata_optimizer_step");
      // Even a failed step may have updated some parameters before it stopped.
      forget_optimized();
      return;
    }
    if (op == 7) {
      int64_t step = 0;
      check(strata_optimizer_get_step(rt_, in_.ConsumeIntegralInRange(0, 15) ? &step : nullptr),
            "strata_optimizer_get_step");
      check(strata_optimizer_set_step(rt_, in_.ConsumeIntegral<int64_t>()),
            "strata_optimizer_set_step");
      return;
    }
    if (op == 8) return op_optimizer_state();
    const std::string path = scratch_dir() + "/optimizer.ckpt";
    const char* where = in_.ConsumeIntegralInRange(0, 7) == 0 ? "" : path.c_str();
    if (op == 9) return check(strata_optimizer_export(rt_, where), "strata_optimizer_export");
    check(strata_optimizer_import(rt_, where), "strata_optimizer_import");
    forget_optimized();
  }

  // Mostly the struct's own size; sometimes a smaller one, or a newer header's larger one whose
  // extra bytes are zero or not.
  template <typename T>
  void pick_struct_size(Padded<T>& padded) {
    if (in_.ConsumeIntegralInRange(0, 15) != 0) return;
    padded.value.struct_size = in_.ConsumeIntegralInRange<size_t>(0, sizeof padded);
    if (in_.ConsumeBool()) padded.tail[in_.ConsumeIntegralInRange<size_t>(0, 63)] = 1;
  }

  Padded<strata_optimizer_group> pick_group() {
    Padded<strata_optimizer_group> padded;
    strata_optimizer_group& g = padded.value;
    strata_optimizer_group_init(&g);
    pick_struct_size(padded);
    if (in_.ConsumeBool()) g.lr = in_.ConsumeFloatingPointInRange(-1.0, 1.0);
    if (in_.ConsumeIntegralInRange(0, 3) == 0) g.beta1 = in_.ConsumeFloatingPoint<double>();
    if (in_.ConsumeIntegralInRange(0, 3) == 0) g.beta2 = in_.ConsumeFloatingPoint<double>();
    if (in_.ConsumeIntegralInRange(0, 3) == 0) g.eps = in_.ConsumeFloatingPoint<double>();
    if (in_.ConsumeIntegralInRange(0, 3) == 0) g.weight_decay = in_.ConsumeFloatingPoint<double>();
    g.decoupled_weight_decay = in_.ConsumeIntegralInRange(-1, 2);
    return padded;
  }

  void op_optimizer_group(int op) {
    const uint32_t index = in_.ConsumeIntegralInRange(0u, 4u);
    if (op == 0) {
      const Padded<strata_optimizer_group> g = pick_group();
      uint32_t out = 0;
      return check(
          strata_optimizer_add_group(rt_, in_.ConsumeIntegralInRange(0, 15) ? &g.value : nullptr,
                                     in_.ConsumeIntegralInRange(0, 15) ? &out : nullptr),
          "strata_optimizer_add_group");
    }
    if (op == 1) {
      const Padded<strata_optimizer_group> g = pick_group();
      return check(strata_optimizer_set_group(rt_, index, &g.value), "strata_optimizer_set_group");
    }
    Padded<strata_optimizer_group> out;
    out.value.struct_size = in_.ConsumeIntegralInRange(0, 7)
                                ? sizeof out.value
                                : in_.ConsumeIntegralInRange<size_t>(0, sizeof out);
    check(strata_optimizer_get_group(rt_, index, &out.value), "strata_optimizer_get_group");
  }

  void op_optimizer_add_param() {
    Tensor* param = nullptr;
    Tensor* grad = nullptr;
    const strata_tensor p = pick_handle(&param);
    const strata_tensor g = pick_handle(&grad);
    const int rc = strata_optimizer_add_param(rt_, in_.ConsumeIntegralInRange(0u, 4u), p, g);
    check(rc, "strata_optimizer_add_param");
    if (rc != STRATA_OK) return;
    if (param == nullptr || grad == nullptr) {
      fail("strata_optimizer_add_param", "accepted a handle that is not live");
    }
    param->optimized = true;
    grad->optimized = true;
  }

  void op_optimizer_configure() {
    Padded<strata_optimizer_options> padded;
    strata_optimizer_options& o = padded.value;
    strata_optimizer_options_init(&o);
    pick_struct_size(padded);
    if (in_.ConsumeBool()) o.max_grad_norm = in_.ConsumeFloatingPointInRange(-1.0, 10.0);
    o.check_overflow = in_.ConsumeIntegralInRange(-1, 2);
    o.overlap_backward = in_.ConsumeIntegralInRange(-1, 2);
    if (in_.ConsumeBool()) o.sub_group_bytes = pick_bytes();
    if (in_.ConsumeIntegralInRange(0, 3) == 0) {
      // Read-modify-write, as a scheduler of options would: what get returns configures again.
      Padded<strata_optimizer_options> now;
      now.value.struct_size = sizeof now.value;
      const int rc = strata_optimizer_get_options(rt_, &now.value);
      check(rc, "strata_optimizer_get_options");
      if (rc == STRATA_OK && strata_optimizer_configure(rt_, &now.value) != STRATA_OK) {
        fail("strata_optimizer_configure", "refused the options get_options returned");
      }
      return;
    }
    check(strata_optimizer_configure(rt_, in_.ConsumeIntegralInRange(0, 15) ? &o : nullptr),
          "strata_optimizer_configure");
  }

  void op_optimizer_state() {
    Tensor* t = nullptr;
    const strata_tensor h = pick_handle(&t);
    const auto state = static_cast<strata_optimizer_state>(in_.ConsumeIntegralInRange(-1, 3));
    // Mostly the right size (4 bytes per element of an fp32, bf16 or fp16 parameter), or not.
    uint64_t bytes = pick_bytes();
    if (t != nullptr && in_.ConsumeBool()) {
      bytes = t->bytes * (in_.ConsumeBool() ? 1 : 2);
    }
    bytes = std::min<uint64_t>(bytes, uint64_t{64} << 20);
    std::vector<uint8_t> buffer(bytes);
    for (auto& b : buffer) b = static_cast<uint8_t>(&b - buffer.data());
    void* data = in_.ConsumeIntegralInRange(0, 15) && !buffer.empty() ? buffer.data() : nullptr;
    check(in_.ConsumeBool() ? strata_optimizer_read_state(rt_, h, state, data, bytes)
                            : strata_optimizer_write_state(rt_, h, state, data, bytes),
          "strata_optimizer_read_state / write_state");
  }

  double pick_loss_scale() {
    switch (in_.ConsumeIntegralInRange(0, 7)) {
      case 0:
        return 0.0;
      case 1:
        return -1.0;
      case 2:
        return in_.ConsumeFloatingPoint<double>();
      default:
        return 1.0;
    }
  }

  strata_optimizer_result* pick_result() {
    result_ = {};
    result_.value.struct_size = in_.ConsumeIntegralInRange(0, 7)
                                    ? sizeof result_.value
                                    : in_.ConsumeIntegralInRange<size_t>(0, sizeof result_);
    return in_.ConsumeIntegralInRange(0, 3) ? &result_.value : nullptr;
  }

  // After a call that may have updated parameters or discarded gradients: their bytes are
  // the optimizer's now.
  void forget_optimized() {
    for (Tensor& t : tensors_) {
      if (!t.optimized) continue;
      std::fill(t.contents.begin(), t.contents.end(), -1);
    }
  }

  void verify_all() {
    for (Tensor& t : tensors_) {
      if (t.no_contents ||
          std::all_of(t.contents.begin(), t.contents.end(), [](int16_t c) { return c < 0; })) {
        continue;
      }
      std::vector<uint8_t> dst(t.bytes);
      const int rc = strata_tensor_read(rt_, t.handle, dst.data(), 0, t.bytes);
      check(rc, "strata_tensor_read (final)");
      if (rc == STRATA_OK) compare(t, dst.data(), 0, t.bytes, "final read");
    }
  }

  FuzzedDataProvider& in_;
  strata_runtime* rt_;
  const uint64_t pinned_budget_;
  const uint64_t device_budget_;
  std::vector<Tensor> tensors_;
  std::vector<strata_tensor> dead_;
  Padded<strata_optimizer_result> result_{};
  const bool verbose_ = std::getenv("C_API_FUZZ_VERBOSE") != nullptr;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const std::string& dir = scratch_dir();
  strata_config c;
  strata_config_init(&c);
  c.nvme_path = dir.c_str();
  c.nvme_capacity_bytes = uint64_t{1} << in.ConsumeIntegralInRange(20, 24);  // 1-16 MiB
  c.pinned_budget_bytes = uint64_t{1} << in.ConsumeIntegralInRange(14, 20);  // 16 KiB-1 MiB
  c.device_budget_bytes = uint64_t{1} << in.ConsumeIntegralInRange(14, 20);
  c.device_backend = STRATA_DEVICE_EMULATED;
  c.io_engine = in.ConsumeBool() ? STRATA_IO_PSYNC : STRATA_IO_AUTO;
  c.queue_depth = in.ConsumeIntegralInRange(1u, 16u);
  c.block_size = 4096u << in.ConsumeIntegralInRange(0, 4);
  c.verify_checksums = in.ConsumeIntegralInRange(0, 3) != 0;
  c.worker_threads = in.ConsumeIntegralInRange(0u, 2u);
  c.trace_events = in.ConsumeBool() ? 256 : 0;
  if (std::getenv("C_API_FUZZ_VERBOSE") != nullptr) {
    std::fprintf(stderr,
                 "c_api_fuzz: config pinned %llu device %llu nvme %llu engine %d block %u\n",
                 static_cast<unsigned long long>(c.pinned_budget_bytes),
                 static_cast<unsigned long long>(c.device_budget_bytes),
                 static_cast<unsigned long long>(c.nvme_capacity_bytes), c.io_engine, c.block_size);
  }
  strata_runtime* rt = nullptr;
  const int rc = strata_runtime_create(&c, &rt);
  if (rc != STRATA_OK) {
    std::fprintf(stderr, "c_api_fuzz: cannot create the runtime: %s\n", strata_last_error(nullptr));
    std::abort();
  }
  Program(in, rt, c.pinned_budget_bytes, c.device_budget_bytes).run();
  const int destroyed = strata_runtime_destroy(rt);
  if (destroyed != STRATA_OK) fail("strata_runtime_destroy", std::to_string(destroyed));
  return 0;
}
