"""Strata for PyTorch.

    model = build_model()
    offloaded = strata.torch.offload(model, nvme_path="/mnt/nvme")
    optimizer = strata.torch.AdamW(model.parameters(), lr=1e-4)
    for batch in data:
        loss = loss_fn(model(batch))
        loss.backward()          # gradients go to Strata layer by layer
        optimizer.step()         # Strata's AdamW over states on NVMe
        optimizer.zero_grad()

See docs/pytorch.md.
"""
from . import _intercept
from ._views import as_tensor
from .allocator import allocator_support, use_strata_allocator
from .offload import OffloadedModel, offload, save_full_state_dict
from .optim import AdamW

_intercept.install()

__all__ = ["AdamW", "OffloadedModel", "allocator_support", "as_tensor", "offload",
           "save_full_state_dict", "use_strata_allocator"]
