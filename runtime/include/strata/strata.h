/*
 * strata.h - the public C API of Strata, a tiered (GPU / pinned host / NVMe) memory runtime for
 * fine-tuning models larger than GPU memory and host RAM.
 *
 * This is the only public header. It is valid C11 and C++.
 *
 * Conventions
 *  - Every function that can fail returns an int: STRATA_OK (0) or a negative STRATA_E_* code.
 *    strata_strerror(code) names the code; strata_last_error(rt) gives the context of the most
 *    recent failure on that runtime (which call, which tensor, which numbers).
 *  - Handles are opaque. Passing NULL, a destroyed handle or a handle of another runtime returns
 *    an error code; it never crashes the caller.
 *  - Structs passed in or out start with `struct_size`, set by the caller to sizeof(the struct)
 *    as compiled against this header. The library accepts older (smaller) structs and fills only
 *    the fields they have, so programs built against an older header keep working.
 *  - No C++ exception ever crosses this API.
 *
 * Thread rules are stated on each function. "Any thread" means the call may run concurrently
 * with any other call on the same runtime except strata_runtime_destroy.
 */
#ifndef STRATA_STRATA_H
#define STRATA_STRATA_H

#include <stddef.h>
#include <stdint.h>

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
#define STRATA_E_INVALID -1        /* an argument is NULL, zero, out of range or inconsistent */
#define STRATA_E_BAD_HANDLE -2     /* the handle is unknown, released or of another runtime */
#define STRATA_E_STATE -3          /* the call is not allowed in the object's current state */
#define STRATA_E_NOMEM -4          /* host memory (malloc / mmap) could not be had */
#define STRATA_E_PINNED_BUDGET -5  /* the pinned host budget would be exceeded */
#define STRATA_E_DEVICE_BUDGET -6  /* the device budget would be exceeded */
#define STRATA_E_NOSPACE -7        /* the NVMe tier (swap file or raw device) is full */
#define STRATA_E_IO -8             /* a read or write failed (the message has the errno) */
#define STRATA_E_CORRUPT -9        /* data read back does not match its checksum */
#define STRATA_E_UNSUPPORTED -10   /* the system lacks what the call needs */
#define STRATA_E_DEVICE -11        /* the GPU runtime reported an error */
#define STRATA_E_LIMIT -12         /* an OS limit (file descriptors, memlock) was reached */
#define STRATA_E_TIMEOUT -13       /* a wait did not finish in time */
#define STRATA_E_INTERNAL -14      /* a bug in Strata: please report it with the message */

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
  STRATA_POLICY_STRATA = 0,       /* adaptive pool, exact pinning, direct NVMe extents */
  STRATA_POLICY_ZERO_INFINITY = 1 /* DeepSpeed ZeRO-Infinity's buffer behaviour, for comparison */
} strata_policy;

typedef enum strata_device_backend {
  STRATA_DEVICE_AUTO = 0,    /* CUDA when a GPU is usable, else the host-emulated device */
  STRATA_DEVICE_CUDA = 1,    /* CUDA only; runtime creation fails without a usable GPU */
  STRATA_DEVICE_EMULATED = 2 /* host memory standing in for a GPU (tests, CPU-only machines) */
} strata_device_backend;

typedef struct strata_config {
  size_t struct_size; /* sizeof(strata_config) */

  /* NVMe tier: a directory in which Strata creates one preallocated swap file, or a raw block
   * device. Exactly one of the two is set. */
  const char* nvme_path;
  const char* raw_device;
  uint64_t nvme_capacity_bytes; /* swap file size; 0 = 1/2 of the file system's free space */
  int keep_swap_file;           /* nonzero: leave the swap file in place on destroy */
  int verify_checksums;         /* nonzero (default): checksum every extent, verify every read */

  /* Budgets per tier, in bytes. 0 means "no limit" only for host_budget_bytes. */
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
} strata_config;

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

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_STRATA_H */
