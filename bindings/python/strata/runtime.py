"""Runtime and Tensor: the C API's objects, owned by Python.

A Runtime owns a strata_runtime* and destroys it on close() (or when collected). Tensors are
64-bit handles of one runtime. acquire() returns an Acquisition whose memory is valid until it
is released; numpy() gives a zero-copy view of it (host memory: pinned, or the host-emulated
device). strata.torch turns the same memory into torch tensors, on the GPU too.
"""
import atexit
import ctypes
import math
import os
import re
import signal
import threading
import time
import weakref

import numpy as np

from . import _lib
from .config import Config
from .errors import StrataError, check

DTYPES = {"f32": _lib.DTYPE_F32, "float32": _lib.DTYPE_F32, "bf16": _lib.DTYPE_BF16,
          "bfloat16": _lib.DTYPE_BF16, "f16": _lib.DTYPE_F16, "float16": _lib.DTYPE_F16,
          "i8": _lib.DTYPE_I8, "int8": _lib.DTYPE_I8, "u8": _lib.DTYPE_U8, "uint8": _lib.DTYPE_U8}
# numpy has no bfloat16: its elements are viewed as uint16 (torch views them as bfloat16).
NUMPY_DTYPES = {_lib.DTYPE_F32: np.float32, _lib.DTYPE_BF16: np.uint16,
                _lib.DTYPE_F16: np.float16, _lib.DTYPE_I8: np.int8, _lib.DTYPE_U8: np.uint8}
KINDS = {"parameter": _lib.KIND_PARAMETER, "gradient": _lib.KIND_GRADIENT,
         "master_weight": _lib.KIND_MASTER_WEIGHT, "adam_m": _lib.KIND_ADAM_M,
         "adam_v": _lib.KIND_ADAM_V, "activation_checkpoint": _lib.KIND_ACTIVATION_CHECKPOINT,
         "other": _lib.KIND_OTHER}
TIERS = {"host": _lib.TIER_HOST, "pinned": _lib.TIER_PINNED, "device": _lib.TIER_DEVICE,
         "nvme": _lib.TIER_NVME}
PHASES = {"forward": _lib.PHASE_FORWARD, "backward": _lib.PHASE_BACKWARD,
          "optimizer": _lib.PHASE_OPTIMIZER}


def _enum(table, value, what):
    if isinstance(value, int) and value in table.values():
        return value
    if isinstance(value, str) and value.lower() in table:
        return table[value.lower()]
    raise StrataError(_lib.E_INVALID, f"{what} {value!r} is not one of {sorted(table)}")


def _buffer_address(buf, nbytes):
    """Address and byte size of a C-contiguous buffer (numpy array, bytes, bytearray, ctypes)."""
    arr = np.asarray(buf) if not isinstance(buf, (bytes, bytearray, memoryview)) else \
        np.frombuffer(buf, dtype=np.uint8)
    if not arr.flags["C_CONTIGUOUS"]:
        raise StrataError(_lib.E_INVALID, "buffer is not C-contiguous")
    return arr, arr.ctypes.data, arr.nbytes


class Acquisition:
    """One acquire of a tensor: data (the address) and nbytes, valid until release().

    Use as a context manager (`with t.acquire("pinned") as a: ...`), which releases on exit,
    dirty when `dirty=True` was given or mark_dirty() was called.
    """

    def __init__(self, tensor, tier, data, nbytes, ready_event, dirty):
        self.tensor = tensor
        self.tier = tier
        self.data = data
        self.nbytes = nbytes
        self.ready_event = ready_event
        self.dirty = dirty
        self.released = False

    def numpy(self, dtype=None, shape=None):
        """A zero-copy numpy view (host memory only), valid until release."""
        if self.released:
            raise StrataError(_lib.E_STATE, f"tensor {self.tensor.name!r} was released")
        if self.tier == _lib.TIER_DEVICE and not self.tensor.runtime.device_is_host:
            raise StrataError(_lib.E_INVALID,
                              "device-tier memory is GPU memory on this runtime; use "
                              "strata.torch.as_tensor(acquisition) for a CUDA tensor")
        dtype = np.dtype(dtype or NUMPY_DTYPES[self.tensor.dtype])
        raw = (ctypes.c_uint8 * self.nbytes).from_address(self.data)
        arr = np.ctypeslib.as_array(raw).view(dtype)
        return arr.reshape(shape) if shape is not None else arr

    def mark_dirty(self):
        self.dirty = True

    def release(self, dirty=None, stream=None):
        if self.released:
            raise StrataError(_lib.E_STATE, f"tensor {self.tensor.name!r} released twice")
        # A refused release (a read-only tensor released dirty) leaves the acquire in place.
        self.tensor.release(dirty=self.dirty if dirty is None else dirty, stream=stream)
        self.released = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self.released:
            self.release()


class Tensor:
    """A tensor registered with a Runtime."""

    def __init__(self, runtime, handle, name, nbytes, dtype, kind, layer, home):
        self.runtime = runtime
        self.handle = handle
        self.name = name
        self.nbytes = nbytes
        self.dtype = dtype
        self.kind = kind
        self.layer = layer
        self.home = home
        self.read_only = False

    @property
    def numel(self):
        return self.nbytes // _lib.DTYPE_BYTES[self.dtype]

    def _check_values(self, arr, what):
        """A floating-point array of another dtype than the tensor's would be copied as raw bytes,
        its values reinterpreted (float64 [1.0, 2.0] into f32 reads back [0, 1.875, 0, 2]):
        refused. Integer and byte arrays are raw bytes by intent (bf16 travels as int16)."""
        expected = np.dtype(NUMPY_DTYPES[self.dtype])
        if arr.dtype.kind in "fc" and arr.dtype != expected:
            raise StrataError(_lib.E_INVALID, f"{what} {arr.dtype} values for tensor "
                                              f"{self.name!r} of {expected}: convert them "
                                              f"(astype({expected.name})), or pass raw bytes "
                                              "(.view(np.uint8))")

    def write(self, src, offset=0):
        """Copies a host buffer (numpy array, bytes) into the tensor at byte offset. A
        floating-point array must have the tensor's dtype (STRATA_E_INVALID otherwise)."""
        keep, address, nbytes = _buffer_address(src, None)
        self._check_values(keep, "writing")
        self.runtime._copy_interruptibly("strata_tensor_write_timeout", self.handle, address,
                                         offset, nbytes)
        del keep

    def read(self, out=None, offset=0, nbytes=None):
        """Copies the tensor (or [offset, offset + nbytes)) into out or a new numpy array of the
        tensor's dtype; a range that is not whole elements needs out (a uint8 array for raw
        bytes): STRATA_E_INVALID rather than fewer bytes than asked."""
        if out is None:
            count = (self.nbytes - offset) if nbytes is None else nbytes
            itemsize = np.dtype(NUMPY_DTYPES[self.dtype]).itemsize
            if count % itemsize != 0:
                raise StrataError(_lib.E_INVALID, f"reading {count} bytes of tensor {self.name!r}: "
                                                  f"not whole {itemsize}-byte elements; pass out= "
                                                  "(np.empty(n, np.uint8) for raw bytes)")
            out = np.empty(count // itemsize, dtype=NUMPY_DTYPES[self.dtype])
        keep, address, size = _buffer_address(out, None)
        self._check_values(keep, "reading into")
        self.runtime._copy_interruptibly("strata_tensor_read_timeout", self.handle, address,
                                         offset, size)
        return out

    def acquire(self, tier="device", discard=False, dirty=False):
        tier = _enum(TIERS, tier, "tier")
        out = _lib.Acquired()
        out.struct_size = ctypes.sizeof(_lib.Acquired)
        flags = _lib.ACQUIRE_DISCARD if discard else 0
        self.runtime._acquire_interruptibly(self.handle, tier, flags, out)
        return Acquisition(self, tier, out.data, out.bytes, out.ready_event, dirty)

    def release(self, dirty=False, stream=None):
        self.runtime._call("strata_release", self.handle, _lib.RELEASE_DIRTY if dirty else 0,
                           stream)

    def prefetch(self, tier="device"):
        self.runtime._call("strata_prefetch", self.handle, _enum(TIERS, tier, "tier"))

    def discard(self):
        self.runtime._call("strata_tensor_discard", self.handle)

    def unregister(self):
        self.runtime._call("strata_tensor_unregister", self.handle)

    def __repr__(self):
        return f"strata.Tensor({self.name!r}, {self.nbytes} bytes, handle={self.handle:#x})"


# Every open Runtime, so that its swap file goes away however the interpreter ends: a script that
# dies of an exception before close(), plain interpreter exit, SIGINT or SIGTERM. (A collected
# Runtime closes itself in __del__; these cover the cases where __del__ never runs.)
_LIVE = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()
# An acquire, a tensor's write or read and a sync wait at most WAIT_TIMEOUT_S in all, as their C
# calls do, in slices of WAIT_SLICE_MS between which Python hears Ctrl-C (Runtime._interruptibly).
WAIT_TIMEOUT_S = 300.0
WAIT_SLICE_MS = 100

_HANDLERS_INSTALLED = False
_PREVIOUS_HANDLERS = {}


def close_all():
    """Closes every open Runtime of this process (removing their swap files)."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for rt in live:
        try:
            rt.close()
        except Exception:  # noqa: BLE001 - best effort at shutdown; nothing to report to
            pass


def _on_signal(signum, frame):
    previous = _PREVIOUS_HANDLERS.get(signum, signal.SIG_DFL)
    if callable(previous):
        # Python's own SIGINT handler raises KeyboardInterrupt, which the script may catch and
        # carry on training: the runtimes stay open, and atexit closes them if it does not.
        # Any other handler is the application's: it decides, atexit covers an exit.
        return previous(signum, frame)
    if previous == signal.SIG_IGN:
        return None
    # SIG_DFL terminates the process without running atexit: close first, then die of the
    # signal as the default would (same exit status for the parent).
    close_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return None


def _install_cleanup():
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    _HANDLERS_INSTALLED = True
    atexit.register(close_all)
    if threading.current_thread() is not threading.main_thread():
        return  # signal.signal works only there; atexit and __del__ still apply
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            previous = signal.getsignal(signum)
            if previous is None:  # installed from C: cannot be chained from Python
                continue
            _PREVIOUS_HANDLERS[signum] = previous
            signal.signal(signum, _on_signal)
        except (ValueError, OSError):
            pass


class Runtime:
    """strata_runtime: Runtime(nvme_path="/mnt/nvme", pinned_budget_bytes=1 << 30, ...).

    Accepts a Config, keyword overrides of its fields, or both. Close it (or use `with`) to
    remove the swap file; a collected Runtime closes itself.
    """

    def __init__(self, config=None, **overrides):
        if config is None:
            config = Config()
        if overrides:
            config = config.copy(**overrides)
        self.config = config
        self._ptr = None
        self._lock = threading.Lock()
        struct, keep = config.to_struct()
        ptr = ctypes.c_void_p()
        rc = _lib.strata_runtime_create(ctypes.byref(struct), ctypes.byref(ptr))
        del keep
        check(rc, None, "strata_runtime_create")
        self._ptr = ptr.value
        _install_cleanup()
        with _LIVE_LOCK:
            _LIVE.add(self)

    # The device tier is host memory on the emulated device only.
    @property
    def device_is_host(self):
        return self.config.device_backend in ("emulated", "cpu")

    @property
    def closed(self):
        return self._ptr is None

    def _handle(self):
        if self._ptr is None:
            raise StrataError(_lib.E_BAD_HANDLE, "the runtime is closed")
        return self._ptr

    def _call(self, name, *args):
        ptr = self._handle()
        check(getattr(_lib, name)(ptr, *args), ptr, name)

    def _interruptibly(self, name, call):
        """A C call's wait (at most WAIT_TIMEOUT_S), in slices of WAIT_SLICE_MS: `call(ms)` runs
        the _timeout form of the call `name` with a bound of ms.

        Python runs its signal handlers only between C calls: one 300 s wait (for a release
        only this thread could make, say) would leave Ctrl-C unheard for its whole length.
        Between slices a pending SIGINT raises KeyboardInterrupt here; a slice that timed out
        did nothing (acquired, copied nothing; a sync's write-backs go on)."""
        ptr = self._handle()
        deadline = time.monotonic() + WAIT_TIMEOUT_S
        while True:
            # Rounded up: the slices add up to at least the bound, never a millisecond short.
            left_ms = max(0, math.ceil((deadline - time.monotonic()) * 1000))
            rc = call(min(WAIT_SLICE_MS, left_ms))
            if rc != _lib.E_TIMEOUT:
                check(rc, ptr, name)
                return
            if left_ms <= WAIT_SLICE_MS:
                text = _lib.strata_last_error(ptr)
                message = text.decode("utf-8", "replace") if text else name
                raise StrataError(rc, re.sub(r"did not finish in \d+ ms$",
                                             f"did not finish in {WAIT_TIMEOUT_S:g} s",
                                             message))

    def _acquire_interruptibly(self, handle, tier, flags, out):
        ptr = self._handle()
        self._interruptibly("strata_acquire_timeout", lambda ms: _lib.strata_acquire_timeout(
            ptr, handle, tier, flags, ms, ctypes.byref(out)))

    def _copy_interruptibly(self, name, handle, address, offset, nbytes):
        ptr = self._handle()
        function = getattr(_lib, name)
        self._interruptibly(name, lambda ms: function(ptr, handle, address, offset, nbytes, ms))

    def close(self):
        if self._ptr is None:
            return
        ptr, self._ptr = self._ptr, None
        with _LIVE_LOCK:
            _LIVE.discard(self)
        check(_lib.strata_runtime_destroy(ptr), None, "strata_runtime_destroy")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def last_error(self):
        text = _lib.strata_last_error(self._handle())
        return text.decode("utf-8", "replace") if text else ""

    # -- tensors --------------------------------------------------------------------------------
    def register(self, name, nbytes, dtype="f32", kind="parameter", layer=-1, home="nvme",
                 read_only=False):
        """read_only: STRATA_TENSOR_READ_ONLY, a frozen weight: loaded with write(), never
        acquired with discard, released dirty or given to the optimizer (StrataError
        E_INVALID), so never written back."""
        desc = _lib.TensorDesc()
        desc.struct_size = ctypes.sizeof(_lib.TensorDesc)
        encoded = name.encode()
        desc.name = encoded
        desc.bytes = int(nbytes)
        desc.dtype = _enum(DTYPES, dtype, "dtype")
        desc.kind = _enum(KINDS, kind, "kind")
        desc.layer = int(layer)
        desc.home_tier = _enum(TIERS, home, "home tier")
        desc.flags = _lib.TENSOR_READ_ONLY if read_only else 0
        out = _lib.strata_tensor()
        self._call("strata_tensor_register", ctypes.byref(desc), ctypes.byref(out))
        tensor = Tensor(self, out.value, name, int(nbytes), desc.dtype, desc.kind, desc.layer,
                        desc.home_tier)
        tensor.read_only = bool(read_only)
        return tensor

    def malloc(self, nbytes, tier="device", offloadable=False):
        out = _lib.strata_tensor()
        self._call("strata_malloc", int(nbytes), _enum(TIERS, tier, "tier"),
                   _lib.MALLOC_OFFLOADABLE if offloadable else 0, ctypes.byref(out))
        return Tensor(self, out.value, "malloc", int(nbytes), _lib.DTYPE_U8, _lib.KIND_OTHER,
                      -1, _enum(TIERS, tier, "tier"))

    def free(self, allocation):
        self._call("strata_free", allocation.handle)

    # -- the training loop ----------------------------------------------------------------------
    def step_begin(self):
        self._call("strata_step_begin")

    def step_end(self):
        self._call("strata_step_end")

    def layer_begin(self, phase, layer):
        self._call("strata_layer_begin", _enum(PHASES, phase, "phase"), int(layer))

    def layer_end(self, phase, layer):
        self._call("strata_layer_end", _enum(PHASES, phase, "phase"), int(layer))

    def declare_schedule(self, entries):
        """entries: (phase, layer, Tensor, tier) tuples, in order."""
        array = (_lib.ScheduleEntry * len(entries))()
        for i, (phase, layer, tensor, tier) in enumerate(entries):
            array[i].phase = _enum(PHASES, phase, "phase")
            array[i].layer = int(layer)
            array[i].tensor = tensor.handle
            array[i].tier = _enum(TIERS, tier, "tier")
        self._call("strata_declare_schedule", array, len(entries))

    def sync(self):
        ptr = self._handle()
        self._interruptibly("strata_sync_timeout", lambda ms: _lib.strata_sync_timeout(ptr, ms))

    def export_trace(self, path):
        self._call("strata_export_trace", str(path).encode())

    def stats(self):
        """strata_get_stats as nested dicts (bytes; the *_busy_us fields in microseconds)."""
        s = _lib.StatsStruct()
        s.struct_size = ctypes.sizeof(_lib.StatsStruct)
        self._call("strata_get_stats", ctypes.byref(s))
        out = {}
        for name, _ in _lib.StatsStruct._fields_:
            if name == "struct_size":
                continue
            value = getattr(s, name)
            if isinstance(value, _lib.TierStats):
                value = {
                    "reserved_bytes": value.reserved_bytes,
                    "in_use_bytes": value.in_use_bytes,
                    "peak_reserved_bytes": value.peak_reserved_bytes,
                    "peak_in_use_bytes": value.peak_in_use_bytes,
                    "kinds": {k: value.kinds[i].in_use_bytes for k, i in KINDS.items()},
                    "peak_kinds": {k: value.kinds[i].peak_in_use_bytes for k, i in KINDS.items()},
                }
            elif name.endswith("_by_kind"):
                value = {k: value[i] for k, i in KINDS.items()}
            out[name] = value
        return out

    # -- the optimizer (strata_optimizer_*) -----------------------------------------------------
    def optimizer_add_group(self, lr, betas, eps, weight_decay, decoupled=True):
        g = _group(lr, betas, eps, weight_decay, decoupled)
        index = ctypes.c_uint32()
        self._call("strata_optimizer_add_group", ctypes.byref(g), ctypes.byref(index))
        return index.value

    def optimizer_set_group(self, index, lr, betas, eps, weight_decay, decoupled=True):
        g = _group(lr, betas, eps, weight_decay, decoupled)
        self._call("strata_optimizer_set_group", int(index), ctypes.byref(g))

    def optimizer_get_group(self, index):
        g = _lib.OptimizerGroup()
        g.struct_size = ctypes.sizeof(_lib.OptimizerGroup)
        self._call("strata_optimizer_get_group", int(index), ctypes.byref(g))
        return {"lr": g.lr, "betas": (g.beta1, g.beta2), "eps": g.eps,
                "weight_decay": g.weight_decay, "decoupled": bool(g.decoupled_weight_decay)}

    def optimizer_configure(self, max_grad_norm=0.0, check_overflow=True, overlap_backward=False,
                            sub_group_bytes=0):
        o = _lib.OptimizerOptions()
        o.struct_size = ctypes.sizeof(_lib.OptimizerOptions)
        check(_lib.strata_optimizer_options_init(ctypes.byref(o)), None,
              "strata_optimizer_options_init")
        o.max_grad_norm = float(max_grad_norm or 0.0)
        o.check_overflow = int(bool(check_overflow))
        o.overlap_backward = int(bool(overlap_backward))
        o.sub_group_bytes = int(sub_group_bytes or 0)
        self._call("strata_optimizer_configure", ctypes.byref(o))

    def optimizer_get_options(self):
        """The options in force (strata_optimizer_get_options), as optimizer_configure takes them."""
        o = _lib.OptimizerOptions()
        o.struct_size = ctypes.sizeof(_lib.OptimizerOptions)
        self._call("strata_optimizer_get_options", ctypes.byref(o))
        return {"max_grad_norm": o.max_grad_norm, "check_overflow": bool(o.check_overflow),
                "overlap_backward": bool(o.overlap_backward),
                "sub_group_bytes": int(o.sub_group_bytes)}

    def optimizer_add_param(self, group, param, grad):
        self._call("strata_optimizer_add_param", int(group), param.handle, grad.handle)

    def optimizer_grad_ready(self, param):
        self._call("strata_optimizer_grad_ready", param.handle)

    def optimizer_step(self, loss_scale=1.0):
        r = _lib.OptimizerResult()
        r.struct_size = ctypes.sizeof(_lib.OptimizerResult)
        self._call("strata_optimizer_step", float(loss_scale), ctypes.byref(r))
        return {"found_nonfinite": bool(r.found_nonfinite), "grad_norm": r.grad_norm,
                "step": r.step, "read_wait_seconds": r.read_wait_seconds,
                "update_seconds": r.update_seconds, "write_wait_seconds": r.write_wait_seconds}

    def optimizer_get_step(self):
        step = ctypes.c_int64()
        self._call("strata_optimizer_get_step", ctypes.byref(step))
        return step.value

    def optimizer_set_step(self, step):
        self._call("strata_optimizer_set_step", int(step))

    def optimizer_read_state(self, param, state, out):
        keep, address, nbytes = _buffer_address(out, None)
        self._call("strata_optimizer_read_state", param.handle, int(state), address, nbytes)
        return out

    def optimizer_write_state(self, param, state, src):
        keep, address, nbytes = _buffer_address(src, None)
        self._call("strata_optimizer_write_state", param.handle, int(state), address, nbytes)

    def optimizer_export(self, path):
        self._call("strata_optimizer_export", str(path).encode())

    def optimizer_import(self, path):
        self._call("strata_optimizer_import", str(path).encode())


def _group(lr, betas, eps, weight_decay, decoupled):
    g = _lib.OptimizerGroup()
    g.struct_size = ctypes.sizeof(_lib.OptimizerGroup)
    check(_lib.strata_optimizer_group_init(ctypes.byref(g)), None, "strata_optimizer_group_init")
    g.lr = float(lr)
    g.beta1, g.beta2 = (float(b) for b in betas)
    g.eps = float(eps)
    g.weight_decay = float(weight_decay)
    g.decoupled_weight_decay = int(bool(decoupled))
    return g
