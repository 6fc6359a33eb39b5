"""The class of an offloaded parameter while its .data is the placeholder: its values are refused.

Between its module's uses a parameter's .data is a placeholder over one NaN element (offload.py,
_make_placeholder). Code that reads a parameter without calling the module that owns it
(F.linear(h, model.embed.weight) for a tied head, a parent adding a child's bias, weight_norm's
pre-hook when it runs before Strata's, an L2 penalty over model.parameters(), an EMA copy,
torch.nn.utils.prune) computed with that NaN: NaN losses at best, at worst plausible numbers
(an argmax over NaN is 0, a pruning mask from NaN keeps arbitrary weights), without a word.

So while its .data is the placeholder a plain nn.Parameter's class is PlaceholderParameter (a
subclass: isinstance, the module's _parameters and the optimizer's references are unchanged), and
its __torch_function__ refuses, at the operation, any use of it by code other than Strata's
except:
  - reading its description (shape, dtype, device, numel(), requires_grad, is_pinned(), ...), or
    using it as a template for another tensor's (h.type_as(w), h.to(w), torch.zeros_like(w),
    w.new_zeros(n)): these read no value;
  - a conversion that hands it back unchanged (w.to(w.device), model.to(device) when already
    there): it read nothing;
  - .data, detach() and views (p.t(), p[0], p.unsqueeze(0)), which hand back a PlaceholderAlias
    checked the same way (torch's state_dict() detaches every parameter before Strata's hook
    puts the values in).
Only operations given a placeholder pay for the check: once its module acquires the parameter it
is an nn.Parameter again, whose operations never reach Python. Strata's own plumbing (the
caller's module is one of _STRATAS_OWN) handles placeholders on purpose and is let through.

torch's own lazy modules do the same (torch/nn/parameter.py: UninitializedParameter refuses
operations in its __torch_function__, and materialize() sets __class__ to Parameter).
"""
import sys
import warnings

import torch

# Tensor methods and properties that do not read the values.
_DESCRIPTION_ONLY = frozenset({
    "shape", "size", "dim", "ndim", "ndimension", "numel", "nelement", "dtype", "device",
    "layout", "is_cuda", "is_cpu", "is_meta", "is_sparse", "is_quantized", "is_floating_point",
    "is_complex", "is_signed", "element_size", "itemsize", "stride", "is_contiguous",
    "storage_offset", "data_ptr", "requires_grad", "requires_grad_", "is_leaf", "grad",
    "grad_fn", "names", "_version", "__len__", "__hash__", "__repr__", "__format__",
    "retains_grad", "get_device", "name", "output_nr", "_base", "_is_view", "is_inference",
    "is_nested", "register_hook", "_backward_hooks", "__class__", "is_pinned", "is_conj",
    "is_neg", "is_mkldnn", "is_shared", "is_same_size", "is_set_to", "result_type",
    "zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like",
    "randint_like", "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor",
    "storage", "untyped_storage", "_typed_storage", "storage_type",
    "_has_compatible_shallow_copy_type", "share_memory_",
})
# The parameter as a dtype / device template when it is not the tensor operated on.
_TEMPLATE_WHEN_NOT_FIRST = frozenset({"to", "type_as", "expand_as", "view_as", "reshape_as"})
# Conversions that return their input itself when there is nothing to convert.
_CONVERSIONS = frozenset({"to", "type", "type_as", "float", "half", "double", "bfloat16", "cpu",
                          "cuda", "contiguous"})
# Aliases of the parameter's memory, handed back checked in their turn.
_ALIASES = frozenset({"data", "detach"})
# Views: checked aliases too when they are over the placeholder's element (p.t().shape works);
# one that copied (advanced indexing) read the values, and is refused.
_VIEWS = frozenset({"t", "T", "mT", "H", "mH", "transpose", "swapaxes", "swapdims", "permute",
                    "movedim", "__getitem__", "unsqueeze", "squeeze", "expand", "expand_as",
                    "narrow", "select", "view", "view_as", "unflatten", "diagonal", "as_strided"})
# Strata's plumbing, which handles placeholders on purpose (a parameter unfrozen after offload()
# gets its gradient hook through one). Not strata.torch.lora: its modules are model code.
_STRATAS_OWN = frozenset({"strata.torch.offload", "strata.torch.optim", "strata.torch._views",
                          "strata.torch._placeholder_parameter", "strata.torch.activations",
                          "strata.torch.nf4", "strata.torch._intercept"})


def _name(func):
    name = getattr(func, "__name__", "")
    if name in ("__get__", "__set__", "__delete__"):  # a property: Tensor.shape.__get__
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    return name


def _check(func, types, args, kwargs, caller):
    kwargs = kwargs or {}
    run = torch._C._disabled_torch_function_impl  # nn.Parameter's own: the plain operation
    name = _name(func)
    setter = getattr(func, "__name__", "") == "__set__"  # p.data = x: caught at the next use
    query = name == "type" and len(args) == 1 and not kwargs  # w.type(): its type's name
    if setter or query or name in _DESCRIPTION_ONLY or caller in _STRATAS_OWN:
        return run(func, types, args, kwargs)
    found = _placeholder(args) or _placeholder(kwargs.values())
    if found is None:
        return run(func, types, args, kwargs)
    first, rec = found
    if name in _TEMPLATE_WHEN_NOT_FIRST and not first:
        return run(func, types, args, kwargs)
    if name in _ALIASES or (name in _VIEWS and first):
        result = run(func, types, args, kwargs)
        if name in _ALIASES or (isinstance(result, torch.Tensor) and
                                result.data_ptr() == rec.sentinel.data_ptr()):
            alias = result.as_subclass(PlaceholderAlias)
            alias._strata = rec
            return alias
    if name in _CONVERSIONS and first:
        result = run(func, types, args, kwargs)
        if result is args[0]:
            return result
    owner = rec.owner() if rec.owner is not None else None
    if owner is None:
        return run(func, types, args, kwargs)
    raise owner._read_outside_its_module(rec, name or str(func))


def _placeholder(values, first=True):
    """(whether it is the first argument, its record) for the first argument that is still a
    parameter's placeholder, or a PlaceholderAlias of one; None when there is none."""
    for value in values:
        if isinstance(value, (PlaceholderParameter, PlaceholderAlias)):
            rec = getattr(value, "_strata", None)
            if rec is not None and rec.sentinel is not None and \
                    value.data_ptr() == rec.sentinel.data_ptr():  # not a .data replaced since
                return first, rec
        elif isinstance(value, (list, tuple)):  # torch.cat([h, w]), torch.stack
            found = _placeholder(value, first=False)
            if found is not None:
                return found
        first = False
    return None


class PlaceholderParameter(torch.nn.Parameter):
    """A parameter whose memory is in Strata (never constructed: an nn.Parameter's class is set
    to it while its .data is the placeholder, and set back when its module acquires it)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        return _check(func, types, args, kwargs, caller)


class PlaceholderAlias(torch.Tensor):
    """p.data or p.detach() of a PlaceholderParameter: the same memory, checked the same way."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        return _check(func, types, args, kwargs, caller)


def mark(param):
    """A plain nn.Parameter whose .data is now its placeholder becomes a PlaceholderParameter. A
    subclass of its own keeps its class (and its reads stay unchecked): its layout, methods and
    __torch_function__ are its own."""
    if type(param) is torch.nn.Parameter:
        try:
            param.__class__ = PlaceholderParameter
        except TypeError as e:  # a torch whose tensors refuse it: say what is not checked
            warnings.warn(f"strata.torch: cannot mark offloaded parameters on torch "
                          f"{torch.__version__} ({e}): a parameter read outside its module "
                          "reads NaN without an error", RuntimeWarning, stacklevel=2)


def unmark(param):
    """Its module acquired it (or Strata lets it go): an nn.Parameter again."""
    if type(param) is PlaceholderParameter:
        param.__class__ = torch.nn.Parameter
