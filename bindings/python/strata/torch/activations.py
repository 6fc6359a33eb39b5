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

A tensor saved again with the same values (one input saved by each of q, k and v's projections,
or a view of it that starts at the same address) shares the bytes packed the first time, as
torch shares them when it keeps the tensor itself: the same address, size and layout, the same
version (no in-place write between the saves), and a storage still alive (a freed one's address
can hold other values by the second save). The second save copies nothing.
"""

import weakref

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .. import _lib
from ..errors import StrataError
from . import _views

# Below this, a saved tensor stays with torch (biases, norms' statistics, indices): a Strata
# tensor costs a registration, a 4 KiB-rounded pinned buffer and an NVMe extent.
DEFAULT_MIN_BYTES = 64 << 10


class _SavedBytes:
    """The values of one saved tensor, in logical order, held by Strata in chunks (Strata
    tensors of at most chunk_bytes each); shared by every save of those values, and gone when
    the last of them is."""

    __slots__ = ("chunks", "nbytes", "index", "pinned_bytes", "saves", "unpacked", "device_copy",
                 "__weakref__")

    def __init__(self, chunks, nbytes, index, pinned_bytes=0):
        self.chunks, self.nbytes, self.index = chunks, nbytes, index
        self.pinned_bytes = pinned_bytes  # what its chunks hold of the pool, kept there
        self.saves = 1  # the saves that share these bytes
        self.unpacked = 0  # unpacks so far
        # The bytes back on the compute device while saves sharing them are still to unpack.
        self.device_copy = None


def check_unmodified(tensor, saved_version):
    """Torch's own check that a saved tensor was not written in place before backward used it,
    which torch skips for every tensor a saved-tensors hook packs (it cannot see through the
    hook): without it, such a write would give a gradient of other values without an error. The
    same RuntimeError as torch's."""
    if tensor is not None and tensor._version != saved_version:
        raise RuntimeError(
            f"one of the variables needed for gradient computation has been modified by an "
            f"inplace operation: [{tensor.type()} {list(tensor.shape)}] is at version "
            f"{tensor._version}; expected version {saved_version} instead (strata.torch checks "
            f"this for the tensors autograd saves through it, as torch does without hooks)")


class SavedActivation:
    """One saved tensor as autograd holds it: its bytes (shared with other saves of the same
    values), its own shape, strides and dtype, and a weak reference to the tensor saved with
    its version then: while that tensor lives, a write to it in place is seen at unpack, as
    torch sees it (once it is gone, nothing can write to it)."""

    __slots__ = ("saved_bytes", "shape", "stride", "dtype", "device", "source", "version")

    def __init__(self, saved_bytes, t):
        self.saved_bytes = saved_bytes
        self.shape, self.stride, self.dtype = tuple(t.shape), tuple(t.stride()), t.dtype
        self.device = t.device
        self.source, self.version = weakref.ref(t), t._version

    @property
    def chunks(self):
        return self.saved_bytes.chunks


def _storage(t):
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def _values_key(t, nbytes):
    """Saves with equal keys and a live storage hold equal values: the same first byte, size and
    dtype, the same logical order (any shape of a contiguous tensor, else the same strides),
    and the same version counter (views share their base's: an in-place write to either
    changes it)."""
    layout = None if t.is_contiguous() else (tuple(t.shape), tuple(t.stride()))
    return (t.data_ptr(), nbytes, t.dtype, layout, t._version)


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


def whole_pages(nbytes):
    """The bytes a Strata pinned buffer of nbytes takes: its pool's size rule, whole 4 KiB pages."""
    return (nbytes + 4095) // 4096 * 4096


def pinned_pool_bytes(runtime):
    """The pinned pool tensors take room in: the pinned budget less the streaming staging."""
    stats = runtime.stats()
    return stats["pinned_budget_bytes"] - stats["pinned_staging_bytes"]


def _forget(chunks):
    for tensor in chunks:
        if not tensor.runtime.closed:
            tensor.unregister()


class ActivationOffload:
    """The saved activations of one OffloadedModel."""

    def __init__(self, runtime, device, home="nvme", min_bytes=DEFAULT_MIN_BYTES,
                 in_use=lambda: 0):
        self.configure(home, min_bytes)
        self.runtime = runtime
        self.device = device
        # A saved tensor moves in chunks of an eighth of the pinned budget (4 KiB multiples,
        # 64 KiB to 16 MiB): an attention score matrix can exceed the whole budget, and each
        # chunk needs a pinned buffer of its own size on its way to NVMe and back.
        budget = runtime.stats()["pinned_budget_bytes"]
        self.chunk_bytes = max(64 << 10, min(16 << 20, budget // 8 // 4096 * 4096))
        # Kept in pinned memory (home "pinned"), chunks stay in the pool until autograd drops
        # them. Past what the pool holds, a pack would wait for room only its own layer's release
        # could make, until the acquire's 300 s timeout: counted here to fail at once instead.
        self.pinned_pool_bytes = pinned_pool_bytes(runtime)
        self.pinned_held_bytes = 0
        self._in_use = in_use  # the pool's bytes the model's parameters in use hold now
        self._count = 0
        self._live = {}  # index -> weakref to _SavedBytes, in packing order
        # values key -> (StorageWeakRef of the source, weakref to its _SavedBytes)
        self._by_values = {}
        self.saves = 0  # tensors packed since creation, shared ones included
        self.packed_bytes = 0  # since creation: bytes copied into Strata
        self.shared_bytes = 0  # since creation: bytes of saves that shared bytes packed before
        # Since creation: bytes of unpacks served by the copy an earlier unpack of the same bytes
        # kept (saves sharing bytes), not read from Strata again.
        self.reused_bytes = 0
        self.held_bytes = 0  # now: packed and not yet collected by autograd
        self.peak_held_bytes = 0
        # Backward's order of unpacks, learned pass by pass (a forward and its backward) so that
        # the hint names the tensor unpacked next: autograd runs a layer's nodes in an order of
        # its own, not the reverse of the saves' (several pairs of a layer's saves come back
        # swapped), and a hint that names the wrong tensor is a read the next acquire evicts.
        self._pass_start = 0  # index of the current pass's first pack
        self._unpacking = False  # an unpack since the last pack: the next pack starts a pass
        self._pass_unpacks = []  # this pass's first unpacks, as indexes from its first pack
        self._learned = None  # (packs, order, position in order) of the last complete pass
        self.learned_hints = 0  # since creation: unpacks hinted from the learned order

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
        key = _values_key(t, nbytes)
        self.saves += 1
        known = self._by_values.get(key)
        if known is not None:
            source, saved_bytes = known[0], known[1]()
            if saved_bytes is not None and not source.expired():
                self.shared_bytes += nbytes
                saved_bytes.saves += 1
                return SavedActivation(saved_bytes, t)
        saved_bytes = self._copy_in(t, nbytes)
        weakref.finalize(saved_bytes, self._dropped, saved_bytes.index, nbytes,
                         saved_bytes.chunks, key, saved_bytes.pinned_bytes)
        self._by_values[key] = (StorageWeakRef(_storage(t)), weakref.ref(saved_bytes))
        return SavedActivation(saved_bytes, t)

    def _copy_in(self, t, nbytes):
        index = self._count
        if self._unpacking:
            self._learn_pass(index)
        self._count += 1
        # A permuted layout is copied in logical order; unpack restores its strides.
        flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
        pinned_bytes = 0
        if self.home == "pinned":
            pinned_bytes = sum(whole_pages(min(self.chunk_bytes, nbytes - offset))
                               for offset in range(0, nbytes, self.chunk_bytes))
            in_use = self._in_use()
            if self.pinned_held_bytes + pinned_bytes + in_use > self.pinned_pool_bytes:
                raise StrataError(
                    _lib.E_PINNED_BUDGET,
                    f"activations='pinned': the saved activations kept in pinned memory need "
                    f"{self.pinned_held_bytes + pinned_bytes} bytes ({self.pinned_held_bytes} "
                    f"held, {pinned_bytes} for this tensor) beside {in_use} of parameters in "
                    f"use there, more than the pinned pool's {self.pinned_pool_bytes} "
                    f"(pinned_budget_bytes less the staging buffers): raise pinned_budget_bytes "
                    f"(`strata plan --activation-offload pinned --offload nvme` gives the figure "
                    f"for a model) or use activations='nvme'")
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
        saved_bytes = _SavedBytes(chunks, nbytes, index, pinned_bytes)
        self.pinned_held_bytes += pinned_bytes
        self._live[index] = weakref.ref(saved_bytes)
        self.packed_bytes += nbytes
        self.held_bytes += nbytes
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)
        return saved_bytes

    def _dropped(self, index, nbytes, chunks, key, pinned_bytes):
        _forget(chunks)
        self.pinned_held_bytes -= pinned_bytes
        self._live.pop(index, None)
        known = self._by_values.get(key)
        if known is not None and known[1]() is None:
            del self._by_values[key]
        self.held_bytes -= nbytes

    def unpack(self, saved):
        check_unmodified(saved.source(), saved.version)
        # Saves that share bytes come back from one copy, as torch keeps the one tensor they all
        # saved: the first unpack copies the bytes back, and the copy stays on the compute device
        # for the saves still to unpack (q, k and v's nodes run one after the other), then goes.
        # Each unpack copying on its own cost a blocking copy per save (on a GPU, time the stream
        # computes nothing) and, where the pool had needed the room in between, a second read.
        saved_bytes = saved.saved_bytes
        flat = saved_bytes.device_copy
        if flat is None:
            flat = self._copy_out(saved_bytes, saved.device)
        else:
            self.reused_bytes += saved_bytes.nbytes
        saved_bytes.unpacked += 1
        saved_bytes.device_copy = flat if saved_bytes.unpacked < saved_bytes.saves else None
        logical = flat.view(saved.dtype).view(saved.shape)
        if saved.stride == logical.stride():
            return logical
        out = torch.empty_strided(saved.shape, saved.stride, dtype=saved.dtype,
                                  device=saved.device)
        return out.copy_(logical)

    def _learn_pass(self, next_start):
        """The pass that began at _pass_start is over (a pack after its unpacks): its order of
        unpacks is the one the next pass of as many packs is hinted by."""
        order = self._pass_unpacks
        if order:
            position = {relative: k for k, relative in enumerate(order)}
            self._learned = (next_start - self._pass_start, order, position)
        self._pass_start, self._unpacking, self._pass_unpacks = next_start, False, []

    def _copy_out(self, saved_bytes, device):
        self._unpacking = True
        relative = saved_bytes.index - self._pass_start
        if relative >= 0:
            self._pass_unpacks.append(relative)
        if not self._prefetch_learned(relative):
            self._prefetch_before(saved_bytes.index)
        flat = torch.empty(saved_bytes.nbytes, dtype=torch.uint8, device=device)
        offset = 0
        for tensor in saved_bytes.chunks:
            acq = tensor.acquire("pinned")
            try:
                view = _views.as_tensor(acq, torch.uint8, (tensor.nbytes,), torch.device("cpu"))
                flat[offset:offset + tensor.nbytes].copy_(view)
            finally:
                acq.release()
            offset += tensor.nbytes
        return flat

    def _alive(self, index):
        """The _SavedBytes packed as index, while autograd still holds it."""
        ref = self._live.get(index)
        return ref() if ref is not None else None

    def _hint(self, candidates):
        """Hints the chunks of candidates (_SavedBytes, in the order they will be unpacked)
        toward pinned memory, up to an eighth of the pool (at least one chunk). More is read
        before the pool has room for it beside the chunks being unpacked: the next acquire's
        room then evicts it, and it is read twice (a 16 MiB budget read 1.5-1.7x what it wrote,
        hinting whole tensors)."""
        room, hinted = max(self.pinned_pool_bytes // 8, self.chunk_bytes), 0
        for saved_bytes in candidates:
            for tensor in saved_bytes.chunks:
                if hinted + tensor.nbytes > room:
                    return
                tensor.prefetch("pinned")
                hinted += tensor.nbytes

    def _prefetch_learned(self, relative):
        """Hints the chunks the last pass unpacked after this one, in its order, up to the
        hint room. Only where this pass packed as many tensors as that one (the same shapes,
        the same graph): otherwise the learned order names other tensors."""
        learned = self._learned
        if learned is None or learned[0] != self._count - self._pass_start:
            return False
        _, order, position = learned
        at = position.get(relative)
        if at is None:
            return False
        self.learned_hints += 1
        following = (self._alive(self._pass_start + k) for k in order[at + 1:at + 9])
        self._hint(s for s in following if s is not None)
        return True

    def _prefetch_before(self, index):
        """With no learned order (the first pass, or a pass of other shapes), backward unpacks
        in about the reverse of packing order: bring the activation packed just before this one
        toward pinned memory while this one is used, its first chunks up to the hint room."""
        for earlier in range(index - 1, max(-1, index - 8), -1):
            saved_bytes = self._alive(earlier)
            if saved_bytes is not None:
                self._hint([saved_bytes])
                return
