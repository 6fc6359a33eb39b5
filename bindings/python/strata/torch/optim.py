"""strata.torch.AdamW: a torch.optim.Optimizer whose states live in Strata.

The fp32 master weights and the Adam moments of every parameter are Strata's optimizer states
(tensors of kinds MASTER_WEIGHT, ADAM_M, ADAM_V, home NVMe); step() runs strata_optimizer_step,
which streams them through pinned memory and writes the new weights into the parameters.

Over parameters of a strata.torch.offload model, the optimizer uses that model's runtime: the
gradients are already in Strata (the backward hooks put them there) and the new weights land in
the parameters' Strata tensors. Over ordinary parameters it creates a runtime of its own
(nvme_path=... is then required): step() copies each .grad in, runs the update, and copies the new
weights back into .data.

param_groups, add_param_group, zero_grad, state_dict / load_state_dict (torch.optim.AdamW's
format: state[i] = {step, exp_avg, exp_avg_sq}) and torch.optim.lr_scheduler all work; the
group settings are pushed to Strata (strata_optimizer_set_group) at every step where they
changed.
"""
import inspect
import os
import warnings

import torch

from .. import _lib
from ..config import Config
from ..errors import StrataError
from ..runtime import Runtime
from . import _intercept, _views
from .offload import _np_view, build_config, listed

_ZERO_GRAD_DEFAULT = inspect.signature(torch.optim.Optimizer.zero_grad).parameters[
    "set_to_none"].default
_STATES = (("exp_avg", _lib.OPTIMIZER_EXP_AVG), ("exp_avg_sq", _lib.OPTIMIZER_EXP_AVG_SQ))


def _group_settings(group):
    betas = tuple(float(b) for b in group["betas"])
    return (float(group["lr"]), betas, float(group["eps"]), float(group["weight_decay"]),
            bool(group.get("decoupled_weight_decay", True)))


def _settings_for_step(settings, global_step, group_step):
    """The settings that make Strata's update at its global step count equal torch's at the
    group's own step count (torch keeps state['step'] per parameter; a group added mid-run
    starts at 1 while Strata's count goes on).

    Strata applies  p *= 1 - lr*wd;  p -= lr/b1(T) * m / (sqrt(v)/sqrt(b2(T)) + eps)  with
    b1(T) = 1 - beta1^T, b2(T) = 1 - beta2^T at its step T. With k = sqrt(b2(T) / b2(t)),
    eps' = eps / k and lr' = lr * b1(T) / (b1(t) * k) give torch's update at step t, and
    wd' = lr * wd / lr' keeps the decoupled decay (Adam's L2 term does not depend on lr)."""
    if group_step == global_step:
        return settings
    lr, (beta1, beta2), eps, wd, decoupled = settings
    b1_t, b2_t = 1.0 - beta1 ** group_step, 1.0 - beta2 ** group_step
    b1_T, b2_T = 1.0 - beta1 ** global_step, 1.0 - beta2 ** global_step
    k = (b2_T / b2_t) ** 0.5
    lr2 = lr * b1_T / (b1_t * k)
    wd2 = (lr * wd / lr2 if lr2 else wd) if decoupled else wd
    return (lr2, (beta1, beta2), eps / k, wd2, decoupled)


_READ_ONLY = ("strata.torch.AdamW's state lives in Strata: optimizer.state and its entries are "
              "copies read out of it, read-only; load_state_dict() changes the state (torch's "
              "state_dict, edited, loads)")


def _refuse_edit(*_args, **_kwargs):
    raise StrataError(_lib.E_UNSUPPORTED, _READ_ONLY)


# The operators that write into their left operand (`__int__`, `__index__`, `__iter__` and
# `__invert__` also start with "__i" and do not).
_IN_PLACE_OPERATORS = {"__setitem__"} | {
    f"__i{op}__" for op in ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "pow",
                            "and", "or", "xor", "lshift", "rshift")}


def _in_place(func, args, kwargs):
    """Whether a torch call writes into a _StateTensor: an in-place method (add_, zero_, copy_)
    or operator (`t[i] = x`, `t += x`) on one, or one given as out=."""
    name = getattr(func, "__name__", "")
    writes = (name.endswith("_") and not name.endswith("__")) or name in _IN_PLACE_OPERATORS
    if writes and args and isinstance(args[0], _StateTensor):
        return True
    out = (kwargs or {}).get("out")
    return any(isinstance(t, _StateTensor) for t in (out if isinstance(out, (tuple, list))
                                                     else (out,)))


class _StateTensor(torch.Tensor):
    """A tensor of optimizer.state[p]: a copy read out of Strata, which an in-place write would
    change alone (torch users expect it to change the optimizer): refused at the write. Anything
    computed from it (clone, arithmetic, deepcopy) is a plain tensor, the user's to change."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if _in_place(func, args, kwargs):
            _refuse_edit()
        with torch._C.DisableTorchFunction():
            out = func(*args, **(kwargs or {}))
        return out.as_subclass(torch.Tensor) if isinstance(out, _StateTensor) else out


class _StateEntry(dict):
    """One parameter's state as optimizer.state[p] gives it: new CPU tensors read out of Strata,
    read-only (_StateTensor). Assigning or deleting a key raises. Copies of the entry
    (copy.deepcopy, pickling) are plain dicts of plain tensors."""

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse_edit

    def __init__(self, entries):
        super().__init__({k: v.as_subclass(_StateTensor) if isinstance(v, torch.Tensor) else v
                          for k, v in entries.items()})

    def __reduce__(self):
        return dict, ({k: v.as_subclass(torch.Tensor) if isinstance(v, torch.Tensor) else v
                       for k, v in self.items()},)


class _LazyState(dict):
    """optimizer.state for strata.torch.AdamW: torch's per-parameter dict ({step, exp_avg,
    exp_avg_sq}, plus strata_master for half-precision parameters), read out of Strata when an
    entry is looked up. Each lookup copies the parameter's states into new CPU tensors (two or
    three fp32 copies of the parameter: the cost of reading them from NVMe). Read-only
    (_StateEntry, _StateTensor). Parameters not stepped yet have no entry, as in torch."""

    __delitem__ = clear = pop = popitem = setdefault = update = _refuse_edit

    def __init__(self, optimizer):
        super().__init__()
        self._optimizer = optimizer

    def _params(self):
        opt = self._optimizer
        return [p for g in opt.param_groups for p in g["params"]
                if id(p) in opt._records and opt._param_step(p) > 0]

    def __getitem__(self, p):
        if not isinstance(p, torch.Tensor) or id(p) not in self._optimizer._records or \
                self._optimizer._param_step(p) == 0:
            return _StateEntry({})  # torch's defaultdict(dict) gives a fresh empty dict too
        return _StateEntry(self._optimizer._read_state(p))

    def get(self, p, default=None):
        return self[p] if p in self else default

    def __contains__(self, p):
        return any(q is p for q in self._params())

    def __iter__(self):
        return iter(self._params())

    def keys(self):
        return self._params()

    def __len__(self):
        return len(self._params())

    def items(self):
        return [(p, self[p]) for p in self._params()]

    def values(self):
        return [self[p] for p in self._params()]

    __setitem__ = _refuse_edit

    def __repr__(self):
        return f"<strata.torch.AdamW state of {len(self)} parameters, read on access>"


class _Standalone:
    """Strata tensors for a parameter that is not offloaded (the optimizer's own runtime)."""

    def __init__(self, runtime, name, param, layer):
        dtype = _views.TORCH_TO_STRATA.get(param.dtype)
        if dtype is None or param.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise StrataError(_lib.E_UNSUPPORTED, f"parameter dtype {param.dtype}: Strata's "
                                                  "optimizer takes float32, bfloat16, float16")
        nbytes = param.numel() * param.element_size()
        self.name = name
        self.param = param
        self.shape = tuple(param.shape)
        self.dtype = param.dtype
        self.tensor = runtime.register(name, nbytes, dtype, "parameter", layer, "nvme")
        self.tensor.write(_views.host_numpy(param))
        self.grad = runtime.register(name + ".grad", nbytes, dtype, "gradient", layer, "nvme")
        self.grad_written = False
        # What the last step wrote into the parameter (a host copy): a parameter that differs
        # from it at the next step was edited, and the step starts from the edit, as torch's.
        self.written = None


def _flat(params):
    """The parameters of AdamW's params argument: tensors, or torch's param-group dicts."""
    for entry in params:
        group = entry.get("params", []) if isinstance(entry, dict) else entry
        yield from [group] if isinstance(group, torch.Tensor) else group


def _check_same_runtime(mapped, owner):
    """A deepspeed_config given to AdamW over offloaded parameters sets their optimizer only:
    the runtime (NVMe path, budgets, aio) is the model's, configured at offload. Runtime
    settings that differ from the model's would be ignored: refused instead."""
    defaults = Config().as_dict()
    model = owner.runtime.config.as_dict()  # what the model's runtime runs with

    def same(key, value):
        if key == "nvme_path" and isinstance(value, str) and isinstance(model.get(key), str):
            return os.path.normpath(value) == os.path.normpath(model[key])
        return model.get(key) == value

    # Only what this config sets (a field it leaves at its default is the model's business).
    differ = sorted(k for k, v in mapped.config.as_dict().items()
                    if defaults.get(k) != v and not same(k, v))
    if differ:
        raise StrataError(_lib.E_INVALID, f"AdamW(deepspeed_config=...) sets the runtime's "
                                          f"{', '.join(differ)} otherwise than the config the "
                                          "model was offloaded with; the parameters are "
                                          "offloaded, so the optimizer uses their model's "
                                          "runtime: give strata.torch.offload that config (or "
                                          "give AdamW none: it takes the model's)")


class AdamW(torch.optim.Optimizer):
    """AdamW (or Adam with decoupled_weight_decay=False) run by Strata.

    AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
          maximize=False, foreach=None, capturable=False, differentiable=False, fused=None,
          decoupled_weight_decay=True, max_grad_norm=0.0, check_overflow=True,
          sub_group_bytes=0, nvme_path=None, config=None, deepspeed_config=None,
          **config_fields)

    The signature and defaults are torch.optim.AdamW's. amsgrad, maximize, capturable and
    differentiable set True are refused (STRATA_E_UNSUPPORTED); foreach and fused pick torch's
    kernels and change nothing here. max_grad_norm clips the global gradient norm (0: off);
    check_overflow skips a step whose gradients hold inf or nan (step() then returns without
    changing anything; see last_result). nvme_path / config / config_fields configure the
    runtime the optimizer creates for parameters that are not offloaded (given with offloaded
    parameters they are STRATA_E_INVALID: the model's runtime is used); a deepspeed_config's
    "optimizer" and "gradient_clipping" also set the defaults above.

    A parameter given a new value between steps (model.load_state_dict on an offloaded model;
    any write to a standalone parameter, .data included) is where the next step starts from, as
    in torch: the fp32 master takes the new value; the moments stay.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, foreach=None, capturable=False,
                 differentiable=False, fused=None, decoupled_weight_decay=True,
                 max_grad_norm=0.0, check_overflow=True, sub_group_bytes=0, nvme_path=None,
                 config=None, deepspeed_config=None, **config_fields):
        self._ready = False
        # torch.optim.AdamW's own options: those that change the numbers Strata's update does not
        # compute are refused, never dropped; foreach and fused choose torch's kernels only.
        for name, value in (("amsgrad", amsgrad), ("maximize", maximize),
                            ("capturable", capturable), ("differentiable", differentiable)):
            if value:
                raise StrataError(_lib.E_UNSUPPORTED, f"AdamW({name}=True): Strata's optimizer "
                                                      f"has no {name}; torch.optim.AdamW does")
        params = list(params)  # read twice: for the model's DeepSpeed config, then by torch
        record = _intercept.first_offloaded(_flat(params))
        owner = record.owner() if record is not None else None
        # The DeepSpeed config whose "optimizer" and "gradient_clipping" apply: AdamW's own, else
        # the one the model was offloaded with (DeepSpeed builds its optimizer from the config
        # it is given; ignoring the model's would train with torch's defaults instead).
        mapped, source = None, None
        if deepspeed_config is not None:
            from ..deepspeed import from_deepspeed
            mapped, source = from_deepspeed(deepspeed_config, warn=False), "deepspeed_config"
            if owner is not None:
                _check_same_runtime(mapped, owner)
            # What the config sets without effect, as offload reports it; where the parameters
            # are plain tensors (a standalone optimizer), not that they stay on the device.
            for note in mapped.notes:
                if owner is not None or not note.startswith("no zero_optimization.offload_"):
                    warnings.warn("strata: " + note, stacklevel=2)
        elif owner is not None and owner.deepspeed is not None and \
                (owner.deepspeed.optimizer or owner.deepspeed.optimizer_options):
            mapped, source = owner.deepspeed, "the deepspeed_config the model was offloaded with"
        if mapped is not None:
            given = {"lr": (lr, 1e-3), "betas": (tuple(betas), (0.9, 0.999)), "eps": (eps, 1e-8),
                     "weight_decay": (weight_decay, 1e-2),
                     "decoupled_weight_decay": (decoupled_weight_decay, True)}
            options = {"max_grad_norm": (max_grad_norm, 0.0),
                       "sub_group_bytes": (sub_group_bytes, 0)}
            conflicts = [f"{key}={value!r} (the config's: {table[key]!r})"
                         for settings, table in ((given, mapped.optimizer),
                                                 (options, mapped.optimizer_options))
                         for key, (value, default) in settings.items()
                         if key in table and value != default and value != table[key]]
            if conflicts:
                raise StrataError(_lib.E_INVALID, f"AdamW({', '.join(conflicts)}): set here and "
                                                  f"by {source}; give each setting once")
            lr = mapped.optimizer.get("lr", lr)
            betas = mapped.optimizer.get("betas", betas)
            eps = mapped.optimizer.get("eps", eps)
            weight_decay = mapped.optimizer.get("weight_decay", weight_decay)
            decoupled_weight_decay = mapped.optimizer.get("decoupled_weight_decay",
                                                          decoupled_weight_decay)
            max_grad_norm = mapped.optimizer_options.get("max_grad_norm", max_grad_norm)
            sub_group_bytes = mapped.optimizer_options.get("sub_group_bytes", sub_group_bytes)
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameters: {betas}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        decoupled_weight_decay=bool(decoupled_weight_decay), amsgrad=False,
                        maximize=False)
        super().__init__(params, defaults)

        all_params = [p for g in self.param_groups for p in g["params"]]
        owners = {id(getattr(p, "_strata", None) and p._strata.owner()) for p in all_params}
        offloaded = [p for p in all_params if getattr(p, "_strata", None) is not None]
        if offloaded and len(offloaded) != len(all_params):
            raise StrataError(_lib.E_INVALID, "some parameters are offloaded by "
                                              "strata.torch.offload and some are not; give "
                                              "AdamW one kind")
        if offloaded:
            ignored = sorted(config_fields) + [n for n, v in (("nvme_path", nvme_path),
                                                              ("config", config)) if v is not None]
            if ignored:
                raise StrataError(_lib.E_INVALID, f"AdamW({', '.join(ignored)}): these configure "
                                                  "the runtime a standalone AdamW creates; the "
                                                  "parameters are offloaded, so the optimizer "
                                                  "uses their model's runtime (configure it at "
                                                  "strata.torch.offload)")
            if len(owners) != 1:
                raise StrataError(_lib.E_INVALID, "parameters of several strata.torch.offload "
                                                  "models: create one AdamW per model")
            self._model = offloaded[0]._strata.owner()
            if self._model.optimizer is not None:
                raise StrataError(_lib.E_STATE, "this offloaded model already has a "
                                                "strata.torch.AdamW, and its parameters stay "
                                                "under that one for the model's life: add "
                                                "parameters with its add_param_group, change "
                                                "settings through its param_groups, or its "
                                                "state with load_state_dict")
            self.runtime = self._model.runtime
            self._own_runtime = False
            self._model.optimizer = self
        else:
            with warnings.catch_warnings():  # the config's notes were given above
                warnings.simplefilter("ignore")
                cfg, _, _ = build_config(nvme_path, "cpu", config, deepspeed_config,
                                         **config_fields)
            self.runtime = Runtime(cfg)
            self._own_runtime = True
            self._model = None
        self._records = {}  # id(param) -> record (_Param of offload, or _Standalone)
        self._group_index = []  # param_groups[i] -> Strata group index
        self._group_start = []  # param_groups[i] -> Strata's step count when it was added
        self._group_of = {}  # id(param) -> its index in param_groups
        self._pushed = []  # the settings last given to Strata, per group
        self.last_result = None
        try:
            # Everything that can be refused is checked before anything is registered with
            # Strata, which cannot take a parameter back: a failed AdamW leaves the model as
            # it was, ready for a corrected one.
            for group in self.param_groups:
                self._check_group(group, self.param_groups)
            self.runtime.optimizer_configure(max_grad_norm=max_grad_norm,
                                             check_overflow=check_overflow,
                                             sub_group_bytes=sub_group_bytes)
            self._ready = True
            for group in self.param_groups:
                self._register_group(group)
        except BaseException:
            self._detach()
            raise
        self.state = _LazyState(self)

    # -- groups ---------------------------------------------------------------------------------
    def add_param_group(self, param_group):
        if not getattr(self, "_ready", False):
            super().add_param_group(param_group)
            return
        self._check_live()
        super().add_param_group(param_group)
        try:
            self._check_group(self.param_groups[-1], self.param_groups[:-1])
        except BaseException:
            self.param_groups.pop()
            raise
        self._register_group(self.param_groups[-1])

    def _check_group(self, group, groups):
        """Raises for anything Strata would refuse in group, before registering any of it."""
        if group.get("amsgrad") or group.get("maximize"):
            raise StrataError(_lib.E_UNSUPPORTED, "amsgrad and maximize are not supported")
        for p in group["params"]:
            if id(p) in self._records or sum(q is p for g in groups for q in g["params"]) > 1:
                raise StrataError(_lib.E_INVALID, "a parameter appears twice in the optimizer")
            if self._model is not None:
                rec = getattr(p, "_strata", None)
                if rec is None or rec.owner() is not self._model:
                    raise StrataError(_lib.E_INVALID, "parameter of another offloaded model")
                if rec.grad is None and not p.requires_grad:
                    raise StrataError(_lib.E_INVALID, f"parameter {rec.name!r} does not require "
                                                      "grad: leave it out of the optimizer")
            else:
                if getattr(p, "_strata", None) is not None:
                    raise StrataError(_lib.E_INVALID, "an offloaded parameter added to a "
                                                      "standalone strata.torch.AdamW")
                if p.dtype not in (torch.float32, torch.float16, torch.bfloat16):
                    raise StrataError(_lib.E_UNSUPPORTED, f"parameter dtype {p.dtype}: Strata's "
                                                          "optimizer takes float32, bfloat16, "
                                                          "float16")

    def _register_group(self, group):
        settings = _group_settings(group)
        index = self.runtime.optimizer_add_group(*settings)
        self._group_index.append(index)
        self._group_start.append(self.runtime.optimizer_get_step())
        self._pushed.append(settings)
        for p in group["params"]:
            self._group_of[id(p)] = len(self._group_index) - 1
            rec = self._record_for(p)
            self.runtime.optimizer_add_param(index, rec.tensor, rec.grad)

    def _record_for(self, p):
        if self._model is not None:
            rec = p._strata
            self._model._ensure_grad(rec)  # a parameter unfrozen since offload
        else:
            rec = _Standalone(self.runtime, f"param{len(self._records)}", p, -1)
        self._records[id(p)] = rec
        return rec

    def _group_step(self, i, global_step=None):
        """torch's state['step'] of the parameters of param_groups[i]."""
        if global_step is None:
            global_step = self.runtime.optimizer_get_step()
        return global_step - self._group_start[i]

    def _param_step(self, p):
        i = self._group_of.get(id(p))
        return 0 if i is None else self._group_step(i)

    def _push_groups(self, next_step=None):
        """Gives Strata each group's settings for the step about to run (next_step: Strata's
        step count after it; None: the settings as they are, with no step correction)."""
        for i, group in enumerate(self.param_groups):
            settings = _group_settings(group)
            if next_step is not None:
                settings = _settings_for_step(settings, next_step, self._group_step(i, next_step))
            if settings != self._pushed[i]:
                self.runtime.optimizer_set_group(self._group_index[i], *settings)
                self._pushed[i] = settings

    # -- step -----------------------------------------------------------------------------------
    def __setattr__(self, name, value):
        # optimizer.state = defaultdict(dict), torch's way to start the state afresh, would
        # replace the view of Strata's state and change nothing in it.
        if name == "state" and isinstance(self.__dict__.get("state"), _LazyState):
            _refuse_edit()
        super().__setattr__(name, value)

    @torch.no_grad()
    def step(self, closure=None, loss_scale=1.0):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_live()
        self._push_groups(self.runtime.optimizer_get_step() + 1)
        params = [p for g in self.param_groups for p in g["params"]]
        if self._model is None:
            offloaded = [self._records[id(p)].name for p in params
                         if getattr(p, "_strata", None) is not None]
            if offloaded:
                # Their gradients go into the offloaded model's runtime, not this one's: "no
                # gradient" named the wrong cause (an independent client, 2026-12-05).
                raise StrataError(_lib.E_STATE,
                                  f"{listed(offloaded)} parameter(s) were offloaded "
                                  "(strata.torch.offload) after this strata.torch.AdamW was made "
                                  "over them as plain parameters: make the optimizer after "
                                  "offload()")
            missing = [self._records[id(p)].name for p in params if p.grad is None]
            self._require_grads(missing)
            for p in params:
                rec = self._records[id(p)]
                current = p.detach().to("cpu")
                if rec.written is not None and not torch.equal(current, rec.written):
                    self._take_new_value(rec, current)
                rec.tensor.write(_views.host_numpy(current))
                rec.grad.write(_views.host_numpy(p.grad))
        else:
            self._model._release_deferred()  # views kept past a forward with no backward after
            records = [self._records[id(p)] for p in params]
            self._model._check_not_stale(records)
            missing = [r for r in records if not (r.grad_written or r.grad_zero)]
            consumed = [r.name for r in missing if r.grad_consumed]
            if consumed:
                # step() twice with no backward between: torch would step again on the same
                # p.grad; Strata's optimizer discarded them. "No gradient: leave them out of the
                # optimizer" named the wrong cause.
                raise StrataError(_lib.E_STATE,
                                  f"{listed(consumed)} gradient(s) were used by the previous "
                                  "step() and discarded (torch would step again on the same "
                                  "gradients): run backward() before each step()")
            self._require_grads([r.name for r in missing])
        model = self._model
        if model is not None:
            with model._lock:
                if not model._step_open:
                    model.runtime.step_begin()
                    model._step_open = True
                model._enter_phase("optimizer", -1)
                # Gradients zeroed with set_to_none=False and untouched since: torch steps on
                # (and keeps) zeros; written now, they stay zero after the step.
                zero_only = {id(r) for r in (self._records[id(p)] for p in params)
                             if r.grad_zero and not r.grad_written}
                model._materialise_zero_grads([self._records[id(p)] for p in params])
        try:
            self.last_result = self.runtime.optimizer_step(loss_scale)
        finally:
            if model is not None:
                model._end_step()
        if self.last_result["found_nonfinite"]:
            # torch's AdamW would step into nan; this one skips (check_overflow), which a loop
            # that never reads last_result would not see: every step skipped, nothing learnt.
            warnings.warn("strata.torch.AdamW.step() skipped its update: a gradient holds inf "
                          "or nan (check_overflow=True; optimizer.last_result). With a loss of "
                          "nan, look for an offloaded parameter read outside its module's "
                          "forward (docs/pytorch.md)", RuntimeWarning, stacklevel=2)
        else:
            # Strata discarded the gradients it consumed.
            for p in params:
                rec = self._records[id(p)]
                rec.grad_written = False
                if self._model is not None:
                    rec.grad_zero = id(rec) in zero_only
                    rec.grad_consumed = not rec.grad_zero
                    rec.generation += 1  # a graph saved before this step is stale
        if self._model is None:
            for p in params:
                rec = self._records[id(p)]
                out = rec.written if rec.written is not None else torch.empty(rec.shape,
                                                                                dtype=rec.dtype)
                rec.tensor.read(_np_view(out))
                p.data.copy_(out)
                rec.written = out
        return loss

    def _take_new_value(self, rec, value):
        """A parameter this optimizer updates got a new value outside step(): torch's AdamW
        would step from it, so the fp32 master becomes it (as the parameter's dtype holds it);
        the moments and the step count stay, as torch's state does."""
        if self._records.get(id(rec.param)) is not rec:
            return  # not one of this optimizer's (frozen, or not added)
        value = value.detach().to("cpu", rec.dtype)
        if rec.dtype in (torch.bfloat16, torch.float16):
            # A half-precision value that is what the master rounds to (a checkpoint's weights
            # loaded after its optimizer state, which restored the master) is no new value:
            # the master keeps its low bits. Taking the rounded weight lost them, and the order
            # of the two loads changed the run, as it does not in torch (2026-12-05).
            master = torch.empty(rec.shape, dtype=torch.float32)
            self.runtime.optimizer_read_state(rec.tensor, _lib.OPTIMIZER_MASTER, _np_view(master))
            if torch.equal(master.to(rec.dtype), value):
                return
        master = value.to(torch.float32).contiguous()
        self.runtime.optimizer_write_state(rec.tensor, _lib.OPTIMIZER_MASTER, _np_view(master))

    def _require_grads(self, missing):
        if missing:
            raise StrataError(_lib.E_STATE,
                              f"{listed(missing)} parameter(s) have no gradient this step; "
                              "Strata's optimizer updates every parameter it holds at each step "
                              "(torch's skips them): leave parameters that get no gradient out "
                              "of the optimizer")

    def zero_grad(self, set_to_none=_ZERO_GRAD_DEFAULT):
        """torch's zero_grad over this optimizer's parameters (torch's default for set_to_none):
        True forgets their gradients, False makes them zero, in Strata as in p.grad."""
        super().zero_grad(set_to_none=set_to_none)
        if self._model is not None:
            self._model._zero_grads([self._records[id(p)] for g in self.param_groups
                                     for p in g["params"]], set_to_none)

    # -- state ----------------------------------------------------------------------------------
    def _read_state(self, p, step=None):
        """torch's state entry of p, read out of Strata into new CPU tensors."""
        rec = self._records[id(p)]
        entry = {"step": torch.tensor(float(self._param_step(p) if step is None else step))}
        for key, which in _STATES:
            value = torch.empty(rec.shape, dtype=torch.float32)
            self.runtime.optimizer_read_state(rec.tensor, which, _np_view(value))
            entry[key] = value
        if rec.dtype != torch.float32:
            value = torch.empty(rec.shape, dtype=torch.float32)
            self.runtime.optimizer_read_state(rec.tensor, _lib.OPTIMIZER_MASTER, _np_view(value))
            entry["strata_master"] = value
        return entry

    def state_dict(self):
        self._check_live()
        state = {}
        groups = []
        index = 0
        for i, group in enumerate(self.param_groups):
            step = self._group_step(i)
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = []
            for p in group["params"]:
                packed["params"].append(index)
                if step > 0:
                    state[index] = self._read_state(p, step)
                index += 1
            groups.append(packed)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Loads a state_dict of strata.torch.AdamW or torch.optim.AdamW."""
        self._check_live()
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        for mine, theirs in zip(self.param_groups, groups):
            if len(mine["params"]) != len(theirs["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't "
                                 "match the size of optimizer's group")
        ids = {}
        for mine, theirs in zip(self.param_groups, groups):
            for p, key in zip(mine["params"], theirs["params"]):
                ids[key] = p
        states = state_dict["state"]
        owner = {id(p): i for i, g in enumerate(self.param_groups) for p in g["params"]}
        # A parameter the loaded state has no entry for starts afresh, as in torch (whose
        # load_state_dict replaces the whole state): zero moments, step 0. Until 2026-12-05 it
        # kept its old moments and step count, and the next steps differed from torch's.
        steps = {}  # param_groups index -> the step counts its parameters' entries have
        for key, p in ids.items():
            step = states.get(key, {}).get("step", 0)
            steps.setdefault(owner[id(p)], set()).add(int(step.item() if torch.is_tensor(step)
                                                          else step))
        # Checked before anything is written: a refused load changes nothing.
        for i, found in steps.items():
            if len(found) > 1:
                raise ValueError(f"parameter group {i} has parameters at different step counts "
                                 f"{sorted(found)}; Strata keeps one step count per group")
        for key, p in ids.items():
            rec = self._records[id(p)]
            for name, _ in _STATES:
                value = states.get(key, {}).get(name)
                if value is not None and tuple(value.shape) != rec.shape:
                    raise ValueError(f"state {name} of {rec.name}: shape {tuple(value.shape)} "
                                     f"is not {rec.shape}")
        for mine, theirs in zip(self.param_groups, groups):
            for k, v in theirs.items():
                if k != "params":
                    mine[k] = v
            mine.setdefault("decoupled_weight_decay", True)
        for key, p in ids.items():
            rec = self._records[id(p)]
            entry = states.get(key)
            if entry is None:
                zero = torch.zeros(rec.shape, dtype=torch.float32)
                entry = {name: zero for name, _ in _STATES}
            for name, which in _STATES:
                value = entry[name].detach().to("cpu", torch.float32).contiguous()
                self.runtime.optimizer_write_state(rec.tensor, which, _np_view(value))
            # The fp32 master: saved by Strata for half-precision parameters; otherwise the
            # parameter's current value (torch's AdamW keeps no separate master).
            if "strata_master" in entry:
                master = entry["strata_master"].detach().to("cpu", torch.float32).contiguous()
            else:
                current = torch.empty(rec.shape, dtype=rec.dtype)
                if self._model is None:
                    current.copy_(p.detach())
                else:
                    rec.tensor.read(_np_view(current))
                master = current.to(torch.float32)
            self.runtime.optimizer_write_state(rec.tensor, _lib.OPTIMIZER_MASTER,
                                               _np_view(master))
        group_steps = [next(iter(steps[i])) if i in steps else 0
                       for i in range(len(self.param_groups))]
        latest = max(group_steps, default=0)
        self.runtime.optimizer_set_step(latest)
        self._group_start = [latest - s for s in group_steps]
        self._push_groups()

    def save(self, path):
        """strata_optimizer_export: every state to one checksummed file, atomically."""
        self._check_live()
        self._check_one_step_count("save")
        self.runtime.optimizer_export(path)

    def load(self, path):
        """strata_optimizer_import: the inverse of save (all or nothing)."""
        self._check_live()
        self._check_one_step_count("load")
        self.runtime.optimizer_import(path)

    def _check_one_step_count(self, what):
        # Strata's checkpoint file has one step count; the groups' own counts would be lost.
        if any(self._group_start):
            raise StrataError(_lib.E_UNSUPPORTED,
                              f"{what}(): parameter groups added after the first step have "
                              "their own step counts, which Strata's checkpoint file does not "
                              "keep; use state_dict() / load_state_dict() (torch.save)")

    def _check_live(self):
        if self.runtime is None or self.runtime.closed:
            raise StrataError(_lib.E_STATE, "the optimizer's runtime is closed")

    def _detach(self):
        if self._model is not None and self._model.optimizer is self:
            self._model.optimizer = None
        if getattr(self, "_own_runtime", False) and self.runtime is not None:
            self.runtime.close()

    def close(self):
        self._detach()

    def __del__(self):
        try:
            if getattr(self, "_own_runtime", False):
                self.runtime.close()
        except Exception:
            pass
