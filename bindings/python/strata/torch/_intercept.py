"""torch functions that cannot see Strata's gradients or parameters, made to.

An offloaded parameter has no p.grad between its backward and optimizer.step() (the gradient is
in Strata) and no data outside its unit's forward and backward. torch's gradient clipping would
therefore find no gradients and return 0 without clipping, and DistributedDataParallel would
fail deep inside backward. install() (run by `import strata.torch`) makes
torch.nn.utils.clip_grad_norm_ / clip_grad_value_ give torch's result on Strata's gradients, and
makes DistributedDataParallel refuse an offloaded model with a message naming what works, and
makes every torch optimizer but strata.torch.AdamW refuse offloaded parameters when they are
added (its constructor) and at its step (one made before offload(): torch >= 2.0's global step
pre-hook, or on older torch each optimizer class's step checked first): it would find no p.grad
and change nothing, and makes torch's GradScaler refuse a strata.torch.AdamW over offloaded
parameters while it is enabled (it would unscale and check p.grad, which they do not have).
Everything else passes through to torch unchanged.

A script may have bound the function itself before importing strata.torch
(`from torch.nn.utils import clip_grad_norm_`); replacing the module attribute would leave it
torch's, which finds no p.grad and returns 0 without clipping. So install() changes the function
object itself: torch's function gets a code object that calls ours (its own code lives on in a
copy that ours calls for plain parameters), and every reference to it, bound before or after,
clips Strata's gradients.
"""
import functools
import importlib
import inspect
import math
import types

import torch

from .. import _lib
from ..errors import StrataError

_ORIGINAL = {}


def _split(parameters):
    """(plain parameters, {owner: [records]}) of a clip call's parameters, in their order."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    plain, offloaded, order = [], {}, []
    for p in parameters:
        rec = getattr(p, "_strata", None)
        owner = rec.owner() if rec is not None else None
        if owner is None or owner._closed:
            plain.append(p)
            order.append(("plain", p))
        else:
            offloaded.setdefault(owner, []).append(rec)
            order.append((owner, rec))
    return plain, offloaded, order


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, **kwargs):
    """torch.nn.utils.clip_grad_norm_, also over the gradients Strata holds.

    Same result as torch's on the same gradients: the total norm (returned) is computed from
    each gradient's norm in parameter order, and every gradient is multiplied by
    min(1, max_norm / (total + 1e-6)). For offloaded parameters this reads every gradient once
    and, when clipping, writes it back once; AdamW(max_grad_norm=...) folds the clip into the
    optimizer's own pass at no extra I/O.
    """
    plain, offloaded, order = _split(parameters)
    if not offloaded:
        return _ORIGINAL["clip_grad_norm_"](plain, max_norm, norm_type,
                                            error_if_nonfinite=error_if_nonfinite, **kwargs)
    max_norm, norm_type = float(max_norm), float(norm_type)
    norms = {}
    for owner, records in offloaded.items():
        for rec, grad in owner._gradient_views(records, dirty=False):
            norms[id(rec)] = _norm(grad, norm_type)
    parts = []
    for owner, item in order:
        if owner == "plain":
            if item.grad is not None:
                parts.append(_norm(item.grad, norm_type))
        elif id(item) in norms:
            parts.append(norms[id(item)])
    if not parts:
        return torch.tensor(0.0)
    device = parts[0].device
    parts = [t.to(device) for t in parts]
    if norm_type == math.inf:
        total = parts[0] if len(parts) == 1 else torch.max(torch.stack(parts))
    else:
        total = torch.norm(torch.stack(parts), norm_type)
    if error_if_nonfinite and (torch.isnan(total) or torch.isinf(total)):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from "
                           "`parameters` is non-finite, so it cannot be clipped. To disable "
                           "this error and scale the gradients by the non-finite norm anyway, "
                           "set `error_if_nonfinite=False`")
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for p in plain:
        if p.grad is not None:
            p.grad.detach().mul_(coef.to(p.grad.device))
    if float(coef) != 1.0:  # multiplying by 1 changes nothing: skip the write-back
        for owner, records in offloaded.items():
            for rec, grad in owner._gradient_views(records, dirty=True):
                grad.mul_(coef.to(grad.device))
    return total


def _norm(grad, norm_type):
    grad = grad.detach()
    if norm_type == math.inf:
        return grad.abs().max()
    return torch.norm(grad, norm_type)


def clip_grad_value_(parameters, clip_value, **kwargs):
    """torch.nn.utils.clip_grad_value_, also over the gradients Strata holds."""
    plain, offloaded, _ = _split(parameters)
    # torch 2.x refuses a list in which no gradient exists ("Expected !nested_tensorlist[0]
    # .empty()"), which is every list of a fully offloaded model: its gradients are Strata's.
    if any(p.grad is not None for p in plain):
        _ORIGINAL["clip_grad_value_"](plain, clip_value, **kwargs)
    clip_value = float(clip_value)
    for owner, records in offloaded.items():
        for rec, grad in owner._gradient_views(records, dirty=True):
            grad.clamp_(min=-clip_value, max=clip_value)


def _refuse_offloaded_ddp(init):
    def __init__(self, module, *args, **kwargs):
        if any(getattr(m, "_strata_offload", None) is not None for m in module.modules()):
            raise StrataError(_lib.E_UNSUPPORTED,
                              "DistributedDataParallel cannot wrap a strata.torch.offload "
                              "model: it needs every parameter's memory at construction and "
                              "in its reducer, and offloaded parameters have none between "
                              "uses. Use the offloaded model directly: under torch.distributed "
                              "offload() all-reduces each gradient over the process group as "
                              "its layer's backward ends (average_gradients=True, the default "
                              "with several ranks), which is what DDP would do")
        init(self, module, *args, **kwargs)

    __init__.__wrapped__ = init
    __init__.__doc__ = init.__doc__
    return __init__


def first_offloaded(params):
    """The record of the first parameter in params that strata.torch.offload holds, or None."""
    for p in params:
        rec = getattr(p, "_strata", None)
        owner = rec.owner() if rec is not None else None
        if owner is not None and not owner._closed:
            return rec
    return None


def _first_offloaded_of(optimizer):
    return first_offloaded(p for g in optimizer.param_groups for p in g["params"])


def _foreign_optimizer_error(optimizer, rec):
    return StrataError(_lib.E_INVALID, f"{type(optimizer).__name__} over parameter "
                                       f"{rec.name!r}, offloaded by strata.torch.offload: its "
                                       "gradient and values live in Strata, so this optimizer "
                                       "would see no gradient and change nothing; use "
                                       "strata.torch.AdamW")


def refuse_foreign_step(optimizer, _args, _kwargs):
    """torch >= 2.0's global optimizer step pre-hook: a torch optimizer made before offload()
    took its parameters holds them too, and would step nothing without a word."""
    from .optim import AdamW
    if isinstance(optimizer, AdamW):
        return
    rec = _first_offloaded_of(optimizer)
    if rec is not None:
        raise _foreign_optimizer_error(optimizer, rec)


def _step_checked_first(step):
    """step, refusing first what refuse_foreign_step refuses: torch < 2.0 has no global step
    hook, and an optimizer made before offload() never passes through add_param_group again."""

    @functools.wraps(step)  # keeps torch 1.13's `hooked` mark, so its profiler wraps it once
    def step_checked(self, *args, **kwargs):
        refuse_foreign_step(self, args, kwargs)
        return step(self, *args, **kwargs)

    step_checked.strata_checked = True
    return step_checked


def _check_steps_of(cls):
    """Every optimizer class below cls (cls too) whose own step is not yet checked first."""
    own = cls.__dict__.get("step")
    if callable(own) and not getattr(own, "strata_checked", False):
        cls.step = _step_checked_first(own)
    for sub in cls.__subclasses__():
        _check_steps_of(sub)


def _check_steps_of_later_classes(hook_for_profile):
    """torch 1.13's Optimizer.__init__ (and __setstate__) runs _hook_for_profile, the first
    moment an optimizer class defined after install() is seen: its step is checked from then."""

    def hook_for_profile_and_check(self):
        hook_for_profile(self)
        _check_steps_of(type(self))

    hook_for_profile_and_check.__wrapped__ = hook_for_profile
    return hook_for_profile_and_check


def _refuse_offloaded_in_foreign_optimizers(add_param_group):
    """torch.optim.Optimizer.add_param_group (which every torch optimizer's constructor calls)
    refusing offloaded parameters in any optimizer but strata.torch.AdamW: their gradients and
    values live in Strata, so torch's optimizer would find no p.grad, skip every one, and train
    nothing without a word."""

    def add_param_group_checked(self, param_group):
        from .optim import AdamW  # optim imports offload, which imports this module's users
        if not isinstance(self, AdamW) and isinstance(param_group, dict):
            params = param_group.get("params")
            if not isinstance(params, (torch.Tensor, set)) and params is not None:
                params = param_group["params"] = list(params)  # as torch's own does next
            rec = first_offloaded([params] if isinstance(params, torch.Tensor)
                                       else params or [])
            if rec is not None:
                raise _foreign_optimizer_error(self, rec)
        return add_param_group(self, param_group)

    add_param_group_checked.__wrapped__ = add_param_group
    add_param_group_checked.__doc__ = add_param_group.__doc__
    add_param_group_checked.__name__ = add_param_group.__name__
    return add_param_group_checked


def _refuse_enabled_scaler_over_offloaded(method):
    """torch's GradScaler.step / unscale_ refusing a strata.torch.AdamW over offloaded
    parameters while the scaler is enabled: it unscales and checks p.grad, where Strata's
    gradients never are, so it would clip and step on gradients still multiplied by the scale,
    or stop at torch's own "No inf checks were recorded for this optimizer"."""

    def checked(self, optimizer, *args, **kwargs):
        from .optim import AdamW
        if isinstance(optimizer, AdamW) and self.is_enabled():
            rec = _first_offloaded_of(optimizer)
            if rec is not None:
                raise StrataError(_lib.E_UNSUPPORTED, (
                    f"torch's GradScaler.{method.__name__} over strata.torch.AdamW with "
                    f"offloaded parameters ({rec.name!r}...): their gradients are in Strata, "
                    "not in p.grad, so the scaler can neither unscale them nor see an overflow; "
                    "scale the loss yourself and give the scale to the step: "
                    "(loss * scale).backward(); optimizer.step(loss_scale=scale), which divides "
                    "it out (before max_grad_norm's clip) and skips a step whose gradients "
                    "overflow (optimizer.last_result['found_nonfinite']: lower the scale then)"))
        return method(self, optimizer, *args, **kwargs)

    checked.__wrapped__ = method
    checked.__doc__ = method.__doc__
    checked.__name__ = method.__name__
    checked.strata_checked = True
    return checked


def _check_grad_scalers():
    """torch.amp.GradScaler (torch >= 2.3) and torch.cuda.amp.GradScaler, each method once."""
    for module in ("torch.amp", "torch.cuda.amp"):
        try:
            cls = getattr(importlib.import_module(module), "GradScaler", None)
        except ImportError:
            continue
        for name in ("step", "unscale_"):
            own = cls.__dict__.get(name) if cls is not None else None
            if callable(own) and not getattr(own, "strata_checked", False):
                setattr(cls, name, _refuse_enabled_scaler_over_offloaded(own))


def _trampoline(*args, _strata_impl=None, **kwargs):
    # The code torch's clip functions run once redirected: no globals, no closure, so that it
    # runs the same in torch's module; _strata_impl is a keyword default set on the function.
    return _strata_impl(*args, **kwargs)


def _redirect(function, replacement):
    """Makes torch's `function` (through any functools.wraps decorators, as torch 2.x's
    _no_grad) run `replacement`; returns a copy of the original that still runs torch's code.
    None where the innermost function has a closure (its code cannot be swapped)."""
    inner = inspect.unwrap(function)
    if not isinstance(inner, types.FunctionType) or inner.__closure__:
        return None
    original = types.FunctionType(inner.__code__, inner.__globals__, inner.__name__,
                                  inner.__defaults__, None)
    original.__kwdefaults__ = inner.__kwdefaults__
    original.__qualname__ = inner.__qualname__
    original.__doc__ = inner.__doc__
    signature = inspect.signature(inner)
    inner.__code__ = _trampoline.__code__
    inner.__defaults__ = None
    inner.__kwdefaults__ = {"_strata_impl": replacement}
    inner.__signature__ = signature  # help() and inspect still show torch's parameters
    return original


def install():
    if _ORIGINAL:
        return
    clip = torch.nn.utils.clip_grad
    for name, ours in (("clip_grad_norm_", clip_grad_norm_),
                       ("clip_grad_value_", clip_grad_value_)):
        theirs = getattr(clip, name)
        original = _redirect(theirs, ours)
        if original is None:  # a torch whose function cannot be redirected: names only
            _ORIGINAL[name] = theirs
            for module in (torch.nn.utils, clip):
                setattr(module, name, ours)
        else:
            _ORIGINAL[name] = original
    optimizer = torch.optim.Optimizer
    optimizer.add_param_group = _refuse_offloaded_in_foreign_optimizers(
        optimizer.add_param_group)
    # An optimizer made before offload(): at its step, where torch can say (torch >= 2.0).
    register = getattr(importlib.import_module("torch.optim.optimizer"),
                       "register_optimizer_step_pre_hook", None)
    if register is not None:
        register(refuse_foreign_step)
    else:  # torch < 2.0: each class's own step, those defined so far and those defined later
        _check_steps_of(optimizer)
        optimizer._hook_for_profile = _check_steps_of_later_classes(optimizer._hook_for_profile)
    _check_grad_scalers()
    if torch.distributed.is_available():
        ddp = torch.nn.parallel.DistributedDataParallel
        ddp.__init__ = _refuse_offloaded_ddp(ddp.__init__)
