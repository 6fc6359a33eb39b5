"""LoRA adapters (Hu et al. 2021) for strata.torch, written for this project (peft is not
packaged in Debian; docs/pytorch.md, "LoRA and QLoRA").

    model = strata.torch.lora.apply(model, rank=16, alpha=32, targets=("q_proj", "v_proj"))
    handle = strata.torch.offload(model, nvme_path)      # the frozen base streams from NVMe
    opt = strata.torch.AdamW(strata.torch.lora.trainable(model), lr=2e-4)

apply() wraps each targeted nn.Linear in a LoRALinear and freezes every other parameter, as
peft's get_peft_model does: only the adapters train. offload() then registers the frozen
weights read-only (STRATA_TENSOR_READ_ONLY): streamed from NVMe in forward and backward, never
written back, without gradient or optimizer state.
"""

import math

import torch

from ..errors import StrataError
from .. import _lib


class LoRALinear(torch.nn.Module):
    """y = base(x) + (dropout(x) @ A^T @ B^T) * alpha / rank, with base frozen.

    A (rank x in) starts Kaiming-uniform and B (out x rank) at zero, so the wrapped layer starts
    equal to the base (the LoRA paper's initialisation)."""

    def __init__(self, base, rank, alpha=None, dropout=0.0):
        super().__init__()
        if not isinstance(base, torch.nn.Linear):
            raise StrataError(_lib.E_INVALID, f"LoRALinear wraps an nn.Linear, not "
                                              f"{type(base).__name__}")
        if int(rank) <= 0:
            raise StrataError(_lib.E_INVALID, f"LoRA rank {rank}: must be >= 1")
        self.base = base
        self.rank = int(rank)
        self.alpha = float(self.rank if alpha is None else alpha)
        self.scaling = self.alpha / self.rank
        self.dropout = torch.nn.Dropout(dropout) if dropout else torch.nn.Identity()
        dtype, device = base.weight.dtype, base.weight.device
        self.lora_A = torch.nn.Parameter(torch.empty(self.rank, base.in_features, dtype=dtype,
                                                     device=device))
        self.lora_B = torch.nn.Parameter(torch.zeros(base.out_features, self.rank, dtype=dtype,
                                                     device=device))
        torch.nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        for p in self.base.parameters():
            p.requires_grad_(False)

    def forward(self, x):
        update = torch.nn.functional.linear(
            torch.nn.functional.linear(self.dropout(x), self.lora_A), self.lora_B)
        return self.base(x) + update * self.scaling


def apply(model, rank=16, alpha=None, targets=None, dropout=0.0):
    """Wraps the nn.Linear modules of model whose attribute name is in targets (None: every
    nn.Linear, QLoRA's "all-linear") in LoRALinear, in place, and freezes every parameter that
    is not an adapter's. Returns model. Raises when no module matched: a typo in targets would
    otherwise train nothing."""
    wanted = None if targets is None else set(targets)
    replaced = 0
    for parent in list(model.modules()):
        if isinstance(parent, LoRALinear):
            continue
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear) and (wanted is None or name in wanted):
                setattr(parent, name, LoRALinear(child, rank, alpha, dropout))
                replaced += 1
    if replaced == 0:
        raise StrataError(_lib.E_INVALID, f"no nn.Linear named {sorted(wanted or [])} in the "
                                          "model: nothing to adapt")
    for module in model.modules():
        adapter = {id(module.lora_A), id(module.lora_B)} if isinstance(module, LoRALinear) \
            else set()
        for p in module.parameters(recurse=False):
            if id(p) not in adapter:
                p.requires_grad_(False)
    return model


def trainable(model):
    """The parameters that require grad (the adapters after apply): what the optimizer takes."""
    return [p for p in model.parameters() if p.requires_grad]
