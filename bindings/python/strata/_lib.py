"""The C ABI of libstrata.so, declared for ctypes: structs laid out as strata.h lays them out and
a prototype for every function, so that a wrong argument type fails in Python, not in C.

The library is found, in this order, at:
  1. $STRATA_LIBRARY (a path to libstrata.so);
  2. the copy bundled inside an installed package (strata/libstrata.so, put there by
     `pip install ./bindings/python`, see setup.py);
  3. a build tree beside this package in a source checkout (build/runtime/libstrata.so, then
     build-*/runtime/libstrata.so, newest first);
  4. an installed libstrata.so (ctypes.util.find_library("strata"), then the loader's search path).
"""
import ctypes
import ctypes.util
import glob
import os

from ctypes import (POINTER, Structure, c_char_p, c_double, c_int, c_int32, c_int64, c_size_t,
                    c_ssize_t, c_uint32, c_uint64, c_void_p)

# ---------------------------------------------------------------------------------------------
# Constants (strata.h)
OK = 0
E_INVALID = -1
E_BAD_HANDLE = -2
E_STATE = -3
E_NOMEM = -4
E_PINNED_BUDGET = -5
E_DEVICE_BUDGET = -6
E_NOSPACE = -7
E_IO = -8
E_CORRUPT = -9
E_UNSUPPORTED = -10
E_DEVICE = -11
E_LIMIT = -12
E_TIMEOUT = -13
E_INTERNAL = -14

IO_AUTO, IO_URING, IO_PSYNC = 0, 1, 2
POLICY_STRATA, POLICY_ZERO_INFINITY = 0, 1
NVME_EXTENTS, NVME_FILE_PER_TENSOR = 0, 1  # strata_nvme_layout
DEVICE_AUTO, DEVICE_CUDA, DEVICE_EMULATED = 0, 1, 2

DTYPE_F32, DTYPE_BF16, DTYPE_F16, DTYPE_I8, DTYPE_U8 = 0, 1, 2, 3, 4
DTYPE_BYTES = {DTYPE_F32: 4, DTYPE_BF16: 2, DTYPE_F16: 2, DTYPE_I8: 1, DTYPE_U8: 1}

KIND_PARAMETER = 0
KIND_GRADIENT = 1
KIND_MASTER_WEIGHT = 2
KIND_ADAM_M = 3
KIND_ADAM_V = 4
KIND_ACTIVATION_CHECKPOINT = 5
KIND_OTHER = 6

TIER_HOST, TIER_PINNED, TIER_DEVICE, TIER_NVME = 0, 1, 2, 3

PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER = 0, 1, 2

STREAMING_OFF = (1 << 64) - 1  # config.stream_chunk_bytes: no streamed transfers

MALLOC_OFFLOADABLE = 1
ACQUIRE_DISCARD = 1
TENSOR_READ_ONLY = 1
RELEASE_DIRTY = 1

OPTIMIZER_MASTER, OPTIMIZER_EXP_AVG, OPTIMIZER_EXP_AVG_SQ = 0, 1, 2

STATS_KIND_SLOTS = 8

strata_tensor = c_uint64
strata_runtime_p = c_void_p  # opaque


# ---------------------------------------------------------------------------------------------
# Structs. ctypes applies the platform C ABI's alignment, so these match the header's layout;
# tests/python/test_abi.py compiles the header and compares every size and offset.
class TensorDesc(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("name", c_char_p),
        ("bytes", c_uint64),
        ("dtype", c_int),
        ("kind", c_int),
        ("layer", c_int32),
        ("home_tier", c_int),
        ("flags", c_uint32),
    ]


class ConfigStruct(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("nvme_path", c_char_p),
        ("raw_device", c_char_p),
        ("nvme_capacity_bytes", c_uint64),
        ("keep_swap_file", c_int),
        ("verify_checksums", c_int),
        ("pinned_budget_bytes", c_uint64),
        ("device_budget_bytes", c_uint64),
        ("host_budget_bytes", c_uint64),
        ("io_engine", c_int),
        ("queue_depth", c_uint32),
        ("block_size", c_uint32),
        ("worker_threads", c_uint32),
        ("optimizer_threads", c_uint32),
        ("policy", c_int),
        ("device_backend", c_int),
        ("device_ordinal", c_int),
        ("numa_node", c_int),
        ("trace_events", c_uint32),
        ("planned_tensors", POINTER(TensorDesc)),
        ("planned_tensor_count", c_size_t),
        ("zero_sub_group_elements", c_uint64),
        ("zero_param_buffer_elements", c_uint64),
        ("nvme_layout", c_int),
        ("stream_chunk_bytes", c_uint64),
        ("stream_buffers", c_uint32),
        ("drive_read_bytes_per_s", c_uint64),
        ("drive_write_bytes_per_s", c_uint64),
    ]


class ScheduleEntry(Structure):
    _fields_ = [("phase", c_int), ("layer", c_int32), ("tensor", strata_tensor), ("tier", c_int)]


class Acquired(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("data", c_void_p),
        ("bytes", c_uint64),
        ("ready_event", c_void_p),
    ]


class KindStats(Structure):
    _fields_ = [("in_use_bytes", c_uint64), ("peak_in_use_bytes", c_uint64)]


class TierStats(Structure):
    _fields_ = [
        ("reserved_bytes", c_uint64),
        ("in_use_bytes", c_uint64),
        ("peak_reserved_bytes", c_uint64),
        ("peak_in_use_bytes", c_uint64),
        ("kinds", KindStats * STATS_KIND_SLOTS),
    ]


class StatsStruct(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("host", TierStats),
        ("pinned", TierStats),
        ("device", TierStats),
        ("nvme", TierStats),
        ("nvme_bytes_read", c_uint64),
        ("nvme_bytes_written", c_uint64),
        ("os_rss_bytes", c_uint64),
        ("os_peak_rss_bytes", c_uint64),
        ("os_host_bytes_excluding_emulated_device", c_uint64),
        ("os_peak_host_bytes_excluding_emulated_device", c_uint64),
        ("emulated_device_resident_bytes", c_uint64),
        ("pinned_budget_bytes", c_uint64),
        ("nvme_bytes_read_by_kind", c_uint64 * STATS_KIND_SLOTS),
        ("nvme_bytes_written_by_kind", c_uint64 * STATS_KIND_SLOTS),
        ("pinned_staging_bytes", c_uint64),
        ("stream_chunk_bytes", c_uint64),
        ("optimizer_sub_group_bytes", c_uint64),
        ("stream_buffers", c_uint32),
        ("nvme_read_busy_us", c_uint64),
        ("nvme_write_busy_us", c_uint64),
        ("nvme_busy_us", c_uint64),
        ("host_to_device_bytes", c_uint64),
        ("device_to_host_bytes", c_uint64),
        ("host_to_device_busy_us", c_uint64),
        ("device_to_host_busy_us", c_uint64),
    ]


class OptimizerGroup(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("lr", c_double),
        ("beta1", c_double),
        ("beta2", c_double),
        ("eps", c_double),
        ("weight_decay", c_double),
        ("decoupled_weight_decay", c_int),
    ]


class OptimizerOptions(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("max_grad_norm", c_double),
        ("check_overflow", c_int),
        ("overlap_backward", c_int),
        ("sub_group_bytes", c_uint64),
    ]


class OptimizerResult(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("found_nonfinite", c_int),
        ("grad_norm", c_double),
        ("step", c_int64),
        ("read_wait_seconds", c_double),
        ("update_seconds", c_double),
        ("write_wait_seconds", c_double),
    ]


# ---------------------------------------------------------------------------------------------
# Prototypes: name -> (restype, argtypes). Functions declared in strata.h but absent from the
# loaded library (an older build) are reported by missing_symbols() and raise StrataError with
# STRATA_E_UNSUPPORTED when called, instead of failing at import.
_R = strata_runtime_p
_PROTOTYPES = {
    "strata_version": (c_char_p, []),
    "strata_version_number": (c_int, []),
    "strata_strerror": (c_char_p, [c_int]),
    "strata_config_init": (c_int, [POINTER(ConfigStruct)]),
    "strata_runtime_create": (c_int, [POINTER(ConfigStruct), POINTER(c_void_p)]),
    "strata_runtime_destroy": (c_int, [_R]),
    "strata_last_error": (c_char_p, [_R]),
    "strata_tensor_register": (c_int, [_R, POINTER(TensorDesc), POINTER(strata_tensor)]),
    "strata_tensor_write": (c_int, [_R, strata_tensor, c_void_p, c_uint64, c_uint64]),
    "strata_tensor_read": (c_int, [_R, strata_tensor, c_void_p, c_uint64, c_uint64]),
    "strata_tensor_write_timeout": (c_int, [_R, strata_tensor, c_void_p, c_uint64, c_uint64,
                                            c_uint32]),
    "strata_tensor_read_timeout": (c_int, [_R, strata_tensor, c_void_p, c_uint64, c_uint64,
                                           c_uint32]),
    "strata_tensor_unregister": (c_int, [_R, strata_tensor]),
    "strata_malloc": (c_int, [_R, c_uint64, c_int, c_uint32, POINTER(strata_tensor)]),
    "strata_free": (c_int, [_R, strata_tensor]),
    "strata_step_begin": (c_int, [_R]),
    "strata_step_end": (c_int, [_R]),
    "strata_layer_begin": (c_int, [_R, c_int, c_int32]),
    "strata_layer_end": (c_int, [_R, c_int, c_int32]),
    "strata_declare_schedule": (c_int, [_R, POINTER(ScheduleEntry), c_size_t]),
    "strata_acquire": (c_int, [_R, strata_tensor, c_int, c_uint32, POINTER(Acquired)]),
    "strata_acquire_timeout": (c_int, [_R, strata_tensor, c_int, c_uint32, c_uint32,
                                       POINTER(Acquired)]),
    "strata_release": (c_int, [_R, strata_tensor, c_uint32, c_void_p]),
    "strata_tensor_discard": (c_int, [_R, strata_tensor]),
    "strata_prefetch": (c_int, [_R, strata_tensor, c_int]),
    "strata_sync": (c_int, [_R]),
    "strata_sync_timeout": (c_int, [_R, c_uint32]),
    "strata_export_trace": (c_int, [_R, c_char_p]),
    "strata_get_stats": (c_int, [_R, POINTER(StatsStruct)]),
    "strata_optimizer_group_init": (c_int, [POINTER(OptimizerGroup)]),
    "strata_optimizer_add_group": (c_int, [_R, POINTER(OptimizerGroup), POINTER(c_uint32)]),
    "strata_optimizer_set_group": (c_int, [_R, c_uint32, POINTER(OptimizerGroup)]),
    "strata_optimizer_get_group": (c_int, [_R, c_uint32, POINTER(OptimizerGroup)]),
    "strata_optimizer_add_param": (c_int, [_R, c_uint32, strata_tensor, strata_tensor]),
    "strata_optimizer_options_init": (c_int, [POINTER(OptimizerOptions)]),
    "strata_optimizer_configure": (c_int, [_R, POINTER(OptimizerOptions)]),
    "strata_optimizer_get_options": (c_int, [_R, POINTER(OptimizerOptions)]),
    "strata_optimizer_grad_ready": (c_int, [_R, strata_tensor]),
    "strata_optimizer_step": (c_int, [_R, c_double, POINTER(OptimizerResult)]),
    "strata_optimizer_get_step": (c_int, [_R, POINTER(c_int64)]),
    "strata_optimizer_set_step": (c_int, [_R, c_int64]),
    "strata_optimizer_read_state": (c_int, [_R, strata_tensor, c_int, c_void_p, c_uint64]),
    "strata_optimizer_write_state": (c_int, [_R, strata_tensor, c_int, c_void_p, c_uint64]),
    "strata_optimizer_export": (c_int, [_R, c_char_p]),
    "strata_optimizer_import": (c_int, [_R, c_char_p]),
    "strata_torch_alloc": (c_void_p, [c_ssize_t, c_int, c_void_p]),
    "strata_torch_free": (None, [c_void_p, c_ssize_t, c_int, c_void_p]),
    "strata_nf4_packed_bytes": (c_uint64, [c_uint64]),
    "strata_nf4_quantize": (c_int, [c_void_p, c_int, c_uint64, c_void_p, c_uint64]),
    "strata_nf4_dequantize": (c_int, [c_void_p, c_uint64, c_uint64, c_void_p, c_int]),
    "strata_nf4_dequantize_cuda": (c_int, [c_void_p, c_uint64, c_uint64, c_void_p, c_int,
                                           c_void_p]),
}

# The functions whose absence is tolerated at load time (added after 0.1.0's first cut).
_OPTIONAL_PREFIXES = ("strata_optimizer_", "strata_tensor_discard")


def _package_dir():
    return os.path.dirname(os.path.abspath(__file__))


def candidate_paths():
    """Where load() looks, in order (the env var first)."""
    paths = []
    env = os.environ.get("STRATA_LIBRARY")
    if env:
        paths.append(env)
    paths.append(os.path.join(_package_dir(), "libstrata.so"))  # a pip-installed package's own
    # bindings/python/strata -> repository root
    root = os.path.normpath(os.path.join(_package_dir(), "..", "..", ".."))
    paths.append(os.path.join(root, "build", "runtime", "libstrata.so"))
    others = glob.glob(os.path.join(root, "build-*", "runtime", "libstrata.so"))
    others.sort(key=lambda p: os.path.getmtime(p), reverse=True)
    paths.extend(others)
    return paths


class LibraryNotFound(OSError):
    pass


def _load():
    tried = []
    env = os.environ.get("STRATA_LIBRARY")
    for path in candidate_paths():
        tried.append(path)
        if os.path.exists(path):
            return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL), path
        if path == env:
            # An explicit choice that does not exist is an error, not a hint to look elsewhere.
            raise LibraryNotFound(f"STRATA_LIBRARY={env} does not exist")
    found = ctypes.util.find_library("strata")
    for name in ([found] if found else []) + ["libstrata.so", "libstrata.so.0"]:
        tried.append(name)
        try:
            return ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL), name
        except OSError:
            continue
    raise LibraryNotFound(
        "libstrata.so not found; build it (bash tests/run-all.sh, or cmake --build build "
        "--target strata) or set STRATA_LIBRARY to its path. Tried: " + ", ".join(tried))


class _Missing:
    """Stands in for a function the loaded library does not export."""

    def __init__(self, name):
        self.name = name

    def __call__(self, *args):
        from .errors import StrataError
        raise StrataError(E_UNSUPPORTED,
                          f"{self.name} is declared in strata.h but not exported by {path}: "
                          "rebuild libstrata.so from a tree that implements it")


lib, path = _load()
_missing = []
for _name, (_res, _args) in _PROTOTYPES.items():
    try:
        _fn = getattr(lib, _name)
    except AttributeError:
        if not _name.startswith(_OPTIONAL_PREFIXES):
            raise LibraryNotFound(f"{path} lacks {_name}: not a Strata library of this version")
        _missing.append(_name)
        globals()[_name] = _Missing(_name)
        continue
    _fn.restype = _res
    _fn.argtypes = _args
    globals()[_name] = _fn


def missing_symbols():
    """Functions strata.h declares that the loaded library does not export."""
    return list(_missing)


def has(name):
    return name not in _missing
