"""Config: strata_config as Python keyword arguments.

Every field of strata_config but planned_tensors (a C array: the C API's) is an attribute with the
library's default (strata_config_init), except device_backend, "emulated" unless named (Python
must know whether device-tier pointers are GPU memory; strata.torch names it from the device).
Enums take names ("uring", "zero-infinity", "cuda", "file-per-tensor"). Unknown names, and
integers outside their C field's range (which ctypes would wrap: 2**32 + 32 into 32), are refused
with StrataError (STRATA_E_INVALID) rather than ignored.
"""
import ctypes
import difflib

from . import _lib
from .errors import StrataError, check

IO_ENGINES = {"auto": _lib.IO_AUTO, "uring": _lib.IO_URING, "io_uring": _lib.IO_URING,
              "psync": _lib.IO_PSYNC}
POLICIES = {"strata": _lib.POLICY_STRATA, "zero-infinity": _lib.POLICY_ZERO_INFINITY,
            "zero_infinity": _lib.POLICY_ZERO_INFINITY}
# No "auto": Python needs to know whether device-tier pointers are GPU or host memory before it
# wraps them, so the binding always names the backend (strata.torch picks it from the device).
DEVICE_BACKENDS = {"cuda": _lib.DEVICE_CUDA, "emulated": _lib.DEVICE_EMULATED,
                   "cpu": _lib.DEVICE_EMULATED}

NVME_LAYOUTS = {"extents": _lib.NVME_EXTENTS, "file-per-tensor": _lib.NVME_FILE_PER_TENSOR,
                "file_per_tensor": _lib.NVME_FILE_PER_TENSOR}

_ENUMS = {"io_engine": IO_ENGINES, "policy": POLICIES, "device_backend": DEVICE_BACKENDS,
          "nvme_layout": NVME_LAYOUTS}
_STRINGS = ("nvme_path", "raw_device")
_HIDDEN = ("struct_size", "planned_tensors", "planned_tensor_count")


def _library_defaults():
    c = _lib.ConfigStruct()
    check(_lib.strata_config_init(ctypes.byref(c)), None, "strata_config_init")
    out = {}
    for name, _ in _lib.ConfigStruct._fields_:
        if name in _HIDDEN:
            continue
        value = getattr(c, name)
        if name in _STRINGS:
            value = value.decode() if value else None
        out[name] = value
    out["device_backend"] = "emulated"
    out["io_engine"] = {v: k for k, v in IO_ENGINES.items()}[out["io_engine"]]
    out["policy"] = {v: k for k, v in POLICIES.items()}[out["policy"]]
    out["nvme_layout"] = {v: k for k, v in NVME_LAYOUTS.items()}[out["nvme_layout"]]
    return out


def _integer_range(ctype):
    bits = 8 * ctypes.sizeof(ctype)
    if ctype(-1).value == -1:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


FIELDS = tuple(name for name, _ in _lib.ConfigStruct._fields_ if name not in _HIDDEN)
# The integer fields' C ranges (stream_chunk_bytes' STREAMING_OFF is its largest value).
_RANGES = {name: _integer_range(ctype) for name, ctype in _lib.ConfigStruct._fields_
           if name in FIELDS and name not in _ENUMS and name not in _STRINGS}


class Config:
    """A runtime configuration. Config(nvme_path="/mnt/nvme", pinned_budget_bytes=2 << 30)."""

    def __init__(self, **fields):
        object.__setattr__(self, "_values", _library_defaults())
        for name, value in fields.items():
            setattr(self, name, value)

    def __setattr__(self, name, value):
        if name not in FIELDS:
            near = difflib.get_close_matches(name, FIELDS, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise StrataError(_lib.E_INVALID, f"strata config has no field {name!r}{hint}")
        if name in _ENUMS:
            if isinstance(value, str):
                if value.lower() not in _ENUMS[name]:
                    raise StrataError(_lib.E_INVALID,
                                      f"{name} {value!r} is not one of {sorted(_ENUMS[name])}")
                value = value.lower()
            else:
                raise StrataError(_lib.E_INVALID, f"{name} must be a name, one of "
                                                  f"{sorted(_ENUMS[name])}")
        elif name in _STRINGS:
            value = None if value is None else str(value)
        elif isinstance(value, bool):
            value = int(value)
        elif isinstance(value, float) and value.is_integer():
            value = int(value)  # DeepSpeed configs write sizes as 1e8
        elif not isinstance(value, int):
            raise StrataError(_lib.E_INVALID, f"{name} must be an integer, not {value!r}")
        if name in _RANGES:
            low, high = _RANGES[name]
            if not low <= value <= high:
                raise StrataError(_lib.E_INVALID, f"{name} {value} is outside {low}..{high}, the "
                                                  "range of its C field")
        self._values[name] = value

    def __getattr__(self, name):
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        raise AttributeError(name)

    def as_dict(self):
        return dict(self._values)

    def copy(self, **changes):
        c = Config(**self._values)
        for k, v in changes.items():
            setattr(c, k, v)
        return c

    def __repr__(self):
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in self._values.items()) + ")"

    def to_struct(self):
        """The strata_config, and the objects that must outlive it (strings)."""
        c = _lib.ConfigStruct()
        check(_lib.strata_config_init(ctypes.byref(c)), None, "strata_config_init")
        keep = []
        for name, value in self._values.items():
            if name in _ENUMS:
                value = _ENUMS[name][value]
            elif name in _STRINGS:
                if value is not None:
                    value = value.encode()
                    keep.append(value)
            setattr(c, name, value)
        return c, keep
