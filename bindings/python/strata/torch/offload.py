"""strata.torch.offload: a torch.nn.Module whose parameters live in Strata.

Every parameter becomes a Strata tensor (kind PARAMETER, home NVMe by default) and, if it needs
a gradient, a second one (kind GRADIENT). Between uses a parameter's .data is a placeholder of its
shape and dtype over one element on the compute device, so a layer not in use holds no memory
outside Strata's budgets and shape-based code (p.dim(), p.shape, numel()) still works.

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
import collections
import functools
import inspect
import io
import pickle
import threading
import warnings
import weakref

import torch

from .. import _lib
from ..config import Config
from ..deepspeed import from_deepspeed
from ..errors import StrataError
from ..runtime import Runtime
from . import _placeholder_parameter
from . import _views
from . import activations as _activations
from . import nf4 as _nf4

_FORWARD, _BACKWARD, _OPTIMIZER = "forward", "backward", "optimizer"
# A backward over parameters changed since its forward: torch's words for it, and the way out.
_MODIFIED = "one of the variables needed for gradient computation has been modified"
_AS_TORCH = "torch raises here too (its version counter). Run the forward again after the update"


class _Param:
    """One parameter under Strata."""

    __slots__ = ("name", "param", "shape", "dtype", "tensor", "grad", "units", "pins",
                 "acquisition", "bwd_held", "grad_written", "grad_zero", "grad_consumed",
                 "grad_stale", "placeholder", "sentinel", "codec", "decoded",
                 "hooks", "owner", "names", "version", "generation", "base",
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
        # zero_grad(set_to_none=False) ran and no backward since: the gradient is zero (torch's
        # p.grad of zeros), written into Strata only if the optimizer steps on it.
        self.grad_zero = False
        # optimizer.step() consumed (and Strata discarded) the gradient and no zero_grad ran
        # since: torch would add the next backward to the old p.grad, Strata cannot.
        self.grad_consumed = False
        self.grad_stale = False  # a backward came after grad_consumed, before any zero_grad
        self.names = [name]  # every name of the parameter in the module (tied weights: several)
        self.hooks = []
        self.owner = None
        self.placeholder = None  # p.data between uses: the full shape over one element
        self.sentinel = None  # that one element (NaN for floating point)
        # "nf4": the tensor holds the packed NF4 form of a frozen weight (nf4.py); decoded is
        # the dequantized torch tensor while the parameter is in use.
        self.codec = None
        self.decoded = None
        # p._version when the parameter was acquired: a forward that changes it in place
        # (nn.Embedding(max_norm=...) renormalises the rows it looks up) changed the weight.
        self.version = None
        # Counts the parameter's new values from outside a forward (optimizer steps, loads): a
        # graph that saved it at another count would compute its gradients from the new value,
        # where torch's backward raises (its version counter); _unpack raises the same. (A change
        # in place inside a forward is not counted: that forward's own graph may have saved the
        # changed value, as torch's would.)
        self.generation = 0
        # A weak reference to the object torch's storage of p.data keeps alive while any view of
        # the acquired memory lives (_views.view's bases): a view that outlives the release.
        self.base = None

    @property
    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n


class _Unit:
    """A module that owns parameters directly, and its parameters."""

    __slots__ = ("index", "name", "module_ref", "params", "hooks")

    def __init__(self, index, name, module):
        self.index = index
        self.name = name
        # Weak: parameter -> record -> unit -> module -> OffloadedModel -> AccumulateGrad node
        # -> parameter would be a cycle through torch's C++ objects, which the garbage
        # collector cannot see; the model (and the runtime, and its swap file) would never go.
        self.module_ref = weakref.ref(module)
        self.params = []
        self.hooks = []

    @property
    def module(self):
        return self.module_ref()


class _SavedParameterView:
    """What the saved-tensors hook keeps instead of memory that belongs to a parameter."""

    __slots__ = ("record", "offset", "size", "stride", "dtype", "generation")

    def __init__(self, record, offset, size, stride, dtype):
        self.record = record
        self.offset = offset
        self.size = size
        self.stride = stride
        self.dtype = dtype
        self.generation = record.generation  # the value saved: see _Param.generation


def _output_head_weights(module):
    """The weights of the model's output head, which QLoRA keeps in their dtype (transformers
    keeps the output embeddings out of 4-bit, get_keys_to_not_convert): get_output_embeddings()
    where the model has one (Hugging Face models), else every nn.Linear weight of an
    nn.Embedding's shape (vocabulary x hidden: the head, tied or not), the last such in the
    model's order (a projection inside the layers may have that shape too: hidden x 4 hidden
    with a vocabulary of 4 hidden)."""
    get = getattr(module, "get_output_embeddings", None)
    if callable(get):
        head = get()
        if isinstance(head, torch.nn.Linear):
            return {id(head.weight)}
    shapes = {tuple(m.weight.shape) for m in module.modules()
              if isinstance(m, torch.nn.Embedding)}
    heads = [m.weight for m in module.modules()
             if isinstance(m, torch.nn.Linear) and tuple(m.weight.shape) in shapes]
    return {id(heads[-1])} if heads else set()


class _SavedByTorch:
    """A saved tensor the hook leaves with torch: detached, and its version when saved. The
    tensor itself would tie the graph in a cycle when it is an operation's own output (its
    grad_fn holds the saved tensor, which would hold its grad_fn: torch keeps only the data for
    that reason), which the garbage collector cannot free: a graph dropped without backward (an
    evaluation forward with grad on, an exception in forward, retain_graph) then stayed, with
    every activation Strata held for it. Autograd restores the grad_fn on unpack."""

    __slots__ = ("tensor", "version")

    def __init__(self, t):
        self.tensor, self.version = t.detach(), t._version


class _UnitBoundary(torch.autograd.Function):
    """Identity on tensors crossing a unit's boundary; its backward calls on_backward(unit).

    On a unit's outputs it is the first thing the unit's backward runs (_pre_backward). On its
    inputs it runs once the unit's backward has computed their gradients, i.e. when the unit no
    longer needs its parameters (_post_backward): a frozen parameter has no gradient whose
    accumulation would say so, and without it a frozen base (LoRA) would stay held until the
    whole backward ended and could not stream in backward."""

    @staticmethod
    def forward(ctx, on_backward, unit, *tensors):
        ctx.on_backward = on_backward
        ctx.unit = unit
        return tuple(t.detach() for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        ctx.on_backward(ctx.unit)
        return (None, None) + grads


def _through_boundary(value, on_backward, unit):
    """value with its tensors that require grad passed through _UnitBoundary (None: none do)."""
    tensors = []
    _flatten(value, tensors)
    tensors = [t for t in tensors if t.requires_grad]
    if not tensors:
        return None
    wrapped = _UnitBoundary.apply(on_backward, unit, *tensors)
    return _rebuild(value, {id(t): w for t, w in zip(tensors, wrapped)})


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
                 average_gradients=None, process_group=None, mapped=None, compute_tier=None,
                 param_init_fn=None, budgets=None, quantize_frozen=None, trainable_home=None):
        self.module = module
        self.budgets = budgets  # {field: (bytes, why)} for budgets offload() sized itself
        self.runtime = runtime
        self.device = device
        # Where torch computes on a parameter: Strata's device tier on a GPU; on a CPU its
        # pinned host buffers themselves (no second, emulated-device copy in host RAM).
        if compute_tier is None:
            compute_tier = "device" if device.type == "cuda" else "pinned"
        if compute_tier not in ("device", "pinned"):
            raise StrataError(_lib.E_INVALID, f"compute_tier {compute_tier!r}: 'device' or "
                                              "'pinned'")
        if compute_tier == "pinned" and device.type != "cpu":
            raise StrataError(_lib.E_INVALID, "compute_tier='pinned' needs device='cpu'")
        self.compute_tier = compute_tier
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
        self._in_forward = 0  # depth of calls of the model's forward under way
        # unit index -> forward calls under way that hold its parameters (pre-hook run, post-hook
        # not yet): what a forward that raises leaves held (_abandon_forward).
        self._forward_units = collections.Counter()
        self._root_step_started = False
        self._fetched = {}  # storage address -> _Param
        self._placeholders = {}  # storage address of a placeholder's one element -> _Param
        self._deferred = {}  # id(acquisition) -> weakref.finalize: releases kept for a view
        self._deferred_warned = set()
        self._output_views = set()  # id(_Param) whose output view _own_aliased_outputs copied
        self._held_bytes = 0  # bytes of parameters acquired now on the compute tier
        self._pinned_pool_bytes = None  # the pinned budget less the staging, once asked
        self._grad_nodes = {}  # id(_Param) -> its parameter's AccumulateGrad node
        self.params = []  # _Param, in registration order
        self.units = []
        self._closed = False
        self._original_forward = None
        self._param_init_fn = param_init_fn
        if quantize_frozen not in (None, "nf4"):
            raise StrataError(_lib.E_INVALID, f"quantize_frozen={quantize_frozen!r}: 'nf4' or "
                                              "None")
        self.quantize_frozen = quantize_frozen
        self.trainable_home, self.trainable_why = self._choose_trainable_home(module,
                                                                              trainable_home)
        self.activations = None  # an ActivationOffload once offload_activations() ran
        try:
            # Under inference_mode() (an inference script's set-up) the placeholders would be
            # inference tensors, on which autograd never records: training after it would find
            # no AccumulateGrad node to hook.
            with torch.inference_mode(False):
                self._register(module)
        except BaseException:
            self.close(restore=True)
            raise
        # When the model is collected, so is the runtime's swap file. (torch's AccumulateGrad
        # nodes keep the parameters alive from C++, out of the garbage collector's sight, so
        # the runtime might otherwise wait for interpreter exit.)
        weakref.finalize(module, runtime.close)

    # -- set-up ---------------------------------------------------------------------------------
    def _make_placeholder(self, rec):
        """p.data between uses: a tensor of the parameter's shape and dtype, on the compute
        device, over a single element (every stride 0), so that p.shape, p.dim(), numel(),
        dtype and device are the parameter's while its memory is in Strata. That element is NaN
        (the dtype's largest value for integers). A plain parameter's reads and writes of it are
        refused at the operation (_to_placeholder, PlaceholderParameter); what gets past that,
        a replaced .data or a fill_ on a parameter subclass that keeps its class, is caught at
        the next use (_check_placeholder)."""
        if rec.dtype.is_floating_point:
            fill = float("nan")
        else:
            fill = torch.iinfo(rec.dtype).max
        rec.sentinel = torch.full((1,), fill, dtype=rec.dtype, device=self.device)
        # A 0-dim parameter (a learnable temperature) is the one element itself.
        rec.placeholder = rec.sentinel.expand(rec.shape) if rec.shape else rec.sentinel.view(())
        self._placeholders[_views.storage_address(rec.sentinel)] = rec

    @staticmethod
    def _to_placeholder(rec):
        """Points the parameter at its placeholder; a plain nn.Parameter also becomes a
        PlaceholderParameter, which refuses any read or write of its value by code other than
        Strata's (a subclass of its own keeps its class, and the NaN)."""
        rec.param.data = rec.placeholder
        _placeholder_parameter.mark(rec.param)

    def _check_placeholder(self, rec):
        """Refuses to use a parameter whose placeholder was written or replaced since its last
        use: the write went nowhere (Strata holds the value), so going on would be silent."""
        data = rec.param.data
        replaced = data.data_ptr() != rec.sentinel.data_ptr() or tuple(data.shape) != rec.shape
        written = False
        if not replaced and self.device.type == "cpu":  # a CUDA read would synchronise
            value = rec.sentinel[0].item()
            written = not (value != value) if rec.dtype.is_floating_point else \
                value != torch.iinfo(rec.dtype).max
        if replaced or written:
            raise StrataError(_lib.E_STATE,
                              f"parameter {rec.name!r} was {'replaced' if replaced else 'written'}"
                              " outside its module's forward and backward (its .data there "
                              "is a placeholder; the value is in Strata, so the change went "
                              "nowhere). Change offloaded weights with model.load_state_dict()"
                              ", or before offload; model.to() / .half() need close() first")

    def _materialise(self, module_name, sub, direct, replaced, names):
        """A unit's parameters on the meta device become real CPU parameters, initialised by
        param_init_fn(sub) (default: sub.reset_parameters()), just before they go into Strata:
        a model built on the meta device is never whole in host RAM, one unit at a time is.
        New Parameter objects replace the meta ones in the module (as Module.to_empty does);
        a tied parameter is replaced once, by the same object under each name."""
        fresh = False
        for key, p in direct:
            if not p.is_meta:
                continue
            new = replaced.get(id(p))
            if new is None:
                new = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype),
                                         requires_grad=p.requires_grad)
                replaced[id(p)] = new
                names[id(new)] = names.get(id(p), f"{module_name}.{key}")
                fresh = True
            sub._parameters[key] = new
        if fresh:
            if self._param_init_fn is not None:
                self._param_init_fn(sub)
            elif callable(getattr(sub, "reset_parameters", None)):
                sub.reset_parameters()
            else:
                raise StrataError(_lib.E_INVALID,
                                  f"module {module_name or '<root>'!r} has parameters on the "
                                  f"meta device and no reset_parameters(): pass "
                                  "offload(..., param_init_fn=f), f(module) initialising the "
                                  "module's own parameters in place")
        out = [(k, q) for k, q in sub._parameters.items() if q is not None]
        still = [k for k, q in out if q.is_meta]
        if still:
            raise StrataError(_lib.E_INVALID, f"module {module_name or '<root>'!r}: parameters "
                                              f"{still} are still on the meta device after "
                                              "initialisation")
        return out

    def _register(self, module):
        by_id = {}
        names = {id(p): n for n, p in module.named_parameters()}
        heads = _output_head_weights(module) if self.quantize_frozen else set()
        replaced = {}  # id(meta parameter) -> the CPU parameter that replaces it
        for module_name, sub in module.named_modules():
            direct = [(k, p) for k, p in sub._parameters.items() if p is not None]
            if not direct:
                continue
            if any(p.is_meta for _, p in direct):
                direct = self._materialise(module_name, sub, direct, replaced, names)
            _refuse_sparse_gradients(module_name or "<root>", sub)
            unit = _Unit(len(self.units), module_name or "<root>", sub)
            self.units.append(unit)
            for key, p in direct:
                full_name = f"{module_name}.{key}" if module_name else key
                if p.dtype not in _views.TORCH_TO_STRATA:
                    raise StrataError(_lib.E_UNSUPPORTED,
                                      f"parameter {names.get(id(p))!r} has dtype {p.dtype}; "
                                      "Strata holds float32, bfloat16, float16, int8, uint8")
                if p.is_inference():
                    raise StrataError(_lib.E_UNSUPPORTED,
                                      f"parameter {names.get(id(p))!r} was made under "
                                      "torch.inference_mode(): an inference tensor keeps no "
                                      "version counter, which Strata needs to see a parameter "
                                      "changed in place. Make the model outside "
                                      "inference_mode() (offload() itself may run inside it, "
                                      "and torch.no_grad() infers without making inference "
                                      "tensors)")
                if getattr(p, "_strata", None) is not None and id(p) not in by_id:
                    raise StrataError(_lib.E_STATE, f"parameter {names.get(id(p))!r} is already "
                                                    "offloaded by another strata.torch.offload")
                rec = by_id.get(id(p))
                if rec is None:
                    rec = _Param(names.get(id(p), f"{module_name}.?"), p)
                    by_id[id(p)] = rec
                    # quantize_frozen's linear weights: not the output head's (below).
                    linear_weight = isinstance(sub, torch.nn.Linear) and key == "weight" and \
                        id(p) not in heads
                    self._register_param(rec, unit.index, linear_weight)
                    self.params.append(rec)
                elif full_name not in rec.names:
                    rec.names.append(full_name)
                rec.units.append(unit)
                unit.params.append(rec)
        # torch's MultiheadAttention reads its out_proj's weight and bias in its own forward
        # (F.multi_head_attention_forward) without calling out_proj: they belong to its unit too,
        # as a tied weight belongs to each module that holds it (they read NaN before).
        units_by_module = {id(u.module): u for u in self.units}
        for sub in module.modules():
            if isinstance(sub, torch.nn.MultiheadAttention) and id(sub) in units_by_module:
                unit = units_by_module[id(sub)]
                for p in sub.out_proj.parameters(recurse=False):
                    rec = by_id.get(id(replaced.get(id(p), p)))
                    if rec is not None and unit not in rec.units:
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
        owner = weakref.ref(self)
        for sub in module.modules():
            # torch's Module.zero_grad only sees p.grad, which Strata's parameters never keep.
            sub.zero_grad = functools.partial(_module_zero_grad, owner, sub)
            # copy.deepcopy looks for the instance's own __deepcopy__ first.
            sub.__deepcopy__ = _refuse_deepcopy
        for unit in self.units:
            # model.state_dict() / load_state_dict() read and write the values in Strata.
            unit.hooks.append(unit.module._register_state_dict_hook(
                functools.partial(_state_dict_hook, owner, unit)))
            unit.module._load_from_state_dict = functools.partial(_load_from_state_dict, owner,
                                                                  unit)
        self._original_forward = module.forward
        original = module.forward

        @functools.wraps(original)
        def forward(*args, **kwargs):
            me = owner()
            if me is None or me._closed:
                return original(*args, **kwargs)
            if me._root_step_started:  # the root's own pre-hook has begun this call's step
                me._root_step_started = False
            else:
                me._begin_forward()
            me._in_forward += 1
            try:
                with torch.autograd.graph.saved_tensors_hooks(me._pack, me._unpack):
                    return original(*args, **kwargs)
            except BaseException:
                if me._in_forward == 1:
                    me._abandon_forward()
                raise
            finally:
                me._in_forward -= 1

        module.forward = forward
        module._strata_offload = self

    def _choose_trainable_home(self, module, asked):
        """Where the parameters trainable at offload rest, and why. asked "nvme", "pinned" or
        "device" is kept; None (automatic) gives the compute tier when the model has frozen
        parameters (LoRA: a streamed base, small adapters) and the trainable ones fit a quarter
        of the budgets there (weights and gradients, and their optimizer's fp32 master and two
        moments, 12 bytes per element, in pinned memory: strata_optimizer_add_param keeps the
        states of a parameter resting in memory there), so that a step writes nothing to NVMe;
        else param_home, as for full fine-tuning."""
        if asked is not None:
            if asked not in ("nvme", "pinned", "device"):
                raise StrataError(_lib.E_INVALID, f"trainable_home={asked!r}: 'nvme', 'pinned', "
                                                  "'device' or None (automatic)")
            return asked, "asked"
        params = {id(p): p for p in module.parameters()}.values()
        trainable = [p for p in params if p.requires_grad]
        if not trainable or len(trainable) == len(params):
            return self.param_home, "no frozen parameters: param_home"
        nbytes = sum(p.numel() * p.element_size() for p in trainable)
        states = 12 * sum(p.numel() for p in trainable)
        pinned = self.runtime.stats()["pinned_budget_bytes"]
        if self.compute_tier == "pinned":
            fits = 4 * (2 * nbytes + states) <= pinned
            tier = "pinned"
        else:
            fits = 4 * states <= pinned and \
                4 * 2 * nbytes <= self.runtime.config.device_budget_bytes
            tier = "device"
        why = (f"{len(trainable)} trainable of {len(params)} parameters, {nbytes} bytes, "
               f"{states} bytes of optimizer states: ")
        if fits:
            return tier, why + f"within a quarter of the budgets, at home on the {tier} tier"
        return self.param_home, why + "more than a quarter of the budgets, param_home"

    def _register_param(self, rec, layer, linear_weight=False):
        rt = self.runtime
        p = rec.param
        dtype = _views.TORCH_TO_STRATA[p.dtype]
        nbytes = p.numel() * p.element_size()
        if nbytes == 0:
            raise StrataError(_lib.E_INVALID, f"parameter {rec.name!r} is empty")
        # A frozen parameter (a LoRA base) is read-only in Strata: streamed from its home as
        # often as the budgets force it out, never written back, no gradient or optimizer state.
        # QLoRA: a frozen linear weight is kept in NF4 (quantize_frozen="nf4").
        if self.quantize_frozen == "nf4" and linear_weight and not p.requires_grad and \
                p.dtype in (torch.float32, torch.bfloat16, torch.float16):
            packed = _nf4.quantize(p, repr(rec.name))
            rec.tensor = rt.register(rec.name, packed.numel(), "u8", "parameter", layer,
                                     self.param_home, read_only=True)
            rec.tensor.write(packed.numpy())
            rec.codec = "nf4"
        else:
            home = self.trainable_home if p.requires_grad else self.param_home
            rec.tensor = rt.register(rec.name, nbytes, dtype, "parameter", layer, home,
                                     read_only=not p.requires_grad)
            rec.tensor.write(_views.host_numpy(p))
        rec.owner = weakref.ref(self)
        p._strata = rec
        self._make_placeholder(rec)
        self._to_placeholder(rec)
        # Hooked only now that .data is on the compute device: torch drops a parameter's
        # AccumulateGrad node when .data moves to another device or type (set_data), so a hook
        # taken on the CPU parameter would never run for a CUDA one.
        if p.requires_grad:
            self._ensure_grad(rec, layer)

    def _ensure_grad(self, rec, layer=None):
        """Gives a parameter that requires grad its GRADIENT tensor and hooks: at offload, or
        when a frozen parameter is unfrozen later (requires_grad_(True), then forward or
        add_param_group), so that unfreezing works as in torch."""
        p = rec.param
        if rec.grad is not None or not p.requires_grad:
            return
        nbytes = rec.numel * p.element_size()
        layer = rec.units[0].index if layer is None else layer
        # A gradient rests with its parameter at trainable_home when the trainable parameters
        # rest apart from the others (adapters beside a streamed base); otherwise, and for a
        # parameter unfrozen later (it rests as the base does), at grad_home.
        apart = self.trainable_home != self.param_home and not rec.tensor.read_only
        grad_home = self.trainable_home if apart else self.grad_home
        if rec.tensor.read_only:
            self._make_writable(rec, layer)
        rec.grad = self.runtime.register(rec.name + ".grad", nbytes,
                                         _views.TORCH_TO_STRATA[p.dtype], "gradient", layer,
                                         grad_home)
        # The AccumulateGrad node of p; a strong reference keeps the same node (and hook)
        # for every backward. Held here, not by the record: the node holds p, p holds its
        # record, and a cycle through torch's C++ objects is one the garbage collector cannot
        # see (the runtime, and its swap file, would then outlive the model).
        # Under no_grad() or inference_mode() (an inference script's set-up) expand_as records
        # no graph: the node is found with autograd on.
        with torch.inference_mode(False), torch.enable_grad():
            node = p.expand_as(p).grad_fn.next_functions[0][0]
        self._grad_nodes[id(rec)] = node
        owner = weakref.ref(self)
        rec.hooks.append(node.register_hook(
            functools.partial(_grad_accumulated_hook, owner, weakref.ref(rec))))
        rec.hooks.append(p.register_hook(
            functools.partial(_grad_computed_hook, owner, weakref.ref(rec))))

    def _make_writable(self, rec, layer):
        """Re-registers an unfrozen parameter's read-only tensor as a writable one with the same
        contents (Strata refuses to let backward or the optimizer write a read-only tensor)."""
        if rec.pins:
            raise StrataError(_lib.E_STATE, f"parameter {rec.name!r} was unfrozen while in use "
                                            "(its module holds it, inside its forward or "
                                            "backward): unfreeze it between steps")
        value = self._read_value(rec)
        old = rec.tensor
        rec.tensor = self.runtime.register(rec.name, rec.numel * value.element_size(),
                                           _views.TORCH_TO_STRATA[rec.dtype], "parameter", layer,
                                           self.param_home)
        rec.tensor.write(_views.host_numpy(value))
        rec.codec = None
        old.unregister()

    def _read_value(self, rec):
        """The parameter's value from Strata as a new CPU tensor (an NF4 weight dequantized).
        A placeholder written or replaced since the parameter's last use is refused here too:
        state_dict(), save_full_state_dict() and parameter() returned the old value, the edit
        dropped without a word (until 2026-12-05; only a forward refused it)."""
        if rec.pins == 0:
            self._check_placeholder(rec)
        if rec.codec == "nf4":
            packed = torch.empty(rec.tensor.nbytes, dtype=torch.uint8)
            rec.tensor.read(packed.numpy())
            return _nf4.dequantize(packed, rec.shape, rec.dtype, repr(rec.name))
        value = torch.empty(rec.shape, dtype=rec.dtype)
        rec.tensor.read(_np_view(value))
        return value

    def _write_value(self, rec, value):
        """Gives the parameter a new value (an NF4 weight is quantized again)."""
        value = value.detach().to(rec.dtype)
        rec.generation += 1
        if rec.codec == "nf4":
            rec.tensor.write(_nf4.quantize(value, repr(rec.name)).numpy())
        else:
            rec.tensor.write(_views.host_numpy(value))
        if self.optimizer is not None:
            # Its next step starts from the new value, as torch.optim.AdamW's would.
            self.optimizer._take_new_value(rec, value)

    # -- residency ------------------------------------------------------------------------------
    def _pin(self, rec):
        with self._lock:
            rec.pins += 1
            if rec.pins > 1:
                return
            try:
                self._check_placeholder(rec)
                self._check_room(rec.tensor.nbytes, rec.name)
                acq = rec.tensor.acquire(self.compute_tier)
                try:
                    data = self._decode(rec, acq)
                except BaseException:
                    acq.release(dirty=False, stream=_views.stream_pointer(self.device))
                    raise
            except BaseException:
                rec.pins -= 1
                raise
            self._held_bytes += rec.tensor.nbytes
            rec.acquisition = acq
            self._fetched[_views.storage_address(data)] = rec
            rec.param.data = data
            _placeholder_parameter.unmark(rec.param)
            rec.version = rec.param._version

    def _unpin(self, rec):
        with self._lock:
            if rec.pins == 0:
                raise StrataError(_lib.E_INTERNAL, f"parameter {rec.name!r} unpinned too often")
            rec.pins -= 1
            if rec.pins:
                return
            acq, rec.acquisition = rec.acquisition, None
            # Changed in place while its module held it (torch's nn.Embedding(max_norm=...)
            # renormalises the rows it looks up, in forward): the change is the weight now, as
            # in torch, so the memory goes back dirty (written back) and the optimizer's fp32
            # master takes it, its next step starting from it. Until 2026-12-05 the change was
            # dropped at the release. A frozen weight (read-only, or NF4-quantized) cannot keep
            # one: refused after the release.
            edited = rec.param._version != rec.version
            frozen = rec.codec == "nf4" or rec.tensor.read_only
            if edited and not frozen and self.optimizer is not None:
                self.optimizer._take_new_value(rec, rec.param.data.detach().to("cpu"))
            self._fetched.pop(_views.storage_address(rec.param.data), None)
            self._to_placeholder(rec)
            rec.decoded = None  # the dequantized copy of an NF4 weight goes back to torch
            dirty = edited and not frozen
            base, rec.base = (rec.base() if rec.base is not None else None), None
            if base is not None:
                self._defer_release(rec, acq, dirty, base)
            else:
                self._output_views.discard(id(rec))
                self._held_bytes -= rec.tensor.nbytes
                acq.release(dirty=dirty, stream=_views.stream_pointer(self.device))
            if edited and frozen:
                raise StrataError(_lib.E_STATE, f"frozen parameter {rec.name!r} was changed in "
                                                "place while its module held it: Strata keeps a "
                                                "frozen weight read-only (streamed from NVMe, or "
                                                "quantized), so the change would be lost")

    def _defer_release(self, rec, acq, dirty, base):
        """A view of the parameter's memory outlives its module's use of it: kept on an
        autograd Function's ctx (ctx.w = w.detach() instead of ctx.save_for_backward(w)), or on
        a module. Released now, the memory would be reused or unmapped and the view would read
        other bytes (wrong gradients) or crash the process (a segmentation fault, 2026-12-05).
        The acquisition stays until the last such view dies, or until the backward that may
        read it ends (_release_deferred): a view read after that reads freed memory, as torch
        warns for tensors kept outside save_for_backward."""
        def release():
            with self._lock:
                if self._deferred.pop(id(acq), None) is None:
                    return
                self._held_bytes -= rec.tensor.nbytes
                if not (self._closed or self.runtime.closed):
                    acq.release(dirty=dirty, stream=_views.stream_pointer(self.device))

        finalizer = weakref.finalize(base, release)
        finalizer.atexit = False
        self._deferred[id(acq)] = (finalizer, rec.tensor.nbytes)
        if id(rec) in self._output_views:
            self._output_views.discard(id(rec))
        elif rec.name not in self._deferred_warned:
            self._deferred_warned.add(rec.name)
            warnings.warn(f"a view of parameter {rec.name!r} outlives its module's forward (kept "
                          "on an autograd Function's ctx, or on a module?): Strata keeps its "
                          "memory until that view dies or the backward ends; keep it with "
                          "ctx.save_for_backward(w), which Strata restores in backward "
                          "(docs/pytorch.md)", RuntimeWarning, stacklevel=2)

    def _release_deferred(self):
        """Releases what _defer_release kept: the backward that could read it is over."""
        for finalizer, _ in list(self._deferred.values()):
            finalizer()

    def _decode(self, rec, acq):
        """The torch tensor p.data is while the parameter is in use: Strata's memory itself,
        or for an NF4 weight its dequantization into torch memory on the compute device."""
        if rec.codec != "nf4":
            bases = []
            data = _views.as_tensor(acq, rec.dtype, rec.shape, self.device, bases)
            rec.base = weakref.ref(bases[0])
            return data
        rec.decoded = torch.empty(rec.shape, dtype=rec.dtype, device=self.device)
        return _nf4.dequantize_into(acq.data, acq.nbytes, rec.decoded, repr(rec.name))

    def _pinned_in_use(self):
        """The pinned pool's bytes (whole pages) the parameters in use hold now: computing in
        host memory, the ones acquired there; on a device, none."""
        if self.compute_tier != "pinned":
            return 0
        with self._lock:
            return sum(_activations.whole_pages(rec.tensor.nbytes) for rec in self.params
                       if rec.acquisition is not None) + self._deferred_pinned()

    def _deferred_pinned(self):
        """The pinned pool's bytes kept for views that outlive their parameter's use."""
        if self.compute_tier != "pinned":
            return 0
        return sum(_activations.whole_pages(n) for _, n in self._deferred.values())

    def _check_room(self, nbytes, what):
        """Refuses at once an acquire on the compute tier that cannot succeed: the parameters
        this process holds there and the new tensor exceed the tier's budget. Strata's acquire
        would wait for a release (another thread may hold them), and here none can come before
        the acquire returns: the wait would end only in STRATA_E_TIMEOUT after 300 s."""
        budget = getattr(self.runtime.config, f"{self.compute_tier}_budget_bytes")
        in_use, kept = self._held_bytes, 0
        if self.compute_tier == "pinned":
            # The pinned pool is the budget less the streaming staging, in whole pages, and the
            # saved activations kept there (activations="pinned") stay until backward: a
            # parameter that cannot fit beside them would wait out the acquire's 300 s too.
            if self._pinned_pool_bytes is None:
                self._pinned_pool_bytes = _activations.pinned_pool_bytes(self.runtime)
            budget = self._pinned_pool_bytes
            in_use = self._pinned_in_use()
            nbytes = _activations.whole_pages(nbytes)
            if self.activations is not None:
                kept = self.activations.pinned_held_bytes
        if in_use + kept + nbytes <= budget:
            return
        held = [rec.name for rec in self.params if rec.acquisition is not None]
        field = f"{self.compute_tier}_budget_bytes"
        code = _lib.E_DEVICE_BUDGET if self.compute_tier == "device" else _lib.E_PINNED_BUDGET
        checkpointing = " (activation checkpointing holds a recomputed segment's parameters " \
                        "until their gradients are taken: checkpoint smaller segments, or)" \
            if self._in_backward else ""
        activations = f" and {kept} bytes of saved activations kept there until backward " \
                      f"(activations='pinned'; or use activations='nvme')" if kept else ""
        views = self._deferred_pinned()
        if views:
            activations += (f" ({views} of those bytes kept for views of parameters that "
                            "outlive their module's forward: keep them with "
                            "ctx.save_for_backward(w))")
        raise StrataError(code, f"{what} needs {nbytes} bytes on the {self.compute_tier} tier "
                                f"beside {in_use} bytes of parameters in use there "
                                f"({listed(held)}){activations}; the "
                                f"{'pool' if self.compute_tier == 'pinned' else 'budget'} is "
                                f"{budget} bytes and nothing in use can leave before this "
                                f"returns{checkpointing} raise {field} to at least "
                                f"{in_use + kept + nbytes + (getattr(self.runtime.config, field) - budget)}")

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
    def _recomputing(self):
        """True when a unit runs outside the model's forward but inside a backward: activation
        checkpointing recomputing it (torch.utils.checkpoint, either mode)."""
        if self._in_forward or not self._step_open:
            return False
        if self._in_backward:
            return True
        try:
            # Accepted only while the autograd engine runs a backward.
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
        except RuntimeError:
            return False
        self._in_backward = True
        return True

    def _pre_forward(self, unit):
        self._check_open()
        for rec in unit.params:
            if rec.grad is None and rec.param.requires_grad:
                self._ensure_grad(rec)
        if self._in_forward == 0 and unit.module is self.module:
            # The model itself owns parameters: its forward pre-hook runs before the forward
            # wrapper that begins the step, so it begins it here.
            self._begin_forward()
            self._root_step_started = True
        elif self._in_forward == 0 and not self._step_open:
            raise StrataError(_lib.E_STATE, f"module {unit.name!r} called on its own, outside "
                                            "a forward of the offloaded model and with no step "
                                            "open (before the first forward, or after "
                                            "optimizer.step()): call the model itself (each "
                                            "call of it begins one Strata step)")
        if self._recomputing():
            # The recomputed forward saves tensors that alias the parameters' memory (outside
            # our saved-tensors hook), and its backward follows at once: keep the parameters
            # acquired until their gradients are accumulated, as a unit's backward does.
            self._enter_phase(_BACKWARD, unit.index)
            for rec in unit.params:
                self._hold_for_backward(rec)
            return
        self._enter_phase(_FORWARD, unit.index)
        pinned = []
        try:
            for rec in unit.params:
                self._pin(rec)
                pinned.append(rec)
        except BaseException:
            for rec in pinned:
                self._unpin(rec)
            raise
        with self._lock:
            self._forward_units[unit.index] += 1

    def _post_forward(self, unit, output):
        if not (self._in_forward == 0 and self._in_backward):
            output = self._own_aliased_outputs(unit, output)
            for rec in unit.params:
                self._unpin(rec)
            with self._lock:
                self._forward_units[unit.index] -= 1
        with self._lock:
            if self._open_phase == (_FORWARD, unit.index):
                self._close_phase()
        if not torch.is_grad_enabled():
            return output
        wrapped = _through_boundary(output, self._pre_backward, unit)
        return output if wrapped is None else wrapped

    def _own_aliased_outputs(self, unit, output):
        """A unit's outputs that are its parameters or views of them (return self.weight.t())
        are over memory the release below gives back: they become copies, autograd's history
        kept (clone), before it. They read whatever reused the memory until 2026-12-05."""
        tensors = []
        _flatten(output, tensors)
        held = {_views.storage_address(rec.param.data): rec for rec in unit.params
                if rec.acquisition is not None}
        aliased = {}
        for t in tensors:
            try:
                address = _views.storage_address(t)
            except (RuntimeError, NotImplementedError):
                continue
            if address in held:
                aliased[id(t)] = t.clone()
                # torch's caller holds the original output until this hook returns: the release
                # waits for it (_defer_release) without a warning.
                self._output_views.add(id(held[address]))
        return _rebuild(output, aliased) if aliased else output

    def _abandon_forward(self):
        """The model's forward raised (a batch skipped after an out-of-memory error, a habit of
        training loops): the units it entered and did not leave hold their parameters, and no
        post-hook will release them; every later step(), state_dict() and save refused ("is
        acquired") until close(). Released here, as torch forgets a failed forward: the next
        forward begins a new step."""
        with self._lock:
            for index, calls in list(self._forward_units.items()):
                for _ in range(calls):
                    for rec in self.units[index].params:
                        self._unpin(rec)
            self._forward_units.clear()
            self._close_phase()

    def _pre_backward(self, unit):
        with self._lock:
            if not self._step_open:
                # Every forward opens a step and optimizer.step() ends it: this is the backward
                # of a graph from before that step, whose parameters have changed since. torch
                # raises for it (a saved variable modified); the runtime's "outside a step"
                # said nothing useful.
                raise StrataError(_lib.E_STATE, f"{_MODIFIED}: this backward is of a graph made "
                                                "before optimizer.step() updated the "
                                                f"parameters; {_AS_TORCH}")
            if not self._in_backward:
                self._in_backward = True
                torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
            self._enter_phase(_BACKWARD, unit.index)
            for rec in unit.params:
                self._hold_for_backward(rec)

    def _wrap_inputs(self, unit, inputs):
        """A unit with frozen parameters gets its inputs that require grad passed through a
        boundary whose backward releases them (None: inputs unchanged; with no input that
        requires grad, they go at the end of backward)."""
        if not torch.is_grad_enabled() or not any(rec.grad is None for rec in unit.params):
            return None
        return _through_boundary(inputs, self._post_backward, unit)

    def _post_backward(self, unit):
        """The unit's backward is done: its frozen parameters go (a later use acquires them
        again: a module called twice, a saved tensor unpacked after)."""
        with self._lock:
            for rec in unit.params:
                if rec.grad is None and rec.bwd_held:
                    rec.bwd_held = False
                    self._unpin(rec)

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
            self._release_deferred()

    def _grad_accumulated(self, rec):
        p = rec.param
        grad = p.grad
        if grad is None:
            return
        if grad.layout != torch.strided:  # an embedding made sparse after offload()
            raise StrataError(_lib.E_UNSUPPORTED, f"the gradient of {rec.name!r} is {grad.layout}: "
                                                  f"{_SPARSE_GRADIENTS}")
        if rec.grad_consumed:
            # torch would add this gradient to the one step() used, which Strata's optimizer
            # has consumed. Harmless if zero_grad() comes before anything reads the sum; the
            # readers (step, clipping, gradient()) refuse while it is stale.
            rec.grad_consumed = False
            rec.grad_stale = True
        if self.average_gradients:
            torch.distributed.all_reduce(grad, group=self.process_group)
            grad.div_(self.world_size)
        with self._lock:
            # Every use of the parameter has done its backward: its memory goes first, so that
            # the gradient finds the room the parameter held (a tight budget, a recomputed
            # checkpoint segment filling it) rather than wait for a release that cannot come.
            if rec.bwd_held:
                rec.bwd_held = False
                self._unpin(rec)
            self._check_room(rec.grad.nbytes, f"the gradient of {rec.name!r}")
            acq = rec.grad.acquire(self.compute_tier, discard=not rec.grad_written)
            try:
                view = _views.as_tensor(acq, rec.dtype, rec.shape, self.device)
                if rec.grad_written:
                    view.add_(grad)
                else:
                    view.copy_(grad)
            finally:
                acq.release(dirty=True, stream=_views.stream_pointer(self.device))
            rec.grad_written = True
            rec.grad_zero = False
            p.grad = None

    def __deepcopy__(self, memo):
        _refuse_deepcopy(memo)

    def _read_outside_its_module(self, rec, operation):
        owners = ", ".join(repr(o) for o in sorted({u.name for u in rec.units}))
        # torch's in-place operations end in "_" (zero_, mul_, copy_).
        verb = "written" if operation.endswith("_") and not operation.startswith("_") else "read"
        return StrataError(_lib.E_STATE, f"parameter {rec.name!r} was {verb} outside the forward "
                                         f"of the module that owns it ({owners}), by "
                                         f"{operation}: between its module's uses its memory is "
                                         "in Strata and the parameter holds only a NaN "
                                         "placeholder. In a forward, call that module (module(x),"
                                         " not module.forward(x), which skips its hooks) or "
                                         "make the weight the reading module's parameter too (a "
                                         "tied weight: reader.weight = owner.weight); a forward "
                                         "pre-hook that reads the module's parameters must be "
                                         "registered after offload(), a forward hook before it. "
                                         "Elsewhere read the value with offloaded.parameter(p) "
                                         "or state_dict(), and change it with load_state_dict()")

    # saved tensors that alias a parameter's memory
    def _pack(self, t):
        if isinstance(t, torch.Tensor) and t.device == self.device:
            try:
                address = _views.storage_address(t)
            except (RuntimeError, NotImplementedError):
                address = None
            rec = self._fetched.get(address)
            if rec is not None:
                return _SavedParameterView(rec, t.storage_offset(), tuple(t.size()),
                                           tuple(t.stride()), t.dtype)
            unheld = self._placeholders.get(address)
            if unheld is not None:
                # Autograd saves a parameter's placeholder: the forward computed with it, NaN,
                # outside every module that owns it. A plain nn.Parameter is refused at the
                # operation (PlaceholderParameter); one of a subclass of its own keeps its class
                # and arrives here. The loss would be NaN without a word.
                raise self._read_outside_its_module(unheld, "an operation autograd saves it for")
        if self.activations is not None and self.activations.enabled and \
                self.activations.wanted(t):
            return self.activations.pack(t)
        return _SavedByTorch(t) if isinstance(t, torch.Tensor) else t

    def _unpack(self, saved):
        if isinstance(saved, _activations.SavedActivation):
            return self.activations.unpack(saved)
        if isinstance(saved, _SavedByTorch):
            _activations.check_unmodified(saved.tensor, saved.version)
            return saved.tensor
        if not isinstance(saved, _SavedParameterView):
            return saved
        rec = saved.record
        if saved.generation != rec.generation:
            # torch's own words for a saved variable changed since its forward. The backward
            # ends here, and the engine runs no callback for a backward that raised: what it
            # holds is released now (_end_backward), or it stayed acquired for good.
            self._end_backward()
            raise StrataError(_lib.E_STATE, f"{_MODIFIED}: parameter {rec.name!r} got a new "
                                            "value (optimizer.step(), load_state_dict()) after "
                                            f"the forward whose graph this backward runs; "
                                            f"{_AS_TORCH}")
        if rec.pins == 0:  # the unit's pre-backward did not run (an output it could not wrap)
            self._hold_for_backward(rec)
        base = rec.param.data
        if base.dtype != saved.dtype:
            base = base.view(saved.dtype)
        return base.as_strided(saved.size, saved.stride, saved.offset)

    # -- public ---------------------------------------------------------------------------------
    def offload_activations(self, home="nvme", min_bytes=_activations.DEFAULT_MIN_BYTES):
        """Moves the tensors autograd saves in the model's forward into Strata (home "nvme":
        pinned memory, spilled to NVMe under pressure; "pinned": pinned only) and brings them
        back in backward, prefetching in reverse order; home None turns it off (tensors packed
        already still come back). Gradients are exactly those without it. Returns the
        ActivationOffload (its saves / packed_bytes / shared_bytes / held_bytes /
        peak_held_bytes count what it moved)."""
        with self._lock:
            if home is None:
                if self.activations is not None:
                    self.activations.enabled = False
                return self.activations
            if self.activations is None:
                self.activations = _activations.ActivationOffload(
                    self.runtime, self.device, home, min_bytes, in_use=self._pinned_in_use)
            else:  # the same one: tensors it packed may still be waiting for backward
                self.activations.configure(home, min_bytes)
            return self.activations

    def named_parameters(self):
        return [(rec.name, rec.param) for rec in self.params]

    def parameter(self, param_or_name):
        """Reads a parameter's current value from Strata into a new CPU tensor."""
        return self._read_value(self._record(param_or_name))

    def gradient(self, param_or_name):
        """This step's gradient of a parameter, as a new CPU tensor (None where torch's p.grad
        would be None; zeros after zero_grad(set_to_none=False))."""
        rec = self._record(param_or_name)
        self._check_not_stale([rec])
        if rec.grad is not None and rec.grad_zero and not rec.grad_written:
            return torch.zeros(rec.shape, dtype=rec.dtype)
        if rec.grad is None or not rec.grad_written:
            return None
        out = torch.empty(rec.shape, dtype=rec.dtype)
        rec.grad.read(_np_view(out))
        return out

    def state_dict(self):
        """The module's full state_dict, as plain torch would give it: every parameter read
        from Strata into a CPU tensor of its shape (a tied weight once, under each of its
        names), and the persistent buffers. Loadable with strict=True into the plain model.
        The same as model.state_dict(); it holds the whole model in host RAM."""
        return self.module.state_dict()

    def load_state_dict(self, state, strict=True):
        """Writes parameter values into Strata (model.load_state_dict does the same). The
        optimizer's fp32 masters take them too, before or after it exists, so that its next step
        starts from them as torch.optim.AdamW's would; its moments stay (load its state_dict
        for those)."""
        return self.module.load_state_dict(state, strict=strict)

    def zero_grad(self, set_to_none=True):
        """torch's zero_grad over every parameter: set_to_none=True forgets this step's
        gradients (strata_tensor_discard); False makes them zero."""
        self._zero_grads(self.params, set_to_none)

    def _zero_grads(self, records, set_to_none):
        with self._lock:
            for rec in records:
                if rec.grad is None:
                    continue
                # torch zeroes only a p.grad that exists: one no backward wrote since the last
                # set_to_none stays None, and its optimizer does not step it (made zero here,
                # weight decay and momentum moved parameters torch leaves alone).
                had_grad = rec.grad_written or rec.grad_zero or rec.grad_consumed or \
                    rec.grad_stale
                if rec.grad_written:
                    rec.grad.discard()
                    rec.grad_written = False
                rec.grad_zero = not set_to_none and had_grad
                rec.grad_consumed = False
                rec.grad_stale = False

    def _take_assigned_grads(self, records):
        """A p.grad the caller assigned after backward (gradient surgery: p.grad = g) is the
        gradient, as torch's optimizer and clipping read it: it replaces the one in Strata, and
        p.grad goes back to None. (Backward leaves p.grad None: each gradient goes into Strata
        as it is accumulated.) Until 2026-12-05 the assignment read back as set and step() used
        Strata's gradient without a word."""
        for rec in records:
            grad = rec.param.grad
            if grad is None or rec.grad is None:
                continue
            if tuple(grad.shape) != rec.shape:
                raise StrataError(_lib.E_INVALID, f"the gradient assigned to {rec.name!r} has "
                                                  f"shape {tuple(grad.shape)}, not {rec.shape}")
            with self._lock:
                rec.grad.write(_views.host_numpy(grad.to(rec.dtype)))
                rec.grad_written = True
                rec.grad_zero = False
                rec.grad_stale = False
                rec.grad_consumed = False
                rec.param.grad = None

    def _check_not_stale(self, records):
        self._take_assigned_grads(records)
        stale = [rec.name for rec in records if rec.grad_stale]
        if stale:
            raise StrataError(_lib.E_STATE,
                              f"{listed(stale)} gradient(s) were accumulated by a "
                              "backward after optimizer.step() with no zero_grad() between: "
                              "torch would add them to the gradients step() used, which "
                              "Strata's optimizer has consumed. Call optimizer.zero_grad() (or "
                              "model.zero_grad()) after step()")

    def _materialise_zero_grads(self, records):
        """Writes zeros for the gradients that zero_grad(set_to_none=False) left at zero and no
        backward touched since, so that the optimizer steps on them as torch's does."""
        for rec in records:
            if rec.grad is not None and rec.grad_zero and not rec.grad_written:
                acq = rec.grad.acquire(self.compute_tier, discard=True)
                try:
                    _views.as_tensor(acq, rec.dtype, rec.shape, self.device).zero_()
                finally:
                    acq.release(dirty=True, stream=_views.stream_pointer(self.device))
                rec.grad_written = True

    def _gradient_views(self, records, dirty):
        """Yields (record, a torch view of its Strata gradient) for every parameter that torch
        would have a p.grad for, one acquired at a time; dirty: the caller changes them."""
        with self._lock:
            self._check_open()
            self._check_not_stale(records)
            if not self._step_open:  # zero_grad(set_to_none=False) after step(), then this
                self.runtime.step_begin()
                self._step_open = True
            self._enter_phase(_OPTIMIZER, -1)
            for rec in records:
                if rec.grad is None or not (rec.grad_written or rec.grad_zero):
                    continue
                if not rec.grad_written:
                    if not dirty:
                        yield rec, torch.zeros(rec.shape, dtype=rec.dtype, device=self.device)
                        continue
                    self._materialise_zero_grads([rec])
                acq = rec.grad.acquire(self.compute_tier)
                try:
                    yield rec, _views.as_tensor(acq, rec.dtype, rec.shape, self.device)
                finally:
                    acq.release(dirty=dirty, stream=_views.stream_pointer(self.device))

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
        if restore:
            # Checked before anything is undone: close() then hands back the values in Strata,
            # and an edit of a placeholder (model.half(), nn.init.zeros_) would be lost.
            for rec in self.params:
                if rec.pins == 0 and not self.runtime.closed:
                    self._check_placeholder(rec)
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
            for sub in self.module.modules():
                sub.__dict__.pop("zero_grad", None)
                sub.__dict__.pop("_load_from_state_dict", None)
                sub.__dict__.pop("__deepcopy__", None)
            for rec in self.params:
                for h in rec.hooks:
                    h.remove()
                if restore and rec.tensor is not None and not self.runtime.closed:
                    while rec.pins:
                        self._unpin(rec)
                    try:
                        value = self._read_value(rec)
                    except StrataError:
                        value = torch.empty(rec.shape, dtype=rec.dtype)
                    rec.param.data = value.to(self.device)
                _placeholder_parameter.unmark(rec.param)
                rec.param._strata = None
        finally:
            self.runtime.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def listed(names):
    """'N (first, second, ... )' for an error message naming parameters."""
    return f"{len(names)} ({', '.join(names[:5])}{' ...' if len(names) > 5 else ''})"


def _np_view(t):
    """A numpy array sharing t's (contiguous CPU) memory; bfloat16 as int16."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().reshape(-1)
    return t.numpy().reshape(-1)


_MODULE_ZERO_GRAD_DEFAULT = inspect.signature(torch.nn.Module.zero_grad).parameters[
    "set_to_none"].default


def _module_zero_grad(owner_ref, module, set_to_none=_MODULE_ZERO_GRAD_DEFAULT):
    """module.zero_grad of an offloaded model: torch's, and the same for the gradients that
    Strata holds for module's parameters (set_to_none: forget them; else: make them zero)."""
    type(module).zero_grad(module, set_to_none=set_to_none)
    owner = owner_ref()
    if owner is None or owner._closed:
        return
    mine = {id(p) for p in module.parameters()}
    owner._zero_grads([rec for rec in owner.params if id(rec.param) in mine], set_to_none)


def _state_dict_hook(owner_ref, unit, module, destination, prefix, local_metadata):
    """Replaces the placeholders torch put in the state_dict by the values in Strata. A tied
    weight is read once per state_dict call and appears under each of its names (one tensor,
    as torch has it; torch.save stores it once)."""
    owner = owner_ref()
    if owner is None or owner._closed:
        return destination
    try:
        cache = destination.__dict__.setdefault("_strata_values", {})
    except AttributeError:  # a plain dict given as destination: no sharing between names
        cache = {}
    for key, p in module._parameters.items():
        rec = getattr(p, "_strata", None) if p is not None else None
        if rec is None or (prefix + key) not in destination:
            continue
        # keep_vars=True: torch put the Parameter itself, whose requires_grad the caller reads
        # ("save only the trainable weights" filters on it). The value from Strata is then a
        # Parameter too, requires_grad as the model's; a plain tensor saved none of them.
        keep_vars = isinstance(destination[prefix + key], torch.nn.Parameter)
        value = cache.get((id(rec), keep_vars))
        if value is None:
            value = owner.parameter(rec)
            if keep_vars:
                value = torch.nn.Parameter(value, requires_grad=p.requires_grad)
            cache[(id(rec), keep_vars)] = value
        destination[prefix + key] = value
    return destination


def _refuse_deepcopy(memo):
    """copy.deepcopy of an offloaded module (or of its handle): a copy would hold the
    placeholders, whose clones are NaN, and hooks that drive the original's Strata tensors."""
    raise StrataError(_lib.E_UNSUPPORTED,
                      "copy.deepcopy of a model offloaded by strata.torch.offload: its weights are "
                      "in Strata and a copy's hooks would drive the original's tensors; copy the "
                      "model before offload, or load offloaded.state_dict() (or "
                      "model.state_dict()) into a fresh one")


def _load_from_state_dict(owner_ref, unit, state_dict, prefix, local_metadata, strict,
                          missing_keys, unexpected_keys, error_msgs):
    """module._load_from_state_dict of a unit: its parameters' values go into Strata; the rest
    (buffers, extra state, the missing / unexpected bookkeeping) is torch's."""
    module = unit.module
    owner = owner_ref()
    handled = []
    if owner is not None and not owner._closed:
        for key, p in module._parameters.items():
            rec = getattr(p, "_strata", None) if p is not None else None
            name = prefix + key
            if rec is None or name not in state_dict:
                continue
            value = state_dict.pop(name)
            handled.append((name, value))
            if tuple(value.shape) != rec.shape:
                error_msgs.append(f"size mismatch for {name}: copying a param with shape "
                                  f"{value.shape} from checkpoint, the shape in current "
                                  f"model is {torch.Size(rec.shape)}.")
                continue
            owner._write_value(rec, value)
    try:
        type(module)._load_from_state_dict(module, state_dict, prefix, local_metadata, strict,
                                           missing_keys, unexpected_keys, error_msgs)
    finally:
        for name, value in handled:
            state_dict[name] = value
            if name in missing_keys:
                missing_keys.remove(name)


_SPARSE_GRADIENTS = ("Strata's gradients are dense, and strata.torch.AdamW steps dense ones only "
                     "(torch.optim.AdamW refuses sparse gradients too): use sparse=False")


def _refuse_sparse_gradients(name, module):
    """nn.Embedding / nn.EmbeddingBag(sparse=True) give sparse gradients: refused at offload(),
    not at the first backward (torch's internal copy_ error there named neither)."""
    sparse = isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and module.sparse
    if sparse and any(p.requires_grad for p in module.parameters(recurse=False)):
        raise StrataError(_lib.E_UNSUPPORTED, f"module {name!r} is an "
                                              f"nn.{type(module).__name__}(sparse=True), whose "
                                              f"gradients are sparse: {_SPARSE_GRADIENTS}")


def _pre_forward_hook(owner_ref, unit, module, inputs):
    owner = owner_ref()
    if owner is not None and not owner._closed:
        owner._pre_forward(unit)
        return owner._wrap_inputs(unit, inputs)
    return None


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


_MIB = 1 << 20
# Pinned budget sized from the model: this many times its largest unit (the parameters of one
# module, or one parameter) - a unit and its gradient in use with the tied embedding held across
# backward, and the optimizer's need (a parameter, its gradient and two sub-groups of states of
# pinned/16 each, at most 3.2x the parameter) - with no less than 64 MiB.
_PINNED_UNITS = 5
_PINNED_FLOOR = 64 * _MIB


def _host_available_bytes():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def sized_budgets(model, device, compute_tier):
    """The budgets offload() uses when none is given: {field: (bytes, why)}.

    pinned_budget_bytes: computing on the device, automatic (0: the runtime sizes it from the
    drive, not the model; the handle's .budgets then shows the figure it chose); computing in
    pinned memory, 5x the model's largest unit, at least 64 MiB, at most half of the host's
    available memory. Either way not the model's size, so the model states live on NVMe and host
    RAM stays far below plain PyTorch's 16 bytes per parameter. device_budget_bytes, on CUDA:
    half of the device's free memory (the rest for torch's activations), at most the model's
    parameters and gradients."""
    unit_bytes, seen = 0, set()
    total = 0
    for sub in model.modules():
        own = 0
        for p in sub._parameters.values():
            if p is None:
                continue
            nbytes = p.numel() * p.element_size()
            own += nbytes
            unit_bytes = max(unit_bytes, nbytes)
            if id(p) not in seen:
                seen.add(id(p))
                total += nbytes
        unit_bytes = max(unit_bytes, own)
    out = {}
    if compute_tier == "device":
        # Nothing of torch's compute lives in pinned memory: what it must hold is what streams
        # (staging) and the optimizer's read-ahead, which the runtime sizes from the drive.
        out["pinned_budget_bytes"] = (0, "automatic: sized by the runtime from the drive "
                                         "(pinned_budget_bytes 0, docs/tuning.md)")
    else:
        pinned = max(_PINNED_FLOOR, _PINNED_UNITS * unit_bytes)
        why = (f"{_PINNED_UNITS} x the largest unit ({unit_bytes} bytes), at least "
               f"{_PINNED_FLOOR}: torch computes in pinned memory")
        available = _host_available_bytes()
        if available is not None and pinned > available // 2:
            pinned = available // 2
            why += f"; capped at half of MemAvailable ({available} bytes)"
        out["pinned_budget_bytes"] = ((pinned + _MIB - 1) // _MIB * _MIB, why)
    if device.type == "cuda" and compute_tier == "device":
        free, _ = torch.cuda.mem_get_info(device)
        wanted = 2 * total
        budget = min(free // 2, wanted)
        out["device_budget_bytes"] = (max(_PINNED_FLOOR, budget // _MIB * _MIB),
                                      f"half of the device's free {free} bytes, at most the "
                                      f"parameters and gradients ({wanted} bytes)")
    return out


def offload(model, nvme_path=None, *, device=None, config=None, deepspeed_config=None,
            param_home=None, grad_home="nvme", average_gradients=None, process_group=None,
            compute_tier=None, param_init_fn=None, activations=None, quantize_frozen=None,
            trainable_home=None, **config_fields):
    """Puts model's parameters under a new Strata runtime and hooks its forward and backward.

    nvme_path: the directory for the swap file ("{rank}" is replaced by the torch.distributed
    rank). device: the compute device (default: the current CUDA device, else the CPU, where
    Strata's host-emulated device stands in for a GPU). config: a strata.Config;
    deepspeed_config: a DeepSpeed-style dict (strata.deepspeed.from_deepspeed); config_fields:
    strata.Config fields. param_home: where parameters rest, "nvme" (default), "pinned" or
    "device" (DeepSpeed's offload_param.device nvme / cpu / none). average_gradients: all-reduce
    gradients over process_group (default: when torch.distributed runs with several ranks).
    compute_tier: the tier torch computes on, "device" (default on CUDA) or "pinned" (default
    on the CPU: torch uses Strata's pinned host buffers directly, no emulated-device copy;
    "device" on the CPU runs the host-emulated device, for testing the GPU code path).
    Budgets not given (no config, no deepspeed_config, no *_budget_bytes keyword) are sized
    from the model and the machine (sized_budgets; the handle's .budgets says how).
    param_init_fn: for parameters on the meta device, f(module) initialising a module's own
    parameters, called one module at a time as they go into Strata (default: the module's
    reset_parameters()), so that a model larger than host RAM never exists whole there.
    activations: "nvme" or "pinned" moves the tensors autograd saves for backward into Strata
    (OffloadedModel.offload_activations); None (default) leaves them with torch.
    quantize_frozen: "nf4" stores every frozen (requires_grad=False) nn.Linear weight in NF4
    (QLoRA; strata.torch.nf4), dequantized where torch computes; None (default) keeps dtypes.
    trainable_home: where the parameters that require grad at offload rest, with their gradients
    (and, when not on NVMe, their optimizer states): "nvme", "pinned", "device", or None
    (default, automatic): for a model with frozen parameters (LoRA) the compute tier when they
    fit a quarter of the budgets, else param_home (the handle's .trainable_why says which).
    Returns an OffloadedModel; the model itself is used as before.
    """
    if activations not in (None, "nvme", "pinned"):
        raise StrataError(_lib.E_INVALID, f"activations={activations!r}: 'nvme', 'pinned' or "
                                          "None")
    cfg, mapped, device = build_config(nvme_path, device, config, deepspeed_config,
                                       **config_fields)
    budgets = None
    if config is None and deepspeed_config is None:
        tier = compute_tier or ("device" if device.type == "cuda" else "pinned")
        budgets = {k: v for k, v in sized_budgets(model, device, tier).items()
                   if k not in config_fields}
        for key, (value, _) in budgets.items():
            setattr(cfg, key, value)
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
    if budgets and budgets.get("pinned_budget_bytes", (None,))[0] == 0:
        chosen = runtime.stats()["pinned_budget_bytes"]
        budgets["pinned_budget_bytes"] = (chosen, budgets["pinned_budget_bytes"][1])
    try:
        handle = OffloadedModel(model, runtime, device, param_home, grad_home,
                                average_gradients, process_group, mapped, compute_tier,
                                param_init_fn, budgets, quantize_frozen, trainable_home)
        if activations is not None:
            handle.offload_activations(activations)
        return handle
    except BaseException:
        runtime.close()
        raise


class _StreamedStorage:
    """A storage of the file save_full_state_dict writes: its bytes are fetched when written."""

    __slots__ = ("key", "dtype", "numel", "fetch")

    def __init__(self, key, dtype, numel, fetch):
        self.key, self.dtype, self.numel, self.fetch = key, dtype, numel, fetch


class _StreamedTensor:
    """Pickles as the tensor torch.save would write (a view of a _StreamedStorage)."""

    __slots__ = ("storage", "shape")

    def __init__(self, storage, shape):
        self.storage, self.shape = storage, tuple(shape)

    def __reduce__(self):
        stride, acc = [], 1
        for size in reversed(self.shape):
            stride.append(acc)
            acc *= size
        return (torch._utils._rebuild_tensor_v2,
                (self.storage, 0, self.shape, tuple(reversed(stride)), False,
                 collections.OrderedDict()))


# The storage class torch.save names for each dtype in its file (torch.load maps the name back to
# the dtype). A fixed table, as the format has it: asking a tensor for its typed storage, as this
# once did, raised torch 2.x's "TypedStorage is deprecated" warning on every save.
_PICKLE_STORAGE_TYPES = {
    torch.float64: "DoubleStorage", torch.float32: "FloatStorage", torch.float16: "HalfStorage",
    torch.bfloat16: "BFloat16Storage", torch.int64: "LongStorage", torch.int32: "IntStorage",
    torch.int16: "ShortStorage", torch.int8: "CharStorage", torch.uint8: "ByteStorage",
    torch.bool: "BoolStorage", torch.complex64: "ComplexFloatStorage",
    torch.complex128: "ComplexDoubleStorage",
}


def save_full_state_dict(model, path):
    """Writes model.state_dict() to path in torch.save's format (torch.load reads it, and it
    loads with strict=True into the plain model), reading one parameter at a time from Strata:
    host RAM holds one parameter, never the whole model. A tied weight is stored once and
    appears under each of its names, as torch.save stores it."""
    handle = getattr(model, "_strata_offload", None)
    if handle is None or handle._closed:
        raise StrataError(_lib.E_INVALID, "save_full_state_dict takes a model offloaded by "
                                          "strata.torch.offload (else use torch.save)")
    for rec in handle.params:  # an edit that went nowhere is refused before the file is begun
        if rec.pins == 0:
            handle._check_placeholder(rec)
    storages = {}  # key -> _StreamedStorage, in the order keys were given
    by_record = {}
    out = collections.OrderedDict()

    def streamed(dtype, shape, fetch, identity):
        storage = by_record.get(identity)
        if storage is None:
            numel = 1
            for s in shape:
                numel *= s
            storage = _StreamedStorage(str(len(storages)), dtype, numel, fetch)
            storages[storage.key] = storage
            by_record[identity] = storage
        return _StreamedTensor(storage, shape)

    def walk(module, prefix):
        # The order and the names of torch's Module.state_dict (parameters, persistent
        # buffers, then children, recursively).
        for key, p in module._parameters.items():
            if p is None:
                continue
            rec = getattr(p, "_strata", None)
            if rec is not None:
                out[prefix + key] = streamed(rec.dtype, rec.shape,
                                             functools.partial(handle.parameter, rec), id(rec))
            else:
                value = p.detach()
                out[prefix + key] = streamed(value.dtype, value.shape,
                                             functools.partial(value.cpu), id(p))
        for key, buf in module._buffers.items():
            if buf is not None and key not in module._non_persistent_buffers_set:
                out[prefix + key] = streamed(buf.dtype, buf.shape,
                                             functools.partial(buf.detach().cpu), id(buf))
        for key, child in module._modules.items():
            if child is not None:
                walk(child, prefix + key + ".")

    walk(model, "")

    def persistent_id(obj):
        if isinstance(obj, _StreamedStorage):
            storage_type = _PICKLE_STORAGE_TYPES.get(obj.dtype)
            if storage_type is None:
                raise StrataError(_lib.E_INVALID, f"save_full_state_dict cannot write a tensor "
                                                  f"of dtype {obj.dtype} (use torch.save)")
            return ("storage", getattr(torch, storage_type), obj.key, "cpu", obj.numel)
        return None

    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=2)
    pickler.persistent_id = persistent_id
    pickler.dump(out)
    writer = torch._C.PyTorchFileWriter(str(path))
    try:
        data = buf.getvalue()
        writer.write_record("data.pkl", data, len(data))
        for key in sorted(storages):
            value = storages[key].fetch().contiguous()
            writer.write_record(f"data/{key}", value.data_ptr(),
                                value.numel() * value.element_size())
            del value
        writer.write_end_of_file()
    finally:
        del writer
