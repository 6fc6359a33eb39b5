"""Activation offload (issue 22, point 3): the tensors autograd saves for backward go into
Strata - pinned memory, spilled to NVMe under pressure - and come back, in reverse order, when
backward unpacks them. The bytes come back exactly, so gradients are those without offload.

    handle = strata.torch.offload(model, nvme_path, activations="nvme")

OffloadedModel's saved-tensors hooks (torch.autograd.graph.saved_tensors_hooks, which the
forward of the offloaded model enters) call pack / unpack here for every saved tensor that is
not a parameter's memory. A saved tensor smaller than min_bytes, one whose elements overlap
or leave gaps (an expanded or sliced view: its bytes are not its values), or a parameter stays
with torch. A dense tensor in another layout (a transposed q or k) comes back in its own
strides.
"""

import weakref

import torch

from .. import _lib
from ..errors import StrataError
from . import _views

# Below this, a saved tensor stays with torch (biases, norms' statistics, indices): a Strata
# tensor costs a registration, a 4 KiB-rounded pinned buffer and an NVMe extent.
DEFAULT_MIN_BYTES = 64 << 10


class SavedActivation:
    """A saved tensor held by Strata in chunks (Strata tensors of at most chunk_bytes each),
    which go when autograd drops this."""

    __slots__ = ("chunks", "nbytes", "shape", "stride", "dtype", "device", "index",
                 "__weakref__")

    def __init__(self, chunks, nbytes, shape, stride, dtype, device, index):
        self.chunks, self.nbytes, self.shape, self.stride = chunks, nbytes, shape, stride
        self.dtype, self.device, self.index = dtype, device, index


def _dense(t):
    """Whether t's elements fill a span of its storage exactly once, in some order of its
    dimensions (a permutation of a contiguous tensor): then its values are numel elements."""
    if t.is_contiguous():
        return True
    expected = 1
    for size, stride in sorted(((s, st) for s, st in zip(t.shape, t.stride()) if s != 1),
                               key=lambda d: d[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _forget(chunks):
    for tensor in chunks:
        if not tensor.runtime.closed:
            tensor.unregister()


class ActivationOffload:
    """The saved activations of one OffloadedModel."""

    def __init__(self, runtime, device, home="nvme", min_bytes=DEFAULT_MIN_BYTES):
        self.configure(home, min_bytes)
        self.runtime = runtime
        self.device = device
        # A saved tensor moves in chunks of an eighth of the pinned budget (4 KiB multiples,
        # 64 KiB to 16 MiB): an attention score matrix can exceed the whole budget, and each
        # chunk needs a pinned buffer of its own size on its way to NVMe and back.
        budget = runtime.stats()["pinned_budget_bytes"]
        self.chunk_bytes = max(64 << 10, min(16 << 20, budget // 8 // 4096 * 4096))
        self._count = 0
        self._live = {}  # index -> weakref to SavedActivation, in packing order
        self.packed_bytes = 0  # since creation
        self.held_bytes = 0  # now: packed and not yet collected by autograd
        self.peak_held_bytes = 0

    def configure(self, home, min_bytes):
        """Where the next saved tensors go, and the smallest that goes; turns it on."""
        if home not in ("nvme", "pinned"):
            raise StrataError(_lib.E_INVALID, f"activations home {home!r}: 'nvme' or 'pinned'")
        if int(min_bytes) < 1:
            raise StrataError(_lib.E_INVALID, f"activations min_bytes {min_bytes}: must be >= 1")
        self.home, self.min_bytes, self.enabled = home, int(min_bytes), True

    def wanted(self, t):
        return (isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter)
                and t.device == self.device and t.layout == torch.strided
                and t.numel() * t.element_size() >= self.min_bytes and _dense(t))

    def pack(self, t):
        nbytes = t.numel() * t.element_size()
        index = self._count
        self._count += 1
        # A permuted layout is copied in logical order; unpack restores its strides.
        flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
        chunks = []
        try:
            for offset in range(0, nbytes, self.chunk_bytes):
                size = min(self.chunk_bytes, nbytes - offset)
                tensor = self.runtime.register(f"activation.{index}.{len(chunks)}", size, "u8",
                                               "activation_checkpoint", -1, self.home)
                chunks.append(tensor)
                acq = tensor.acquire("pinned", discard=True)
                try:
                    view = _views.as_tensor(acq, torch.uint8, (size,), torch.device("cpu"))
                    view.copy_(flat[offset:offset + size])
                finally:
                    acq.release(dirty=True, stream=_views.stream_pointer(self.device))
        except BaseException:
            _forget(chunks)
            raise
        saved = SavedActivation(chunks, nbytes, tuple(t.shape), tuple(t.stride()), t.dtype,
                                t.device, index)
        weakref.finalize(saved, self._dropped, index, nbytes, chunks)
        self._live[index] = weakref.ref(saved)
        self.packed_bytes += nbytes
        self.held_bytes += nbytes
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)
        return saved

    def _dropped(self, index, nbytes, chunks):
        _forget(chunks)
        self._live.pop(index, None)
        self.held_bytes -= nbytes

    def unpack(self, saved):
        self._prefetch_before(saved.index)
        logical = torch.empty(saved.shape, dtype=saved.dtype, device=saved.device)
        flat = logical.reshape(-1).view(torch.uint8)
        offset = 0
        for tensor in saved.chunks:
            acq = tensor.acquire("pinned")
            try:
                view = _views.as_tensor(acq, torch.uint8, (tensor.nbytes,), torch.device("cpu"))
                flat[offset:offset + tensor.nbytes].copy_(view)
            finally:
                acq.release()
            offset += tensor.nbytes
        if saved.stride == logical.stride():
            return logical
        out = torch.empty_strided(saved.shape, saved.stride, dtype=saved.dtype,
                                  device=saved.device)
        return out.copy_(logical)

    def _prefetch_before(self, index):
        """Backward unpacks in about the reverse of packing order: bring the activation packed
        just before this one toward pinned memory while this one is used."""
        for earlier in range(index - 1, max(-1, index - 8), -1):
            ref = self._live.get(earlier)
            saved = ref() if ref is not None else None
            if saved is not None:
                for tensor in saved.chunks:
                    tensor.prefetch("pinned")
                return
