"""The class of an offloaded parameter while its .data is the placeholder: reads refused in forward.

Between its module's uses a parameter's .data is a placeholder over one NaN element (offload.py,
_make_placeholder). Code that reads a parameter without calling the module that owns it
(F.linear(h, model.embed.weight) for a tied head, weight_norm's pre-hook when it runs before
Strata's, a parent adding a child's bias) computes with that NaN. In training the saved-tensors
hook refuses it when autograd saves the placeholder, but an operation that saves nothing (an
addition) or any read under torch.no_grad() (evaluation, generation) gave NaN, or a number
computed from NaN, without a word.

So while its .data is the placeholder a parameter's class is PlaceholderParameter (a subclass of
nn.Parameter: isinstance, the module's _parameters and the optimizer's references are
unchanged), whose __torch_function__ refuses an operation on it during its model's forward.
Only operations given a placeholder pay for the check: once its module acquires the parameter
its class is nn.Parameter again, whose operations never reach Python. Operations that read only
a tensor's description (shape, dtype, device, requires_grad, .data...) are let through, so
shape-based code still works; outside the model's forward (model.to(device), a count of
parameters) nothing changes: there a value read is the placeholder's NaN, as documented.

torch's own lazy modules do the same (torch/nn/parameter.py: UninitializedParameter refuses
operations in its __torch_function__, and materialize() sets __class__ to Parameter).
"""
import warnings

import torch

# Tensor methods and properties that do not read the values.
_DESCRIPTION_ONLY = frozenset({
    "shape", "size", "dim", "ndim", "ndimension", "numel", "nelement", "dtype", "device",
    "layout", "is_cuda", "is_cpu", "is_meta", "is_sparse", "is_quantized", "is_floating_point",
    "is_complex", "is_signed", "element_size", "itemsize", "stride", "is_contiguous",
    "storage_offset", "data_ptr", "requires_grad", "requires_grad_", "is_leaf", "grad",
    "grad_fn", "data", "names", "_version", "__len__", "__hash__", "__repr__", "__format__",
    "__reduce_ex__", "retains_grad", "get_device", "name", "output_nr", "_base", "_is_view",
    "is_inference", "is_nested", "register_hook", "_backward_hooks", "__class__",
})


def _name(func):
    name = getattr(func, "__name__", "")
    if name in ("__get__", "__set__", "__delete__"):  # a property: Tensor.shape.__get__
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    return name


class PlaceholderParameter(torch.nn.Parameter):
    """A parameter whose memory is in Strata (never constructed: an nn.Parameter's class is set
    to it while its .data is the placeholder, and set back when its module acquires it)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _name(func) not in _DESCRIPTION_ONLY:
            refusal = _refusal(func, args) or _refusal(func, kwargs.values())
            if refusal is not None:
                raise refusal
        # nn.Parameter's own: the operation on the plain tensor, as for any parameter.
        return torch._C._disabled_torch_function_impl(func, types, args, kwargs)


def mark(param):
    """A plain nn.Parameter whose .data is now its placeholder becomes a PlaceholderParameter. A
    subclass of its own keeps its class (and its reads stay unchecked): its layout, methods and
    __torch_function__ are its own."""
    if type(param) is torch.nn.Parameter:
        try:
            param.__class__ = PlaceholderParameter
        except TypeError as e:  # a torch whose tensors refuse it: say what is not checked
            warnings.warn(f"strata.torch: cannot mark offloaded parameters on torch "
                          f"{torch.__version__} ({e}): a parameter read outside its module under "
                          "torch.no_grad() reads NaN without an error", RuntimeWarning,
                          stacklevel=2)


def unmark(param):
    """Its module acquired it (or Strata lets it go): an nn.Parameter again."""
    if type(param) is PlaceholderParameter:
        param.__class__ = torch.nn.Parameter


def _refusal(func, values):
    for value in values:
        if isinstance(value, PlaceholderParameter):
            rec = getattr(value, "_strata", None)
            owner = rec.owner() if rec is not None and rec.owner is not None else None
            if owner is not None and owner._in_forward and not owner._in_own_hook and \
                    owner._placeholder_of(value) is rec:
                return owner._read_outside_its_module(rec, _name(func) or str(func))
        elif isinstance(value, (list, tuple)):  # torch.cat([h, w]), torch.stack
            refusal = _refusal(func, value)
            if refusal is not None:
                return refusal
    return None
