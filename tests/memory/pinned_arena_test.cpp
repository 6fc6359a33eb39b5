#include "memory/pinned_arena.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>

#include "capabilities.h"
#include "common/align.h"
#include "io/io_engine.h"
#include "memory/device.h"
#include "memory/host_memory.h"
#include "sanitizers.h"

namespace strata::memory {
namespace {

// The sanitizers replace mlock with a no-op that reports success: locking cannot be observed.
constexpr bool kMlockIsReal = !strata::testing::kSanitized;

// Whether this process may lock `bytes` more (root has CAP_IPC_LOCK; others need the rlimit).
bool can_lock(uint64_t bytes) {
  rlimit limit{};
  getrlimit(RLIMIT_MEMLOCK, &limit);
  return geteuid() == 0 || limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= 2 * bytes;
}

PinnedArenaOptions small_options(uint64_t budget) {
  PinnedArenaOptions o;
  o.budget_bytes = budget;
  o.lock_pages = can_lock(budget);
  return o;
}

std::unique_ptr<PinnedArena> make_arena(const PinnedArenaOptions& options) {
  Result<std::unique_ptr<PinnedArena>> arena = PinnedArena::create(options);
  EXPECT_TRUE(arena.is_ok()) << arena.status().message();
  return arena.is_ok() ? std::move(arena).value() : nullptr;
}

TEST(PinnedArena, AllocationsAreExactSizeRoundedOnlyToAPage) {
  auto arena = make_arena(small_options(64 << 20));
  ASSERT_NE(arena, nullptr);
  // A size a power-of-two allocator would double: 5 MiB + 1 byte.
  const uint64_t sizes[] = {1, 4095, 4096, 4097, (5u << 20) + 1, 3 * 4096 + 17};
  uint64_t reserved = 0;
  uint64_t requested = 0;
  std::vector<PinnedBuffer> buffers;
  for (uint64_t bytes : sizes) {
    Result<PinnedBuffer> b = arena->allocate(bytes);
    ASSERT_TRUE(b.is_ok()) << b.status().message();
    EXPECT_EQ(b->size(), bytes);
    EXPECT_EQ(b->reserved_bytes(), align_up(bytes, 4096));
    EXPECT_TRUE(is_aligned(b->data(), 4096));
    std::memset(b->data(), 0x5a, bytes);  // writable, resident (locked)
    reserved += b->reserved_bytes();
    requested += bytes;
    buffers.push_back(std::move(b).value());
  }
  EXPECT_EQ(buffers[4].reserved_bytes(), (5u << 20) + 4096);  // not 8 MiB
  const PinnedArenaStats s = arena->stats();
  EXPECT_EQ(s.reserved_bytes, reserved);
  EXPECT_EQ(s.requested_bytes, requested);
  EXPECT_EQ(s.allocations, std::size(sizes));
  buffers.clear();
  EXPECT_EQ(arena->stats().reserved_bytes, 0u);
  EXPECT_EQ(arena->stats().peak_reserved_bytes, reserved);
}

TEST(PinnedArena, ZeroBytesAndZeroBudgetAreInvalid) {
  EXPECT_EQ(PinnedArena::create(small_options(0)).status().code(), STRATA_E_INVALID);
  auto arena = make_arena(small_options(1 << 20));
  ASSERT_NE(arena, nullptr);
  EXPECT_EQ(arena->allocate(0).status().code(), STRATA_E_INVALID);
}

TEST(PinnedArena, TheBudgetIsHardAndTheErrorCarriesTheNumbers) {
  auto arena = make_arena(small_options(1 << 20));
  ASSERT_NE(arena, nullptr);
  Result<PinnedBuffer> first = arena->allocate(768 << 10);
  ASSERT_TRUE(first.is_ok());
  Result<PinnedBuffer> second = arena->allocate(512 << 10);
  ASSERT_FALSE(second.is_ok());
  EXPECT_EQ(second.status().code(), STRATA_E_PINNED_BUDGET);
  const std::string& m = second.status().message();
  EXPECT_NE(m.find("524288 B"), std::string::npos) << m;             // asked
  EXPECT_NE(m.find("786432 B"), std::string::npos) << m;             // in use
  EXPECT_NE(m.find("1048576 B"), std::string::npos) << m;            // budget
  EXPECT_NE(m.find("pinned_budget_bytes"), std::string::npos) << m;  // what to change
  // Nothing leaked by the failure; exactly the remaining 256 KiB can still be had.
  EXPECT_EQ(arena->stats().reserved_bytes, 768u << 10);
  Result<PinnedBuffer> rest = arena->allocate(256 << 10);
  EXPECT_TRUE(rest.is_ok());
  EXPECT_EQ(arena->allocate(1).status().code(), STRATA_E_PINNED_BUDGET);
  first->reset();
  EXPECT_TRUE(arena->allocate(512 << 10).is_ok());
}

TEST(PinnedArena, CountsWhatItMapsAsReservedWithItsPeak) {
  auto arena = make_arena(small_options(16 << 20));
  ASSERT_NE(arena, nullptr);
  {
    Result<PinnedBuffer> small = arena->allocate(10000);
    Result<PinnedBuffer> large = arena->allocate(3 << 20);
    ASSERT_TRUE(small.is_ok() && large.is_ok());
    const PinnedArenaStats s = arena->stats();
    EXPECT_EQ(s.reserved_bytes, 12288u + (3u << 20));  // 4 KiB pages
    EXPECT_EQ(s.requested_bytes, 10000u + (3u << 20));
    EXPECT_EQ(s.allocations, 2u);
  }
  const PinnedArenaStats after = arena->stats();
  EXPECT_EQ(after.reserved_bytes, 0u);
  EXPECT_EQ(after.requested_bytes, 0u);
  EXPECT_EQ(after.peak_reserved_bytes, 12288u + (3u << 20));
}

// The mapping of [start, start + bytes) as /proc/self/maps lists it: its end, or 0 when no mapping
// starts at `start`.
uintptr_t mapping_end_at(const void* start) {
  std::FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return 0;
  uintptr_t begin = 0, end = 0, found = 0;
  char line[512];
  while (std::fgets(line, sizeof line, maps) != nullptr) {
    if (std::sscanf(line, "%lx-%lx", &begin, &end) == 2 &&
        begin == reinterpret_cast<uintptr_t>(start)) {
      found = end;
    }
  }
  std::fclose(maps);
  return found;
}

TEST(PinnedArena, BuffersOfAHugePageOrMoreAreHugePageAlignedWithNoSlackLeftMapped) {
  auto arena = make_arena(small_options(64 << 20));
  ASSERT_NE(arena, nullptr);
  for (const uint64_t bytes : {kHugePageSize, 5 * kHugePageSize + 12345}) {
    Result<PinnedBuffer> b = arena->allocate(bytes);
    ASSERT_TRUE(b.is_ok()) << b.status().message();
    EXPECT_TRUE(is_aligned(b->data(), kHugePageSize)) << bytes;
    EXPECT_EQ(b->reserved_bytes(), align_up(bytes, kPageSize));
    // Exactly the reserved bytes stay mapped: the alignment slack on both sides was unmapped.
    EXPECT_EQ(mapping_end_at(b->data()),
              reinterpret_cast<uintptr_t>(b->data()) + b->reserved_bytes());
    std::memset(b->data(), 0x5a, bytes);  // every byte is usable
    const void* address = b->data();
    b->reset();
    EXPECT_EQ(mapping_end_at(address), 0u);
  }
  // Below a huge page nothing changes: page-aligned, exact.
  Result<PinnedBuffer> small = arena->allocate(kHugePageSize - kPageSize - 1);
  ASSERT_TRUE(small.is_ok());
  EXPECT_EQ(small->reserved_bytes(), kHugePageSize - kPageSize);
  EXPECT_EQ(mapping_end_at(small->data()),
            reinterpret_cast<uintptr_t>(small->data()) + small->reserved_bytes());
  EXPECT_EQ(arena->stats().reserved_bytes, kHugePageSize - kPageSize);
}

TEST(PinnedArena, LockedPagesAreResidentAndCounted) {
  if (!can_lock(64 << 20)) GTEST_SKIP() << "RLIMIT_MEMLOCK is too small to lock 16 MiB here";
  if (!kMlockIsReal) GTEST_SKIP() << "mlock is a no-op under the sanitizers";
  auto arena = make_arena(small_options(64 << 20));
  ASSERT_NE(arena, nullptr);
  const uint64_t locked_before = read_proc_memory()->vm_lck;
  Result<PinnedBuffer> b = arena->allocate(16 << 20);
  ASSERT_TRUE(b.is_ok()) << b.status().message();
  EXPECT_GE(read_proc_memory()->vm_lck, locked_before + (16u << 20));
  b->reset();
  EXPECT_LT(read_proc_memory()->vm_lck, locked_before + (16u << 20));
}

TEST(PinnedArena, PlacesMemoryOnTheChosenNumaNode) {
  auto arena = make_arena(small_options(8 << 20));
  ASSERT_NE(arena, nullptr);
  Result<HwlocTopology> topology = HwlocTopology::load_system();
  ASSERT_TRUE(topology.is_ok());
  EXPECT_TRUE(topology->has_numa_node(arena->numa_node()));
  EXPECT_FALSE(arena->numa_reason().empty());
  Result<PinnedBuffer> b = arena->allocate(1 << 20);
  ASSERT_TRUE(b.is_ok());
  if (!arena->numa_bound()) GTEST_SKIP() << "memory binding is not available here";
  std::memset(b->data(), 1, b->size());  // present even where locking is not real
  // Where the kernel actually put the pages.
  hwloc_nodeset_t where = hwloc_bitmap_alloc();
  ASSERT_EQ(hwloc_get_area_memlocation(topology->get(), b->data(), b->size(), where,
                                       HWLOC_MEMBIND_BYNODESET),
            0);
  EXPECT_TRUE(hwloc_bitmap_isset(where, static_cast<unsigned>(arena->numa_node())));
  EXPECT_EQ(hwloc_bitmap_weight(where), 1);
  hwloc_bitmap_free(where);
}

TEST(PinnedArena, AnExplicitNodeThatDoesNotExistIsRejected) {
  PinnedArenaOptions o = small_options(1 << 20);
  o.numa_node = 4096;
  Result<std::unique_ptr<PinnedArena>> arena = PinnedArena::create(o);
  ASSERT_FALSE(arena.is_ok());
  EXPECT_EQ(arena.status().code(), STRATA_E_INVALID);
}

// An engine that records registrations and refuses the ones a test asks it to (fault injection).
class RecordingEngine : public io::IoEngine {
 public:
  const char* name() const override { return "recording"; }
  const io::IoEngineOptions& options() const override { return options_; }
  Result<uint32_t> register_file(int) override { return 0u; }
  Result<int32_t> register_buffer(void* base, uint64_t bytes) override {
    if (bytes > (uint64_t{1} << 30)) return invalid_argument("fixed buffer over 1 GiB");
    if (refuse_next > 0) {
      --refuse_next;
      return Status::error(STRATA_E_LIMIT, "injected: RLIMIT_MEMLOCK");
    }
    live[next] = {base, bytes};
    return next++;
  }
  Status unregister_buffer(int32_t index) override {
    return live.erase(index) == 1 ? Status::ok() : invalid_argument("unknown buffer");
  }
  Status submit(io::IoRequest*) override { return unsupported("recording only"); }

  std::map<int32_t, std::pair<void*, uint64_t>> live;
  int32_t next = 0;
  int refuse_next = 0;

 private:
  io::IoEngineOptions options_;
};

TEST(PinnedArena, RegistersWithTheIoEngineInChunksOfAtMostOneGiB) {
  RecordingEngine engine;
  PinnedArenaOptions o = small_options(4ull << 30);
  o.io_engine = &engine;
  o.lock_pages = false;  // 1.5 GiB stays virtual: the test is about registration
  auto arena = make_arena(o);
  ASSERT_NE(arena, nullptr);
  {
    Result<PinnedBuffer> b = arena->allocate(3ull << 29);  // 1.5 GiB
    ASSERT_TRUE(b.is_ok()) << b.status().message();
    ASSERT_EQ(engine.live.size(), 2u);
    EXPECT_EQ(engine.live[0].first, b->data());
    EXPECT_EQ(engine.live[0].second, 1ull << 30);
    EXPECT_EQ(engine.live[1].first, b->data() + (1ull << 30));
    EXPECT_EQ(engine.live[1].second, 1ull << 29);
    EXPECT_EQ(b->io_buffer_index(0, 1 << 20), 0);
    EXPECT_EQ(b->io_buffer_index((1ull << 30) + 4096, 1 << 20), 1);
    EXPECT_EQ(b->io_buffer_index((1ull << 30) - 4096, 8192), -1);  // crosses the chunk boundary
    EXPECT_EQ(b->io_buffer_index(0, (1ull << 31)), -1);            // past the end
  }
  EXPECT_TRUE(engine.live.empty());  // unregistered with the buffer
}

TEST(PinnedArena, AnEngineThatRefusesRegistrationLeavesTheBufferUsable) {
  RecordingEngine engine;
  engine.refuse_next = 1;
  PinnedArenaOptions o = small_options(1 << 20);
  o.io_engine = &engine;
  auto arena = make_arena(o);
  ASSERT_NE(arena, nullptr);
  Result<PinnedBuffer> b = arena->allocate(8192);
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b->io_buffer_index(0, 8192), -1);
  EXPECT_EQ(arena->stats().io_registration_failures, 1u);
  Result<PinnedBuffer> c = arena->allocate(8192);
  ASSERT_TRUE(c.is_ok());
  EXPECT_GE(c->io_buffer_index(0, 8192), 0);
}

TEST(PinnedArena, RegistersWithTheDevice) {
  Result<std::unique_ptr<Device>> device =
      open_device({.backend = DeviceBackend::kEmulated, .budget_bytes = 1 << 20});
  ASSERT_TRUE(device.is_ok());
  PinnedArenaOptions o = small_options(1 << 20);
  o.device = device->get();
  auto arena = make_arena(o);
  ASSERT_NE(arena, nullptr);
  Result<PinnedBuffer> b = arena->allocate(4096);
  ASSERT_TRUE(b.is_ok()) << b.status().message();
}

// Runs in a forked child: the exit code says what happened.
int lock_past_the_limit() {
  strata::testing::drop_ipc_lock();
  const rlimit limit{1 << 20, 1 << 20};
  setrlimit(RLIMIT_MEMLOCK, &limit);
  auto arena = PinnedArena::create(small_options(64 << 20));
  if (!arena.is_ok()) return 10;
  PinnedArenaOptions locking = small_options(64 << 20);
  locking.lock_pages = true;
  arena = PinnedArena::create(locking);
  Result<PinnedBuffer> b = (*arena)->allocate(8 << 20);
  if (b.is_ok()) return 11;
  const std::string& m = b.status().message();
  const bool numbers = m.find("RLIMIT_MEMLOCK is 1.00 MiB (1048576 B)") != std::string::npos &&
                       m.find("8388608 B") != std::string::npos &&
                       m.find("ulimit -l") != std::string::npos;
  if (b.status().code() == STRATA_E_LIMIT && numbers && (*arena)->stats().reserved_bytes == 0) {
    return 0;
  }
  std::fprintf(stderr, "%d %s\n", b.status().code(), m.c_str());
  return 12;
}

TEST(PinnedArenaDeathTest, AMemlockLimitIsStrataELimitWithTheNumbers) {
  if (!kMlockIsReal) GTEST_SKIP() << "mlock is a no-op under the sanitizers";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(_exit(lock_past_the_limit()), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace strata::memory
