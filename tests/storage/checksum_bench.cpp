// Throughput of the extent checksum (XXH3-64) next to its reference points in the same run:
// XXH64 (the previous xxHash generation) and memcpy of the same bytes (what the memory system
// allows). docs/storage.md compares the result with an NVMe drive's 3-7 GB/s.
//
//   build-storage/tests/storage/checksum_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>
#include <xxhash.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>

#include "storage/checksum.h"

namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t, FreeDeleter>;

Buffer random_buffer(size_t bytes) {
  Buffer buffer(static_cast<uint8_t*>(std::aligned_alloc(4096, bytes)));
  std::mt19937_64 rng(42);
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t word = rng();
    std::memcpy(buffer.get() + i, &word, 8);
  }
  return buffer;
}

// Extent sizes from a small bias vector to a large layer's weights.
void sizes(benchmark::internal::Benchmark* b) {
  for (int64_t bytes : {4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20}) b->Arg(bytes);
}

void BM_Xxh3(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(0));
  Buffer buffer = random_buffer(bytes);
  for (auto _ : state) benchmark::DoNotOptimize(strata::storage::checksum(buffer.get(), bytes));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_Xxh3)->Apply(sizes);

void BM_Xxh64(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(0));
  Buffer buffer = random_buffer(bytes);
  for (auto _ : state) benchmark::DoNotOptimize(XXH64(buffer.get(), bytes, 0));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_Xxh64)->Apply(sizes);

void BM_Memcpy(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(0));
  Buffer source = random_buffer(bytes);
  Buffer target = random_buffer(bytes);
  for (auto _ : state) {
    std::memcpy(target.get(), source.get(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_Memcpy)->Apply(sizes);

}  // namespace

BENCHMARK_MAIN();
