"""strata.torch.offload: a torch.nn.Module whose parameters live in Strata.

Every parameter becomes a Strata tensor (kind PARAMETER, home NVMe by default) and, if it needs
a gradient, a second one (kind GRADIENT). Between uses a parameter's .data is an empty tensor on
the compute device, so a layer not in use holds no memory outside Strata's budgets.

The units are the modules that own parameters directly (a Linear, an RMSNorm, an Embedding). For
each unit:
  - forward pre-hook: strata_layer_begin(FORWARD, unit), acquire its parameters on the device tier
    and point each parameter's .data at the acquired memory, zero-copy;
  - forward post-hook: release them and wrap the unit's outputs in an autograd function whose
    backward runs first in the unit's backward: strata_layer_begin(BACKWARD, unit) and acquire
    the parameters again;
  - when a parameter's gradient has been accumulated (a post-hook on its AccumulateGrad node,
    which torch runs once every use of the parameter in the graph has done its backward), the
    gradient is copied into Strata (added, when accumulating over micro-batches), param.grad is
    dropped and the parameter released: gradients leave the device as each layer finishes.
  - anything still held when backward ends is released by a callback queued on the engine.

Tensors that autograd saves for backward and that alias a parameter's memory (the parameter
itself, or a view such as the `weight.t()` inside F.linear) would otherwise dangle once the
parameter is released; a saved-tensors hook, active during the model's forward, stores them as
(parameter, offset, sizes, strides) and rebuilds the view from the re-acquired memory in
backward, fetching the parameter on demand if needed.

Each call of the model's forward is one Strata step (strata_step_begin); strata.torch.AdamW.step
runs the OPTIMIZER phase and ends the step.
"""
import functools
import threading
import weakref

import torch

from .. import _lib
from ..config import Config
from ..deepspeed import from_deepspeed
from ..errors import StrataError
from ..runtime import Runtime
from . import _views

_FORWARD, _BACKWARD, _OPTIMIZER = "forward", "backward", "optimizer"


class _Param:
    """One parameter under Strata."""

    __slots__ = ("name", "param", "shape", "dtype", "tensor", "grad", "units", "pins",
                 "acquisition", "bwd_held", "grad_written", "grad_node", "hooks", "owner",
                 "__weakref__")

    def __init__(self, name, param):
        self.name = name
        self.param = param
        self.shape = tuple(param.shape)
        self.dtype = param.dtype
        self.tensor = None  # strata.Tensor, kind PARAMETER
        self.grad = None  # strata.Tensor, kind GRADIENT (None for frozen parameters)
        self.units = []
        self.pins = 0
        self.acquisition = None
        self.bwd_held = False
        self.grad_written = False  # the GRADIENT tensor holds this step's gradient
        self.grad_node = None
        self.hooks = []
        self.owner = None

    @property
    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n


class _Unit:
    __slots__ = ("index", "name", "module", "params", "hooks")

    def __init__(self, index, name, module):
        self.index = index
        self.name = name
        self.module = module
        self.params = []
        self.hooks = []


class _SavedParameterView:
    """What the saved-tensors hook keeps instead of memory that belongs to a parameter."""

    __slots__ = ("record", "offset", "size", "stride", "dtype")

    def __init__(self, record, offset, size, stride, dtype):
        self.record = record
        self.offset = offset
        self.size = size
        self.stride = stride
        self.dtype = dtype


class _PreBackward(torch.autograd.Function):
    """Identity on a unit's outputs; its backward is the first thing the unit's backward runs."""

    @staticmethod
    def forward(ctx, owner, unit, *tensors):
        ctx.owner = owner
        ctx.unit = unit
        return tuple(t.detach() for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        ctx.owner._pre_backward(ctx.unit)
        return (None, None) + grads


def _flatten(value, out):
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (tuple, list)):
        for v in value:
            _flatten(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _flatten(v, out)


def _rebuild(value, replacements):
    if isinstance(value, torch.Tensor):
        return replacements.get(id(value), value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(_rebuild(v, replacements) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_rebuild(v, replacements) for v in value)
    if isinstance(value, dict):
        out = value.__class__.__new__(value.__class__)
        if hasattr(value, "__dict__"):
            out.__dict__.update(value.__dict__)
        dict.__init__(out, {k: _rebuild(v, replacements) for k, v in value.items()})
        return out
    return value


def _default_device():
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _distributed():
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def build_config(nvme_path=None, device=None, config=None, deepspeed_config=None, **fields):
    """The strata.Config for a compute device; returns (config, mapped DeepSpeed or None)."""
    rank, _ = _distributed()
    mapped = None
    if deepspeed_config is not None:
        mapped = from_deepspeed(deepspeed_config)
        base = mapped.config
    elif isinstance(config, Config):
        base = config.copy()
    elif config is None:
        base = Config()
    else:
        raise StrataError(_lib.E_INVALID, "config must be a strata.Config (DeepSpeed-style dicts "
                                          "go in deepspeed_config=)")
    for key, value in fields.items():
        setattr(base, key, value)
    if nvme_path is not None:
        base.nvme_path = str(nvme_path)
    if base.nvme_path is None and base.raw_device is None:
        raise StrataError(_lib.E_INVALID, "nvme_path is required: a directory on the NVMe drive "
                                          "for Strata's swap file")
    if base.nvme_path is not None and "{rank}" in base.nvme_path:
        base.nvme_path = base.nvme_path.format(rank=rank)
    device = torch.device(device) if device is not None else _default_device()
    if device.type == "cuda":
        base.device_backend = "cuda"
        base.device_ordinal = device.index if device.index is not None else \
            torch.cuda.current_device()
        device = torch.device("cuda", base.device_ordinal)
    elif device.type == "cpu":
        base.device_backend = "emulated"
    else:
        raise StrataError(_lib.E_UNSUPPORTED, f"device {device}: Strata serves 'cuda' or 'cpu'")
    return base, mapped, device


class OffloadedModel:
    """The handle offload() returns: the runtime, the hooks, and what they track."""

    def __init__(self, module, runtime, device, param_home="nvme", grad_home="nvme",
                 average_gradients=None, process_group=None, mapped=None):
        self.module = module
        self.runtime = runtime
        self.device = device
        self.param_home = param_home
        self.grad_home = grad_home
        self.deepspeed = mapped
        self.optimizer = None  # the strata.torch.AdamW over these parameters, once created
        rank, world = _distributed()
        self.rank, self.world_size = rank, world
        self.average_gradients = (world > 1) if average_gradients is None else average_gradients
        self.process_group = process_group
        self._lock = threading.RLock()
        self._open_phase = None
        self._step_open = False
        self._in_backward = False
        self._fetched = {}  # storage address -> _Param
        self.params = []  # _Param, in registration order
        self.units = []
        self._placeholders = {}
        self._closed = False
        self._original_forward = None
        try:
            self._register(module)
        except BaseException:
            self.close(restore=True)
            raise

    # -- set-up ---------------------------------------------------------------------------------
    def _placeholder(self, dtype):
        if dtype not in self._placeholders:
            self._placeholders[dtype] = torch.empty(0, dtype=dtype, device=self.device)
        return self._placeholders[dtype]

    def _register(self, module):
        by_id = {}
        names = {id(p): n for n, p in module.named_parameters()}
        for module_name, sub in module.named_modules():
            direct = [p for p in sub._parameters.values() if p is not None]
            if not direct:
                continue
            unit = _Unit(len(self.units), module_name or "<root>", sub)
            self.units.append(unit)
            for p in direct:
                if p.dtype not in _views.TORCH_TO_STRATA:
                    raise StrataError(_lib.E_UNSUPPORTED,
                                      f"parameter {names.get(id(p))!r} has dtype {p.dtype}; "
                                      "Strata holds float32, bfloat16, float16, int8, uint8")
                if getattr(p, "_strata", None) is not None and id(p) not in by_id:
                    raise StrataError(_lib.E_STATE, f"parameter {names.get(id(p))!r} is already "
                                                    "offloaded by another strata.torch.offload")
                rec = by_id.get(id(p))
                if rec is None:
                    rec = _Param(names.get(id(p), f"{module_name}.?"), p)
                    by_id[id(p)] = rec
                    self._register_param(rec, unit.index)
                    self.params.append(rec)
                rec.units.append(unit)
                unit.params.append(rec)
        # Buffers (rotary tables, norms' running stats) stay torch's, on the compute device.
        for sub in module.modules():
            for key, buf in list(sub._buffers.items()):
                if buf is not None and buf.device != self.device:
                    sub._buffers[key] = buf.to(self.device)
        for unit in self.units:
            unit.hooks.append(unit.module.register_forward_pre_hook(
                functools.partial(_pre_forward_hook, weakref.ref(self), unit)))
            unit.hooks.append(unit.module.register_forward_hook(
                functools.partial(_post_forward_hook, weakref.ref(self), unit)))
        self._original_forward = module.forward
        owner = weakref.ref(self)
        original = module.forward

        @functools.wraps(original)
        def forward(*args, **kwargs):
            me = owner()
            if me is None or me._closed:
                return original(*args, **kwargs)
            me._begin_forward()
            with torch.autograd.graph.saved_tensors_hooks(me._pack, me._unpack):
                return original(*args, **kwargs)

        module.forward = forward
        module._strata_offload = self

    def _register_param(self, rec, layer):
        rt = self.runtime
        p = rec.param
        dtype = _views.TORCH_TO_STRATA[p.dtype]
        nbytes = p.numel() * p.element_size()
        if nbytes == 0:
            raise StrataError(_lib.E_INVALID, f"parameter {rec.name!r} is empty")
        rec.tensor = rt.register(rec.name, nbytes, dtype, "parameter", layer, self.param_home)
        rec.tensor.write(_views.host_numpy(p))
        if p.requires_grad:
            rec.grad = rt.register(rec.name + ".grad", nbytes, dtype, "gradient", layer,
                                   self.grad_home)
            # The AccumulateGrad node of p; a strong reference keeps the same node (and hook)
            # for every backward.
            rec.grad_node = p.expand_as(p).grad_fn.next_functions[0][0]
            owner = weakref.ref(self)
            rec.hooks.append(rec.grad_node.register_hook(
                functools.partial(_grad_accumulated_hook, owner, weakref.ref(rec))))
            rec.hooks.append(p.register_hook(
                functools.partial(_grad_computed_hook, owner, weakref.ref(rec))))
        rec.owner = weakref.ref(self)
        p._strata = rec
        p.data = self._placeholder(p.dtype)

    # -- residency ------------------------------------------------------------------------------
    def _pin(self, rec):
        with self._lock:
            rec.pins += 1
            if rec.pins > 1:
                return
            try:
                acq = rec.tensor.acquire("device")
                data = _views.as_tensor(acq, rec.dtype, rec.shape, self.device)
            except BaseException:
                rec.pins -= 1
                raise
            rec.acquisition = acq
            self._fetched[_views.storage_address(data)] = rec
            rec.param.data = data

    def _unpin(self, rec):
        with self._lock:
            if rec.pins == 0:
                raise StrataError(_lib.E_INTERNAL, f"parameter {rec.name!r} unpinned too often")
            rec.pins -= 1
            if rec.pins:
                return
            acq, rec.acquisition = rec.acquisition, None
            self._fetched.pop(_views.storage_address(rec.param.data), None)
            rec.param.data = self._placeholder(rec.dtype)
            acq.release(dirty=False, stream=_views.stream_pointer(self.device))

    def _enter_phase(self, phase, layer):
        with self._lock:
            if self._open_phase == (phase, layer):
                return
            self._close_phase()
            self.runtime.layer_begin(phase, layer)
            self._open_phase = (phase, layer)

    def _close_phase(self):
        with self._lock:
            if self._open_phase is not None:
                phase, layer = self._open_phase
                self._open_phase = None
                self.runtime.layer_end(phase, layer)

    def _begin_forward(self):
        with self._lock:
            self._check_open()
            self._close_phase()
            if self._step_open:
                self._step_open = False
                self.runtime.step_end()
            self.runtime.step_begin()
            self._step_open = True

    def _end_step(self):
        with self._lock:
            self._close_phase()
            if self._step_open:
                self._step_open = False
                self.runtime.step_end()

    def _check_open(self):
        if self._closed:
            raise StrataError(_lib.E_STATE, "this strata.torch.offload was closed")

    # -- hooks ----------------------------------------------------------------------------------
    def _pre_forward(self, unit):
        self._check_open()
        self._enter_phase(_FORWARD, unit.index)
        for rec in unit.params:
            self._pin(rec)

    def _post_forward(self, unit, output):
        for rec in unit.params:
            self._unpin(rec)
        with self._lock:
            if self._open_phase == (_FORWARD, unit.index):
                self._close_phase()
        if not torch.is_grad_enabled():
            return output
        tensors = []
        _flatten(output, tensors)
        tensors = [t for t in tensors if t.requires_grad]
        if not tensors:
            return output
        wrapped = _PreBackward.apply(self, unit, *tensors)
        return _rebuild(output, {id(t): w for t, w in zip(tensors, wrapped)})

    def _pre_backward(self, unit):
        with self._lock:
            if not self._in_backward:
                self._in_backward = True
                torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
            self._enter_phase(_BACKWARD, unit.index)
            for rec in unit.params:
                self._hold_for_backward(rec)

    def _hold_for_backward(self, rec):
        with self._lock:
            if not rec.bwd_held:
                self._pin(rec)
                rec.bwd_held = True

    def _end_backward(self):
        with self._lock:
            self._in_backward = False
            for rec in self.params:
                if rec.bwd_held:
                    rec.bwd_held = False
                    self._unpin(rec)
            self._close_phase()

    def _grad_accumulated(self, rec):
        p = rec.param
        grad = p.grad
        if grad is None:
            return
        if self.average_gradients:
            torch.distributed.all_reduce(grad, group=self.process_group)
            grad.div_(self.world_size)
        with self._lock:
            acq = rec.grad.acquire("device", discard=not rec.grad_written)
            try:
                view = _views.as_tensor(acq, rec.dtype, rec.shape, self.device)
                if rec.grad_written:
                    view.add_(grad)
                else:
                    view.copy_(grad)
            finally:
                acq.release(dirty=True, stream=_views.stream_pointer(self.device))
            rec.grad_written = True
            p.grad = None
            if rec.bwd_held:
                rec.bwd_held = False
                self._unpin(rec)

    # saved tensors that alias a parameter's memory
    def _pack(self, t):
        if not self._fetched or not isinstance(t, torch.Tensor) or t.device != self.device:
            return t
        try:
            address = _views.storage_address(t)
        except (RuntimeError, NotImplementedError):
            return t
        rec = self._fetched.get(address)
        if rec is None:
            return t
        return _SavedParameterView(rec, t.storage_offset(), tuple(t.size()), tuple(t.stride()),
                                   t.dtype)

    def _unpack(self, saved):
        if not isinstance(saved, _SavedParameterView):
            return saved
        rec = saved.record
        if rec.pins == 0:  # the unit's pre-backward did not run (an output it could not wrap)
            self._hold_for_backward(rec)
        base = rec.param.data
        if base.dtype != saved.dtype:
            base = base.view(saved.dtype)
        return base.as_strided(saved.size, saved.stride, saved.offset)

    # -- public ---------------------------------------------------------------------------------
    def named_parameters(self):
        return [(rec.name, rec.param) for rec in self.params]

    def parameter(self, param_or_name):
        """Reads a parameter's current value from Strata into a new CPU tensor."""
        rec = self._record(param_or_name)
        out = torch.empty(rec.shape, dtype=rec.dtype)
        rec.tensor.read(_np_view(out))
        return out

    def gradient(self, param_or_name):
        """This step's gradient of a parameter, as a new CPU tensor (None if there is none)."""
        rec = self._record(param_or_name)
        if rec.grad is None or not rec.grad_written:
            return None
        out = torch.empty(rec.shape, dtype=rec.dtype)
        rec.grad.read(_np_view(out))
        return out

    def state_dict(self):
        """The module's state_dict with parameter values read from Strata (CPU tensors)."""
        out = {}
        for name, rec in ((rec.name, rec) for rec in self.params):
            out[name] = self.parameter(rec)
        # Persistent buffers, as torch's state_dict has them.
        for name, value in self.module.state_dict().items():
            if name not in out:
                out[name] = value.detach().to("cpu").clone()
        return out

    def load_state_dict(self, state):
        """Writes parameter values into Strata (before creating the optimizer, whose fp32
        masters start from them)."""
        missing = [rec.name for rec in self.params if rec.name not in state]
        if missing:
            raise StrataError(_lib.E_INVALID, f"state_dict lacks {missing}")
        for rec in self.params:
            value = state[rec.name]
            if tuple(value.shape) != rec.shape:
                raise StrataError(_lib.E_INVALID, f"{rec.name}: shape {tuple(value.shape)} is "
                                                  f"not {rec.shape}")
            rec.tensor.write(_views.host_numpy(value.to(rec.dtype)))
        for name, buf in self.module.named_buffers():
            if name in state:
                buf.copy_(state[name])

    def zero_grad(self):
        """Forgets this step's gradients (strata_tensor_discard)."""
        for rec in self.params:
            if rec.grad is not None and rec.grad_written:
                rec.grad.discard()
                rec.grad_written = False

    def stats(self):
        return self.runtime.stats()

    def _record(self, param_or_name):
        for rec in self.params:
            if rec.param is param_or_name or rec.name == param_or_name or rec is param_or_name:
                return rec
        raise StrataError(_lib.E_INVALID, f"{param_or_name!r} is not offloaded here")

    def close(self, restore=True):
        """Removes the hooks; with restore, parameters get their values back as ordinary CPU
        (or device) tensors; then the runtime is destroyed and its swap file removed."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.optimizer is not None:
                self.optimizer._detach()
            for unit in self.units:
                for h in unit.hooks:
                    h.remove()
            if self._original_forward is not None:
                self.module.__dict__.pop("forward", None)
            self.module.__dict__.pop("_strata_offload", None)
            for rec in self.params:
                for h in rec.hooks:
                    h.remove()
                if restore and rec.tensor is not None and not self.runtime.closed:
                    while rec.pins:
                        self._unpin(rec)
                    value = torch.empty(rec.shape, dtype=rec.dtype)
                    try:
                        rec.tensor.read(_np_view(value))
                    except StrataError:
                        pass
                    rec.param.data = value.to(self.device)
                rec.param._strata = None
        finally:
            self.runtime.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _np_view(t):
    """A numpy array sharing t's (contiguous CPU) memory; bfloat16 as int16."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().reshape(-1)
    return t.numpy().reshape(-1)


def _pre_forward_hook(owner_ref, unit, module, inputs):
    owner = owner_ref()
    if owner is not None and not owner._closed:
        owner._pre_forward(unit)


def _post_forward_hook(owner_ref, unit, module, inputs, output):
    owner = owner_ref()
    if owner is None or owner._closed:
        return None
    return owner._post_forward(unit, output)


def _grad_computed_hook(owner_ref, rec_ref, grad):
    # Runs before AccumulateGrad: it lays the gradient out like the parameter's .data, which must
    # therefore be the real memory, not the placeholder.
    owner, rec = owner_ref(), rec_ref()
    if owner is not None and rec is not None and not owner._closed and rec.pins == 0:
        owner._hold_for_backward(rec)
    return None


def _grad_accumulated_hook(owner_ref, rec_ref, *unused):
    owner, rec = owner_ref(), rec_ref()
    if owner is not None and rec is not None and not owner._closed:
        owner._grad_accumulated(rec)


def offload(model, nvme_path=None, *, device=None, config=None, deepspeed_config=None,
            param_home=None, grad_home="nvme", average_gradients=None, process_group=None,
            **config_fields):
    """Puts model's parameters under a new Strata runtime and hooks its forward and backward.

    nvme_path: the directory for the swap file ("{rank}" is replaced by the torch.distributed
    rank). device: the compute device (default: the current CUDA device, else the CPU, where
    Strata's host-emulated device stands in for a GPU). config: a strata.Config;
    deepspeed_config: a DeepSpeed-style dict (strata.deepspeed.from_deepspeed); config_fields:
    strata.Config fields. param_home: where parameters rest, "nvme" (default), "pinned" or
    "device" (DeepSpeed's offload_param.device nvme / cpu / none). average_gradients: all-reduce
    gradients over process_group (default: when torch.distributed runs with several ranks).
    Returns an OffloadedModel; the model itself is used as before.
    """
    cfg, mapped, device = build_config(nvme_path, device, config, deepspeed_config,
                                       **config_fields)
    if param_home is None:
        param_home = mapped.param_home if mapped is not None else "nvme"
    if mapped is not None and mapped.param_dtype is not None:
        wrong = {p.dtype for p in model.parameters() if p.dtype != getattr(torch,
                                                                          mapped.param_dtype)}
        if wrong:
            raise StrataError(_lib.E_INVALID, f"the DeepSpeed config enables {mapped.param_dtype} "
                                              f"but the model has {sorted(map(str, wrong))} "
                                              "parameters: convert the model first")
    runtime = Runtime(cfg)
    try:
        return OffloadedModel(model, runtime, device, param_home, grad_home, average_gradients,
                              process_group, mapped)
    except BaseException:
        runtime.close()
        raise
