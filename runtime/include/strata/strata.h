/*
 * strata.h - the public C API of Strata, a tiered (GPU / pinned host / NVMe) memory runtime for
 * fine-tuning models larger than GPU memory and host RAM.
 *
 * This is the only public C header (valid C11 and C++); strata/strata.hpp is a header-only C++20
 * RAII wrapper over it (docs/c-api.md, "C++ wrapper").
 *
 * Conventions
 *  - Every function that can fail returns an int: STRATA_OK (0) or a negative STRATA_E_* code.
 *    strata_strerror(code) names the code; strata_last_error(rt) gives the context of the most
 *    recent failure on that runtime (which call, which tensor, which numbers).
 *  - Handles are opaque. Passing NULL, a destroyed handle or a handle of another runtime returns
 *    an error code; it never crashes the caller.
 *  - Structs passed in or out start with `struct_size`, set by the caller to sizeof(the struct)
 *    as compiled against this header: a multiple of 8, at least the struct's first published
 *    size, at most 65536 (else STRATA_E_INVALID).
 *    One rule for all of them (docs/c-api.md, "Versioned structs"): the library reads or writes
 *    the fields within struct_size; fields an older, smaller struct lacks take their defaults when
 *    read and are not written; fields of a newer, larger struct that this library does not know
 *    must be zero when read (else STRATA_E_UNSUPPORTED) and are zeroed when written.
 *  - No C++ exception ever crosses this API.
 *
 * Thread rules are stated on each function. "Any thread" means the call may run concurrently
 * with any other call on the same runtime except strata_runtime_destroy.
 */
#ifndef STRATA_STRATA_H
#define STRATA_STRATA_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* ssize_t */

#if defined(STRATA_BUILDING_LIBRARY)
#define STRATA_API __attribute__((visibility("default")))
#else
#define STRATA_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------------------------- */
#define STRATA_VERSION_MAJOR 0
#define STRATA_VERSION_MINOR 1
#define STRATA_VERSION_PATCH 0
#define STRATA_VERSION_NUMBER \
  (STRATA_VERSION_MAJOR * 10000 + STRATA_VERSION_MINOR * 100 + STRATA_VERSION_PATCH)

/* The library's version as "MAJOR.MINOR.PATCH". Any thread. Never NULL. */
STRATA_API const char* strata_version(void);
/* The library's STRATA_VERSION_NUMBER, to compare with the header's. Any thread. */
STRATA_API int strata_version_number(void);

/* ---------------------------------------------------------------------------------------------
 * Status codes
 * ------------------------------------------------------------------------------------------- */
#define STRATA_OK 0
#define STRATA_E_INVALID (-1)       /* an argument is NULL, zero, out of range or inconsistent */
#define STRATA_E_BAD_HANDLE (-2)    /* the handle is unknown, released or of another runtime */
#define STRATA_E_STATE (-3)         /* the call is not allowed in the object's current state */
#define STRATA_E_NOMEM (-4)         /* host memory (malloc / mmap) could not be had */
#define STRATA_E_PINNED_BUDGET (-5) /* the pinned host budget would be exceeded */
#define STRATA_E_DEVICE_BUDGET (-6) /* the device budget would be exceeded */
#define STRATA_E_NOSPACE (-7)       /* the NVMe tier (swap file or raw device) is full */
#define STRATA_E_IO (-8)            /* a read or write failed (the message has the errno) */
#define STRATA_E_CORRUPT (-9)       /* data read back does not match its checksum */
#define STRATA_E_UNSUPPORTED (-10)  /* the system lacks what the call needs */
#define STRATA_E_DEVICE (-11)       /* the GPU runtime reported an error */
#define STRATA_E_LIMIT (-12)        /* an OS limit (file descriptors, memlock) was reached */
#define STRATA_E_TIMEOUT (-13)      /* a wait did not finish in time */
#define STRATA_E_INTERNAL (-14)     /* a bug in Strata: please report it with the message */

/* A static, human-readable name for a status code. Any thread. Never NULL. */
STRATA_API const char* strata_strerror(int code);

/* ---------------------------------------------------------------------------------------------
 * Configuration
 * ------------------------------------------------------------------------------------------- */
typedef enum strata_io_engine {
  STRATA_IO_AUTO = 0,  /* io_uring when the kernel allows it, else pread/pwrite */
  STRATA_IO_URING = 1, /* io_uring only; runtime creation fails where it is unavailable */
  STRATA_IO_PSYNC = 2  /* pread/pwrite on a small thread pool */
} strata_io_engine;

typedef enum strata_policy {
  STRATA_POLICY_STRATA = 0,       /* exact-size pinned buffers in one budget, NVMe extents */
  STRATA_POLICY_ZERO_INFINITY = 1 /* DeepSpeed ZeRO-Infinity's buffer behaviour, for comparison */
} strata_policy;

typedef enum strata_device_backend {
  STRATA_DEVICE_AUTO = 0,    /* CUDA when a GPU is usable, else the host-emulated device */
  STRATA_DEVICE_CUDA = 1,    /* CUDA only; runtime creation fails without a usable GPU */
  STRATA_DEVICE_EMULATED = 2 /* host memory standing in for a GPU (tests, CPU-only machines) */
} strata_device_backend;

/* How the NVMe tier lays tensors out on a swap directory (config.nvme_layout). */
typedef enum strata_nvme_layout {
  STRATA_NVME_EXTENTS = 0,        /* one preallocated swap file whose space Strata manages */
  STRATA_NVME_FILE_PER_TENSOR = 1 /* ZeRO-Infinity's layout: a file per tensor, opened, stat'ed and
                                     closed around every request, no checksums. For baselines
                                     (strata bench finetune); needs nvme_path */
} strata_nvme_layout;

typedef struct strata_config {
  size_t struct_size; /* sizeof(strata_config) */

  /* NVMe tier: a directory in which Strata creates one preallocated swap file, or a raw block
   * device. Exactly one of the two is set. */
  const char* nvme_path;
  const char* raw_device;
  uint64_t nvme_capacity_bytes; /* swap file size; 0 = 1/2 of the file system's free space */
  int keep_swap_file;           /* nonzero: leave the swap file in place on destroy */
  int verify_checksums;         /* nonzero (default): checksum every extent, verify every read */

  /* Budgets per tier, in bytes. host_budget_bytes must be 0 (STRATA_E_UNSUPPORTED otherwise):
   * Strata holds no pageable host memory of its own, every host buffer being pinned and bounded
   * by pinned_budget_bytes. 0 (the default) for pinned_budget_bytes is automatic: the least pinned
   * memory that keeps the drive and the CPU optimizer at full speed, sized at creation from the
   * drive (measured on the NVMe tier by a probe of a few hundred milliseconds, or declared with
   * drive_read_bytes_per_s and drive_write_bytes_per_s) and not from the model: streaming staging
   * buffers for the bytes the drive needs in flight, plus the optimizer's read-ahead
   * (docs/tuning.md has the formula). strata_get_stats reports the budget in force. Automatic needs
   * streaming (policy STRATA, STRATA_NVME_EXTENTS, not STRATA_STREAMING_OFF). */
  uint64_t pinned_budget_bytes;
  uint64_t device_budget_bytes;
  uint64_t host_budget_bytes;

  /* I/O engine. */
  strata_io_engine io_engine;
  uint32_t queue_depth; /* requests in flight per engine (default 32) */
  uint32_t block_size;  /* bytes per request; a multiple of 4096 (default 1 MiB) */

  /* Threads: I/O completion / scheduling workers and CPU optimizer threads (0 = automatic). */
  uint32_t worker_threads;
  uint32_t optimizer_threads;

  /* Placement. */
  strata_policy policy;
  strata_device_backend device_backend;
  int device_ordinal; /* CUDA device (default 0) */
  int numa_node;      /* pinned memory NUMA node; -1 (default) = nearest the GPU, else caller's */

  /* Tracing for strata_export_trace: events kept (96 bytes each, allocated at creation).
   * 0 (default) = off. */
  uint32_t trace_events;

  /* The tensors the framework will register, when it knows them up front (read only during
   * strata_runtime_create, and checked under every policy: STRATA_E_INVALID for an element
   * with bytes 0, an unknown dtype or kind, or a struct_size unlike element 0's; at most 2^24).
   * Policy ZERO_INFINITY needs them: like DeepSpeed's buffer_size, its uniform slots and
   * optimizer buffers are sized for the largest tensor and sub-group. */
  const struct strata_tensor_desc* planned_tensors;
  size_t planned_tensor_count;

  /* Policy ZERO_INFINITY only: DeepSpeed's sub_group_size and offload_param.buffer_size in
   * elements (0 = DeepSpeed's defaults, 1e9 and 1e8). Benchmarks on scaled-down models scale
   * them with the model so the baseline keeps its full-size proportions. */
  uint64_t zero_sub_group_elements;
  uint64_t zero_param_buffer_elements;

  /* The NVMe tier's layout (default STRATA_NVME_EXTENTS). With STRATA_NVME_FILE_PER_TENSOR,
   * nvme_capacity_bytes bounds the bytes all files may hold (nothing is preallocated),
   * worker_threads is the number of I/O threads (DeepSpeed's aio thread_count; 0 = 1), and
   * verify_checksums, STRATA_FAULTS and STRATA_PACED_DRIVE do not apply. */
  strata_nvme_layout nvme_layout;

  /* Streamed device transfers (policy STRATA with STRATA_NVME_EXTENTS): a tensor moves between
   * NVMe and the device chunk by chunk through stream_buffers staging buffers per direction of
   * stream_chunk_bytes each, so that no pinned buffer of the tensor's size ever exists on that
   * path. The staging buffers are pinned memory held from creation to destroy, taken out of
   * pinned_budget_bytes and reported as pinned memory in use of kind OTHER; the chunk is also the
   * NVMe tier's checksum block. stream_chunk_bytes: a power of two from 64 KiB to 64 MiB, or 0
   * (default) = automatic (docs/memory.md, "Streaming"), or STRATA_STREAMING_OFF = no streaming
   * (device data moves through a pinned buffer of its own size; always so for policy
   * ZERO_INFINITY and STRATA_NVME_FILE_PER_TENSOR). stream_buffers: 1..64, 0 (default) =
   * automatic. The staging buffers may take at most half of pinned_budget_bytes. */
  uint64_t stream_chunk_bytes;
  uint32_t stream_buffers;

  /* The drive behind the NVMe tier, declared (bytes per second): with both set, an automatic
   * pinned budget is sized from them and queue_depth requests of block_size in flight instead
   * of a measurement. 0 (default) = measure. */
  uint64_t drive_read_bytes_per_s;
  uint64_t drive_write_bytes_per_s;
} strata_config;

/* config.stream_chunk_bytes: no streamed transfers. */
#define STRATA_STREAMING_OFF UINT64_MAX

/* Fills *config with defaults (and config->struct_size). Any thread.
 * Returns STRATA_E_INVALID when config is NULL. */
STRATA_API int strata_config_init(strata_config* config);

/* ---------------------------------------------------------------------------------------------
 * Runtime
 * ------------------------------------------------------------------------------------------- */
typedef struct strata_runtime strata_runtime;

/* Creates a runtime. On failure *out is NULL and the return code says why; the message of a
 * failed creation is available from strata_last_error(NULL) on the same thread.
 * Any thread. */
STRATA_API int strata_runtime_create(const strata_config* config, strata_runtime** out);

/* Waits for outstanding I/O, frees every tier and removes the swap file (unless kept).
 * The caller must ensure no other call on rt is running or will start. NULL is a no-op. */
STRATA_API int strata_runtime_destroy(strata_runtime* rt);

/* The context of the most recent failed call on rt, made by the calling thread, or "" when none.
 * With rt == NULL: the last failed strata_runtime_create on this thread. The pointer stays
 * valid until the next call on rt from the same thread. Any thread. Never NULL. */
STRATA_API const char* strata_last_error(const strata_runtime* rt);

/* ---------------------------------------------------------------------------------------------
 * Tensors
 *
 * A tensor is a named, fixed-size byte range that Strata places on a tier and moves between
 * tiers. Its handle is a 64-bit value (0 is never valid) that stays unique for the runtime's
 * lifetime: a handle used after unregister returns STRATA_E_BAD_HANDLE, never touches memory.
 * ------------------------------------------------------------------------------------------- */
typedef uint64_t strata_tensor;
#define STRATA_TENSOR_NONE ((strata_tensor)0)

typedef enum strata_dtype {
  STRATA_DTYPE_F32 = 0,
  STRATA_DTYPE_BF16 = 1,
  STRATA_DTYPE_F16 = 2,
  STRATA_DTYPE_I8 = 3,
  STRATA_DTYPE_U8 = 4
} strata_dtype;

typedef enum strata_tensor_kind {
  STRATA_KIND_PARAMETER = 0,
  STRATA_KIND_GRADIENT = 1,
  STRATA_KIND_MASTER_WEIGHT = 2, /* fp32 master copy */
  STRATA_KIND_ADAM_M = 3,
  STRATA_KIND_ADAM_V = 4,
  STRATA_KIND_ACTIVATION_CHECKPOINT = 5,
  STRATA_KIND_OTHER = 6
} strata_tensor_kind;

typedef enum strata_tier {
  STRATA_TIER_HOST = 0,   /* pageable host memory (accounting only: Strata stages in pinned) */
  STRATA_TIER_PINNED = 1, /* pinned host memory */
  STRATA_TIER_DEVICE = 2, /* GPU memory (or the host-emulated device) */
  STRATA_TIER_NVME = 3    /* the extent store */
} strata_tier;

typedef struct strata_tensor_desc {
  size_t struct_size; /* sizeof(strata_tensor_desc) */
  const char* name;   /* copied; need not be unique, but traces read better if it is */
  uint64_t bytes;     /* > 0 */
  strata_dtype dtype;
  strata_tensor_kind kind;
  int32_t layer;         /* transformer layer, or -1 for none (embedding, head, ...) */
  strata_tier home_tier; /* where the tensor lives when not in use (usually NVME) */
  uint32_t flags;        /* STRATA_TENSOR_* below; 0 (the default of an older, smaller struct) */
} strata_tensor_desc;

/* A read-only tensor: a frozen weight (a LoRA / QLoRA base). It takes its contents from
 * strata_tensor_write (which may reload it at any time it is not acquired) and is otherwise never
 * written: strata_acquire with STRATA_ACQUIRE_DISCARD, strata_release with STRATA_RELEASE_DIRTY
 * and strata_optimizer_add_param fail on it with STRATA_E_INVALID (a refused release leaves the
 * acquire in place: release it again without DIRTY). Its memory copies are therefore always
 * clean: eviction drops them and NVMe is only read, which strata_stats'
 * nvme_bytes_written_by_kind shows. */
#define STRATA_TENSOR_READ_ONLY 1u

/* Registers a tensor. It has no contents until written (strata_tensor_write, or an acquire with
 * STRATA_ACQUIRE_DISCARD and a release): reading it before is STRATA_E_STATE. A tensor whose home
 * is NVMe gets its NVMe space now: STRATA_E_NOSPACE here, with the numbers, when the swap file or
 * device cannot hold it. Any thread. */
STRATA_API int strata_tensor_register(strata_runtime* rt, const strata_tensor_desc* desc,
                                      strata_tensor* out);
/* Copies bytes [offset, offset + bytes) of the tensor from / to caller memory, wherever the
 * tensor lives. Fails with STRATA_E_STATE while the tensor is acquired. Any thread. */
STRATA_API int strata_tensor_write(strata_runtime* rt, strata_tensor tensor, const void* src,
                                   uint64_t offset, uint64_t bytes);
STRATA_API int strata_tensor_read(strata_runtime* rt, strata_tensor tensor, void* dst,
                                  uint64_t offset, uint64_t bytes);
/* strata_tensor_write / strata_tensor_read with the caller's own bound, in milliseconds, on the
 * wait for the pinned room the copy passes through (0: no wait), where those wait up to 300 s.
 * At the bound they return STRATA_E_TIMEOUT having copied nothing: the tensor's contents and
 * the caller's buffer are as they were; a read of the tensor from NVMe it started stays in
 * flight. For callers that must stay responsive, as strata_acquire_timeout. Any thread. */
STRATA_API int strata_tensor_write_timeout(strata_runtime* rt, strata_tensor tensor,
                                           const void* src, uint64_t offset, uint64_t bytes,
                                           uint32_t timeout_ms);
STRATA_API int strata_tensor_read_timeout(strata_runtime* rt, strata_tensor tensor, void* dst,
                                          uint64_t offset, uint64_t bytes, uint32_t timeout_ms);
/* Forgets a tensor and frees its space on every tier, and any unreported failure of it. Fails
 * with STRATA_E_STATE while it is acquired, and for a strata_malloc allocation (strata_free).
 * Any thread. */
STRATA_API int strata_tensor_unregister(strata_runtime* rt, strata_tensor tensor);

/* ---------------------------------------------------------------------------------------------
 * Allocator face: memory a framework asks Strata to place. An allocation is an anonymous tensor
 * (kind OTHER): strata_acquire gives its address. Without STRATA_MALLOC_OFFLOADABLE it stays
 * resident on its tier until strata_free; with it, a released allocation may be spilled to NVMe
 * under pressure and is brought back by the next acquire.
 * ------------------------------------------------------------------------------------------- */
#define STRATA_MALLOC_OFFLOADABLE 1u

/* Any thread. tier is DEVICE or PINNED. The memory is taken at the call: a budget that cannot
 * hold it beside what never leaves the tier or is acquired now fails here, without waiting for
 * releases (STRATA_E_PINNED_BUDGET / STRATA_E_DEVICE_BUDGET, with the numbers). The contents are
 * undefined until written. */
STRATA_API int strata_malloc(strata_runtime* rt, uint64_t bytes, strata_tier tier, uint32_t flags,
                             strata_tensor* out);
/* Any thread. Fails with STRATA_E_STATE while acquired, and for a registered tensor
 * (strata_tensor_unregister). */
STRATA_API int strata_free(strata_runtime* rt, strata_tensor allocation);

/* ---------------------------------------------------------------------------------------------
 * The training loop, once per layer
 *
 * A step is: strata_step_begin; for each layer in forward order strata_layer_begin(FORWARD, l)
 * ... acquire / release ... strata_layer_end; the same in reverse with BACKWARD; the optimizer
 * (phase OPTIMIZER); strata_step_end. The first step records which tensors each layer touches;
 * later steps prefetch along that order (or along strata_declare_schedule). The loop calls are
 * made from one thread at a time (the training thread); acquire / release may come from any.
 * ------------------------------------------------------------------------------------------- */
typedef enum strata_phase {
  STRATA_PHASE_FORWARD = 0,
  STRATA_PHASE_BACKWARD = 1,
  STRATA_PHASE_OPTIMIZER = 2
} strata_phase;

STRATA_API int strata_step_begin(strata_runtime* rt);
/* Ends the step; returns the earliest unreported write-back failure that has happened by now.
 * It writes nothing back: strata_sync does, and reports a failure of those writes. */
STRATA_API int strata_step_end(strata_runtime* rt);
/* STRATA_E_STATE outside a step (before strata_step_begin, after strata_step_end). */
STRATA_API int strata_layer_begin(strata_runtime* rt, strata_phase phase, int32_t layer);
STRATA_API int strata_layer_end(strata_runtime* rt, strata_phase phase, int32_t layer);

/* Declares in advance which tensors each (phase, layer) touches, in order; replaces what the
 * first step would record. Training thread. */
typedef struct strata_schedule_entry {
  strata_phase phase;
  int32_t layer;
  strata_tensor tensor;
  strata_tier tier; /* where it will be acquired */
} strata_schedule_entry;
STRATA_API int strata_declare_schedule(strata_runtime* rt, const strata_schedule_entry* entries,
                                       size_t count);

#define STRATA_ACQUIRE_DISCARD 1u /* contents will be overwritten: skip reading them */

typedef struct strata_acquired {
  size_t struct_size; /* sizeof(strata_acquired) */
  void* data;         /* valid until strata_release */
  uint64_t bytes;
  /* When not NULL, the cudaEvent_t (as void*) the caller's stream must wait on before touching
   * data (cudaStreamWaitEvent). NULL: data is ready on return. This version always returns NULL:
   * an acquire returns once the copy to the device has completed. */
  void* ready_event;
} strata_acquired;

/* Makes the tensor resident on tier (DEVICE or PINNED) and pins it there until released: waits
 * for any read in flight, never evicts it meanwhile. Acquires nest (a count). Without
 * STRATA_ACQUIRE_DISCARD the contents are loaded, and a tensor that has none (never written, or
 * discarded) is STRATA_E_STATE. Waits that can never end (the tensor cannot fit beside what never
 * leaves its pool, or a failed write-back holds the room) fail at once; so does a device acquire
 * that fits the budget but no free range of the device arena while every other tensor there is
 * acquired or at home and nothing is in flight (STRATA_E_DEVICE_BUDGET, naming the largest free
 * range: release and retry). Others time out after 300 s (STRATA_E_TIMEOUT). Any thread. */
STRATA_API int strata_acquire(strata_runtime* rt, strata_tensor tensor, strata_tier tier,
                              uint32_t flags, strata_acquired* out);

/* strata_acquire with the caller's own bound on its wait, in milliseconds (0: no wait, only what
 * is resident now or becomes so while the call looks). When the bound passes it returns
 * STRATA_E_TIMEOUT having acquired nothing; a read it started stays in flight, so the next
 * acquire of the tensor finds it done or under way. For callers that must stay responsive while
 * they wait: a binding that hears Ctrl-C between short waits, a loop with its own deadline.
 * Waits that can never end fail at once, as in strata_acquire, which is this call with 300000.
 * Any thread. */
STRATA_API int strata_acquire_timeout(strata_runtime* rt, strata_tensor tensor, strata_tier tier,
                                      uint32_t flags, uint32_t timeout_ms, strata_acquired* out);

#define STRATA_RELEASE_DIRTY 1u /* the caller modified the data: it must reach NVMe again */

/* Ends one acquire. With DIRTY, the new contents are written back before the buffer is reused;
 * the previous copy on NVMe stays valid until that write has succeeded. device_stream: for a
 * DEVICE tensor on CUDA, the cudaStream_t whose queued work reads or writes the data; Strata
 * copies the data out, and reuses its memory, only after that work. NULL there is CUDA's default
 * stream, as everywhere in CUDA (work queued on a stream created with cudaStreamNonBlocking needs
 * that stream). Ignored for other tiers and for the emulated device. Any thread. */
STRATA_API int strata_release(strata_runtime* rt, strata_tensor tensor, uint32_t flags,
                              void* device_stream);

/* Declares the tensor's contents dead (gradients once the optimizer has consumed them, scratch
 * space): its buffers are freed on every tier and nothing is written back. Until it is written
 * again (strata_tensor_write, or an acquire with STRATA_ACQUIRE_DISCARD then a release), reading
 * it fails with STRATA_E_STATE rather than returning stale bytes. Deferred while a transfer of it
 * is in flight; STRATA_E_STATE while it is acquired. Any thread. */
STRATA_API int strata_tensor_discard(strata_runtime* rt, strata_tensor tensor);

/* Asks for the tensor to be brought toward tier ahead of time. Never blocks. Any thread. */
STRATA_API int strata_prefetch(strata_runtime* rt, strata_tensor tensor, strata_tier tier);

/* Writes every released dirty tensor back to NVMe and waits until no write is in flight;
 * returns the earliest unreported write-back failure of a live tensor (once: the write-back is
 * retried after). A failed write-back keeps the tensor's data in memory, readable. Any thread. */
STRATA_API int strata_sync(strata_runtime* rt);
/* strata_sync with the caller's own bound, in milliseconds, where strata_sync waits up to 300 s.
 * At the bound: STRATA_E_TIMEOUT, the write-backs it started still in flight (call it again to
 * wait for them; an unreported failure stays for the call that finishes). Any thread. */
STRATA_API int strata_sync_timeout(strata_runtime* rt, uint32_t timeout_ms);

/* Writes a Chrome trace-event JSON file (Perfetto, chrome://tracing) of what the runtime did
 * since it was created: reads, writes, copies, waits. No tensor data. Any thread. */
STRATA_API int strata_export_trace(strata_runtime* rt, const char* path);

/* ---------------------------------------------------------------------------------------------
 * Memory statistics
 *
 * Exact counters Strata keeps per tier and per tensor kind, beside the host memory the OS charges
 * the process. "reserved" is memory held from the OS / GPU / NVMe space (others cannot use it):
 * the pinned pages mapped (buffers kept for reuse included), the device arena, the NVMe capacity.
 * "in use" is what tensors and allocations are charged now, as the scheduler counts it against
 * the budgets: each one's bytes rounded up to 4 KiB on the pinned tier and to 256 bytes on the
 * device; on NVMe, its extent (rounded up to the store's block). Peaks are since creation. Host
 * memory as the OS sees it: os_peak_rss_bytes is VmHWM; the "excluding emulated device" figures
 * leave out the memory that stands in for a GPU on the host-emulated device, so a CPU-only run
 * reports what a GPU run would. Filled by strata_get_stats (struct_size first: older, smaller
 * structs get the fields they have).
 * ------------------------------------------------------------------------------------------- */
#define STRATA_STATS_KIND_SLOTS 8 /* indexed by strata_tensor_kind; spare slots read 0 */

typedef struct strata_kind_stats {
  uint64_t in_use_bytes;
  uint64_t peak_in_use_bytes;
} strata_kind_stats;

typedef struct strata_tier_stats {
  uint64_t reserved_bytes;
  uint64_t in_use_bytes;
  uint64_t peak_reserved_bytes;
  uint64_t peak_in_use_bytes;
  strata_kind_stats kinds[STRATA_STATS_KIND_SLOTS];
} strata_tier_stats;

typedef struct strata_stats {
  size_t struct_size;       /* sizeof(strata_stats) */
  strata_tier_stats host;   /* pageable host buffers of Strata's own: none, always 0 (it pins) */
  strata_tier_stats pinned; /* pinned host arena: staging buffers and pinned tensors */
  strata_tier_stats device; /* GPU memory (or the emulated device's) */
  strata_tier_stats nvme;   /* extent store space: reserved = capacity, in use = live extents */
  uint64_t nvme_bytes_read;
  uint64_t nvme_bytes_written;
  uint64_t os_rss_bytes;      /* VmRSS now */
  uint64_t os_peak_rss_bytes; /* VmHWM: the kernel's peak of VmRSS */
  /* RssAnon + RssFile + (RssShmem - the emulated device's resident memory): now, and the peak
   * seen by the runtime's sampler (sampled every few milliseconds). */
  uint64_t os_host_bytes_excluding_emulated_device;
  uint64_t os_peak_host_bytes_excluding_emulated_device;
  uint64_t emulated_device_resident_bytes; /* host memory backing the emulated device; 0 on CUDA */
  /* The pinned budget in force: as configured, or what the automatic sizing chose. */
  uint64_t pinned_budget_bytes;
  /* The tensors' completed NVMe reads and writes, their bytes counted by tensor (the totals
   * above count the store's requests), indexed by strata_tensor_kind (spare slots read 0): a
   * frozen base's PARAMETER writes stay at what loading it wrote. */
  uint64_t nvme_bytes_read_by_kind[STRATA_STATS_KIND_SLOTS];
  uint64_t nvme_bytes_written_by_kind[STRATA_STATS_KIND_SLOTS];
  /* How the pinned budget in force is spent (docs/tuning.md): streaming staging buffers of
   * pinned_staging_bytes, stream_buffers per direction of stream_chunk_bytes each (all 0 without
   * streaming), and the optimizer's sub-group per state tensor (its sub_group_bytes option when
   * set, else what the budget's sizing chose; the pool is the budget less the staging). */
  uint64_t pinned_staging_bytes;
  uint64_t stream_chunk_bytes;
  uint64_t optimizer_sub_group_bytes;
  uint32_t stream_buffers;
  /* How long the tensors' NVMe transfers (those counted by kind above) kept the drive busy, in
   * microseconds since creation: with at least one read in flight, at least one write, and at
   * least one of either. Where reads and writes ran at once, nvme_busy_us is less than the sum
   * of the other two; it is never less than the larger. A kind's bytes over its direction's busy
   * time is the rate the drive delivered to the runtime while busy (docs/telemetry.md). */
  uint64_t nvme_read_busy_us;
  uint64_t nvme_write_busy_us;
  uint64_t nvme_busy_us;
  /* The copies between pinned host memory and the device (the emulated device's too: memcpy),
   * whole buffers and stream chunks: bytes that arrived, and microseconds since creation with at
   * least one copy in flight, per direction. Bytes over busy time is the rate the link delivered
   * while busy (docs/telemetry.md). */
  uint64_t host_to_device_bytes;
  uint64_t device_to_host_bytes;
  uint64_t host_to_device_busy_us;
  uint64_t device_to_host_busy_us;
} strata_stats;

/* Fills *out (set out->struct_size first). Any thread. */
STRATA_API int strata_get_stats(strata_runtime* rt, strata_stats* out);

/* ---------------------------------------------------------------------------------------------
 * Optimizer: Adam / AdamW on the CPU over states that live on NVMe
 *
 * The optimizer owns the fp32 master weights and the Adam moments (m, v) of every parameter put
 * under it. They are tensors of its own (kinds MASTER_WEIGHT, ADAM_M, ADAM_V, home tier NVMe),
 * split into sub-groups that fit the pinned budget. strata_optimizer_step streams them: the read
 * of sub-group i+1, the update of sub-group i and the write-back of sub-group i-1 overlap. After
 * the update, the new weights are written into the parameter tensor in its own dtype, and the
 * gradient is discarded (strata_tensor_discard): the next backward acquires it with
 * STRATA_ACQUIRE_DISCARD.
 *
 * Thread rules: the strata_optimizer_* calls come from one thread at a time (the training
 * thread); they may run concurrently with acquire / release of other tensors.
 * ------------------------------------------------------------------------------------------- */
typedef struct strata_optimizer_group {
  size_t struct_size;         /* sizeof(strata_optimizer_group) */
  double lr;                  /* >= 0 */
  double beta1;               /* [0, 1) */
  double beta2;               /* [0, 1) */
  double eps;                 /* >= 0 */
  double weight_decay;        /* >= 0 */
  int decoupled_weight_decay; /* 1: AdamW (p -= lr * wd * p); 0: Adam (g += wd * p) */
} strata_optimizer_group;

/* torch.optim.AdamW's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2,
 * decoupled. Any thread. */
STRATA_API int strata_optimizer_group_init(strata_optimizer_group* group);

/* Adds a parameter group (torch's param_groups); *index receives its index, from 0. */
STRATA_API int strata_optimizer_add_group(strata_runtime* rt, const strata_optimizer_group* group,
                                          uint32_t* index);
/* Changes a group's settings between steps (learning-rate schedulers). */
STRATA_API int strata_optimizer_set_group(strata_runtime* rt, uint32_t index,
                                          const strata_optimizer_group* group);
STRATA_API int strata_optimizer_get_group(strata_runtime* rt, uint32_t index,
                                          strata_optimizer_group* out);

/* Puts a parameter under the optimizer in a group. param: KIND_PARAMETER, dtype F32, BF16 or
 * F16, contents written; grad: KIND_GRADIENT, the same element count, dtype F32, BF16 or F16.
 * The master weights start as the parameter's contents (widened to fp32), m and v as zeros.
 * STRATA_E_STATE if the parameter is already under the optimizer or has no contents. */
STRATA_API int strata_optimizer_add_param(strata_runtime* rt, uint32_t group, strata_tensor param,
                                          strata_tensor grad);

typedef struct strata_optimizer_options {
  size_t struct_size;   /* sizeof(strata_optimizer_options) */
  double max_grad_norm; /* clip the unscaled global gradient norm to this; 0 = no clipping */
  int check_overflow;   /* 1: skip the whole step when a gradient holds inf or nan */
  /* 1: strata_optimizer_grad_ready starts a parameter's update at once, overlapping the rest of
   * backward. Needs max_grad_norm == 0 and check_overflow == 0 (nothing global to wait for). */
  int overlap_backward;
  uint64_t sub_group_bytes; /* per state tensor; 0 = sized from the pinned budget */
} strata_optimizer_options;

/* Defaults: no clipping, check_overflow 1, overlap_backward 0, sub_group_bytes 0. */
STRATA_API int strata_optimizer_options_init(strata_optimizer_options* options);
/* Sets every option. Each may change between steps, except sub_group_bytes, which sizes the
 * state tensors and is frozen by the first add_param: after it, pass the value in force (read
 * it with strata_optimizer_get_options) or the call fails with STRATA_E_STATE and changes
 * nothing. overlap_backward cannot change while a step's overlapped updates are under way. */
STRATA_API int strata_optimizer_configure(strata_runtime* rt,
                                          const strata_optimizer_options* options);
/* The options in force (what the last successful configure set, else the defaults), for a
 * read-modify-write: get, change a field, configure. sub_group_bytes is as configured (0 =
 * sized from the pinned budget). */
STRATA_API int strata_optimizer_get_options(strata_runtime* rt, strata_optimizer_options* out);

/* The gradient of param is final for this step (its layer's backward is done). The optimizer
 * folds it into the overflow check and norm while it is still resident and, with
 * overlap_backward, updates the parameter now. Optional: strata_optimizer_step handles any
 * parameter not announced. */
STRATA_API int strata_optimizer_grad_ready(strata_runtime* rt, strata_tensor param);

typedef struct strata_optimizer_result {
  size_t struct_size;  /* sizeof(strata_optimizer_result) */
  int found_nonfinite; /* 1: a gradient held inf/nan; nothing was updated, step unchanged */
  double grad_norm;    /* the unscaled global L2 norm of the gradients, before clipping */
  int64_t step;        /* the step count after this call */
  /* Where the step's wall time went, for tuning: waiting for NVMe reads of states, updating,
   * waiting for write-backs. */
  double read_wait_seconds;
  double update_seconds;
  double write_wait_seconds;
} strata_optimizer_result;

/* One optimizer step over every parameter: gradients are divided by loss_scale (1 = none),
 * clipped, and applied with bias correction for the new step count. Parameters are updated in
 * the order strata_optimizer_grad_ready announced them this step (backward's order, so the first
 * layers, which the next forward needs first, are updated last), then those not announced, in
 * the order they were added. result may be NULL. */
STRATA_API int strata_optimizer_step(strata_runtime* rt, double loss_scale,
                                     strata_optimizer_result* result);

/* The step count (torch's state['step']): 0 before the first step. */
STRATA_API int strata_optimizer_get_step(strata_runtime* rt, int64_t* step);
STRATA_API int strata_optimizer_set_step(strata_runtime* rt, int64_t step);

typedef enum strata_optimizer_state {
  STRATA_OPTIMIZER_MASTER = 0,    /* fp32 master weights */
  STRATA_OPTIMIZER_EXP_AVG = 1,   /* Adam m, fp32 */
  STRATA_OPTIMIZER_EXP_AVG_SQ = 2 /* Adam v, fp32 */
} strata_optimizer_state;

/* Copies one state of one parameter (element count x 4 bytes) out of / into Strata. */
STRATA_API int strata_optimizer_read_state(strata_runtime* rt, strata_tensor param,
                                           strata_optimizer_state state, void* dst, uint64_t bytes);
STRATA_API int strata_optimizer_write_state(strata_runtime* rt, strata_tensor param,
                                            strata_optimizer_state state, const void* src,
                                            uint64_t bytes);

/* Writes every parameter's states, the groups and the step count to path, in the documented
 * checkpoint format (docs/optimizer.md: header, version, per-record checksums). Atomic: a
 * temporary file beside path is written, fsynced and renamed over it; an interrupted export
 * leaves the previous file intact. */
STRATA_API int strata_optimizer_export(strata_runtime* rt, const char* path);
/* Reads a checkpoint written by strata_optimizer_export into the parameters already under the
 * optimizer, matched by name and element count; STRATA_E_CORRUPT on a bad checksum,
 * STRATA_E_INVALID on a mismatch, and nothing is changed unless the whole file is good. */
STRATA_API int strata_optimizer_import(strata_runtime* rt, const char* path);

/* ---------------------------------------------------------------------------------------------
 * NF4 quantization (QLoRA's 4-bit NormalFloat, for a frozen base model's weights)
 *
 * Pure functions of their arguments: no runtime handle, so they return the code only (there is
 * no last-error text to read). Any thread, any number at once, as long as no call writes a
 * buffer another reads. Details and the derivation: docs/quantization.md.
 *
 * Packed format (little-endian) of count elements: blocks of STRATA_NF4_BLOCK_ELEMENTS
 * consecutive elements (the last may be short); first one float32 absmax per block (the largest
 * |x| of the block), then ceil(count / 2) bytes of 4-bit codes, element 2i in the low nibble and
 * element 2i + 1 in the high nibble of byte i (an odd count's last high nibble is 0). Code k of a
 * block decodes to NF4[k] * absmax as an fp32 product rounded to nearest even, then rounded to
 * nearest even into bf16 or fp16 for those outputs. NF4 is the 16-value table of the QLoRA paper
 * (appendix E): -1, -0.6961928, ..., 0 (code 7), ..., 0.7229568, 1. The buffer does not record
 * count: keep it beside the buffer.
 *
 * Error bound, for every element x of a block with scale absmax, decoded to y:
 *   |x - y| <= absmax * 0.15190359950065613 + u * |y| + eta
 * (0.1519... is half the largest gap between neighbouring NF4 values; each element gets the
 * exactly nearest value, ties to the lower code), with (u, eta) = (2^-24, 2^-150) for fp32
 * output, (2^-8 + 2^-23, 2^-133) for bf16, (2^-11 + 2^-23, 2^-24) for fp16.
 * ------------------------------------------------------------------------------------------- */
#define STRATA_NF4_BLOCK_ELEMENTS 64

/* Bytes of the packed form of count elements: 4 * ceil(count / 64) + ceil(count / 2); 0 when
 * count is 0 or above 2^56 (which no NF4 function accepts). */
STRATA_API uint64_t strata_nf4_packed_bytes(uint64_t count);

/* Quantizes count elements of src (STRATA_DTYPE_F32, _BF16 or _F16; any alignment) into dst,
 * which must hold strata_nf4_packed_bytes(count) bytes (dst_bytes may be larger; only that many
 * are written). Exact and deterministic: the same input gives the same bytes on every machine.
 * STRATA_E_INVALID, with dst untouched, for NULL pointers, count 0 or above 2^56, dst_bytes too
 * small, another dtype, or a NaN or infinity in src. src and dst must not overlap. */
STRATA_API int strata_nf4_quantize(const void* src, strata_dtype src_dtype, uint64_t count,
                                   void* dst, uint64_t dst_bytes);

/* Dequantizes a packed buffer in host memory into dst (count elements of dst_dtype: F32, BF16 or
 * F16; any alignment), with the fastest SIMD path of this CPU (scalar, AVX2, AVX-512: all write
 * the same bits, and the same bits as strata_nf4_dequantize_cuda). src_bytes must equal
 * strata_nf4_packed_bytes(count). STRATA_E_INVALID, with dst untouched, for NULL pointers, bad
 * sizes, another dtype, a buffer that is not NF4 data (an absmax that is not a finite number
 * >= 0, a non-zero padding nibble), or a block whose absmax would round to infinity in dst_dtype
 * (fp16: 65520 and above). */
STRATA_API int strata_nf4_dequantize(const void* src, uint64_t src_bytes, uint64_t count, void* dst,
                                     strata_dtype dst_dtype);

/* The same on the GPU: src_device and dst_device are memory of the current CUDA device (or
 * managed, or mapped pinned host memory), dst_device aligned to its dtype's size, cuda_stream a
 * cudaStream_t (NULL: the legacy default stream). Only enqueues the work: dst_device is ready when
 * the stream has run it. The buffer is not read on the host, so it is not checked for being NF4
 * data and a block that overflows fp16 or bf16 decodes to infinities: check a buffer once with
 * strata_nf4_dequantize (or keep what strata_nf4_quantize wrote) before uploading it.
 * STRATA_E_INVALID for bad arguments or pointers the GPU cannot address, STRATA_E_DEVICE when CUDA
 * reports an error, STRATA_E_UNSUPPORTED in a build without CUDA. */
STRATA_API int strata_nf4_dequantize_cuda(const void* src_device, uint64_t src_bytes,
                                          uint64_t count, void* dst_device, strata_dtype dst_dtype,
                                          void* cuda_stream);

/* ---------------------------------------------------------------------------------------------
 * PyTorch pluggable allocator
 *
 * Entry points for torch.cuda.memory.CUDAPluggableAllocator, so that PyTorch's own GPU tensors
 * (activations, workspaces) come out of Strata's device arena and share its budget:
 *
 *   alloc = torch.cuda.memory.CUDAPluggableAllocator("libstrata.so", "strata_torch_alloc",
 *                                                    "strata_torch_free")
 *   torch.cuda.memory.change_current_allocator(alloc)   # before any CUDA tensor exists
 *
 * The stream is a cudaStream_t (declared as void* so that this header needs no CUDA headers; the
 * two have the same ABI). Torch's interface has no context pointer, so these functions serve the
 * device of the runtime that was created most recently and is still alive (the one exception to
 * "no global state"). Each allocation is taken as a strata_malloc on STRATA_TIER_DEVICE is: from
 * the device budget, at once (NULL when the budget cannot hold it beside what is resident or in
 * use: an allocator does not wait for releases), counted in strata_get_stats under the device
 * tier and kind STRATA_KIND_OTHER, and held until strata_torch_free; room torch holds is room
 * Strata's tensors cannot use. A device of another ordinal than the runtime's is not served from
 * it. Destroying the runtime gives back what torch still holds; a later free of such a pointer
 * is a no-op with a warning. Without such a runtime (or for another ordinal), memory comes from
 * cudaMalloc / cudaFree on GPU `device` when the library was built with CUDA and that GPU is
 * usable, and strata_torch_alloc returns NULL otherwise (torch reports an out-of-memory error).
 * A memory block freed on a stream is reused only after the work queued on that stream so far has
 * finished. Freeing NULL is a no-op; freeing a pointer that Strata did not hand out is a no-op
 * with a warning on stderr. Any thread.
 * ------------------------------------------------------------------------------------------- */
typedef void* strata_cuda_stream; /* cudaStream_t */

STRATA_API void* strata_torch_alloc(ssize_t size, int device, strata_cuda_stream stream);
STRATA_API void strata_torch_free(void* ptr, ssize_t size, int device, strata_cuda_stream stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_STRATA_H */
