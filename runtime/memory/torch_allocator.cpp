#include "memory/torch_allocator.h"

#include <strata/strata.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <shared_mutex>
#include <unordered_set>
#include <vector>

#if defined(STRATA_HAVE_CUDA)
#include "memory/cuda_device.h"
#endif

namespace strata::memory {
namespace {

// The process-wide binding state (see torch_allocator.h for why it exists at all). Calls take the
// lock shared, so they run concurrently; install / uninstall take it exclusively, so a device is
// never unbound while a call uses it.
struct Binding {
  std::shared_mutex mutex;
  std::vector<TorchMemorySource*> sources;  // installation order; back() serves allocations
  // Pointers from the no-runtime fallback (cudaMalloc). Tracked so that a free goes back to
  // cudaFree only for memory that really came from it.
  std::mutex fallback_mutex;
  std::unordered_set<void*> fallback;
};

Binding& binding() {
  // Constructed on first use and never destroyed: torch may free tensors during static
  // destruction, after a destroyed binding would have been gone.
  static Binding* instance = new Binding();
  return *instance;
}

void warn(const char* format, auto... args) {
  std::fprintf(stderr, "strata: warning: ");
  std::fprintf(stderr, format, args...);
  std::fputc('\n', stderr);
}

void* fallback_alloc(uint64_t bytes, int device) {
#if defined(STRATA_HAVE_CUDA)
  void* p = cuda_plain_malloc(bytes, device);
  if (p == nullptr) return nullptr;
  Binding& b = binding();
  std::lock_guard lock(b.fallback_mutex);
  b.fallback.insert(p);
  return p;
#else
  (void)bytes;
  (void)device;
  return nullptr;
#endif
}

// true when ptr came from fallback_alloc (and is now freed).
bool fallback_free(void* ptr) {
  Binding& b = binding();
  {
    std::lock_guard lock(b.fallback_mutex);
    if (b.fallback.erase(ptr) == 0) return false;
  }
#if defined(STRATA_HAVE_CUDA)
  if (const std::string error = cuda_plain_free(ptr); !error.empty()) {
    warn("strata_torch_free: cudaFree(%p) failed: %s", ptr, error.c_str());
  }
#endif
  return true;
}

}  // namespace

std::unique_ptr<TorchAllocatorBinding> TorchAllocatorBinding::install(TorchMemorySource& source) {
  Binding& b = binding();
  std::unique_lock lock(b.mutex);
  b.sources.push_back(&source);
  return std::unique_ptr<TorchAllocatorBinding>(new TorchAllocatorBinding(source));
}

TorchAllocatorBinding::~TorchAllocatorBinding() {
  Binding& b = binding();
  std::unique_lock lock(b.mutex);
  const auto it = std::find(b.sources.rbegin(), b.sources.rend(), &source_);
  if (it != b.sources.rend()) b.sources.erase(std::next(it).base());
}

const TorchMemorySource* torch_allocator_source() {
  Binding& b = binding();
  std::shared_lock lock(b.mutex);
  return b.sources.empty() ? nullptr : b.sources.back();
}

}  // namespace strata::memory

using strata::memory::TorchMemorySource;

extern "C" STRATA_API void* strata_torch_alloc(ssize_t size, int device,
                                               strata_cuda_stream /*stream*/) {
  // Torch sees NULL as out of memory; nothing here may throw into its C++ frames either.
  try {
    if (size <= 0) return nullptr;
    const auto bytes = static_cast<uint64_t>(size);
    auto& b = strata::memory::binding();
    {
      std::shared_lock lock(b.mutex);
      if (!b.sources.empty()) {
        TorchMemorySource* d = b.sources.back();
        if (d->ordinal() == device) {
          strata::Result<void*> p = d->allocate(bytes);
          if (p.is_ok()) return *p;
          strata::memory::warn("strata_torch_alloc: %s", p.status().message().c_str());
          return nullptr;
        }
      }
    }
    // No runtime for this GPU: plain CUDA memory, or none.
    return strata::memory::fallback_alloc(bytes, device);
  } catch (...) {
    return nullptr;
  }
}

extern "C" STRATA_API void strata_torch_free(void* ptr, ssize_t size, int /*device*/,
                                             strata_cuda_stream stream) {
  try {
    if (ptr == nullptr) return;
    auto& b = strata::memory::binding();
    {
      std::shared_lock lock(b.mutex);
      for (auto it = b.sources.rbegin(); it != b.sources.rend(); ++it) {
        TorchMemorySource* d = *it;
        if (!d->owns(ptr)) continue;
        const uint64_t allocated = d->allocation_size(ptr);
        if (size >= 0 && allocated != 0 && allocated != static_cast<uint64_t>(size)) {
          strata::memory::warn(
              "strata_torch_free: %p was allocated with %llu bytes, freed with %lld", ptr,
              static_cast<unsigned long long>(allocated), static_cast<long long>(size));
        }
        // Reuse waits for the work torch queued on `stream` to finish.
        const strata::Status status = d->free(ptr, stream);
        if (!status.is_ok()) {
          strata::memory::warn("strata_torch_free: %s", status.message().c_str());
        }
        return;
      }
    }
    if (strata::memory::fallback_free(ptr)) return;
    strata::memory::warn(
        "strata_torch_free: %p was not allocated by strata_torch_alloc (or its "
        "runtime is gone); ignored",
        ptr);
  } catch (...) {
    // Nothing can be reported to torch from a free; the memory stays allocated.
  }
}
