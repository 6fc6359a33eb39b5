"""LoRA with the frozen base streamed from NVMe (issue 22, point 1): the base weights are
registered read-only, read from NVMe as the pinned budget forces them out, never written back;
only the adapters have gradients and optimizer states. Losses equal plain PyTorch's."""
import copy

import pytest
import torch

import strata
import strata.torch as st
from conftest import DEVICE, paired_step
from strata.torch import lora
from tiny_llama import PRESETS, Llama, batches, corpus_bytes, loss_fn

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
REL = 1e-5


def lora_llama(seed=0, hidden=256, layers=4):
    torch.manual_seed(seed)
    c = PRESETS["tinyllama-1.1b"].scaled(hidden, layers, vocab_size=256, max_positions=64)
    model = Llama(c)
    return lora.apply(model, rank=8, alpha=16, targets=TARGETS)


def nbytes(params):
    return sum(p.numel() * p.element_size() for p in params)


def train_paired(reference, ours, handle, data):
    """Trains the adapters of both models on data (torch's AdamW, Strata's), checking each step's
    losses agree; returns the NVMe bytes each step wrote."""
    ref_opt = torch.optim.AdamW(lora.trainable(reference), lr=3e-3)
    opt = st.AdamW(lora.trainable(ours), lr=3e-3)
    written = []
    for x, y in data:
        before = handle.runtime.stats()["nvme_bytes_written"]
        losses = paired_step(((reference, ref_opt), (ours, opt)), x, y)
        handle.runtime.sync()
        written.append(handle.runtime.stats()["nvme_bytes_written"] - before)
        assert abs(losses[0] - losses[1]) <= REL * abs(losses[0]), losses
    return written


# The adapters on NVMe (streamed as the base is), or at home in pinned memory with their
# gradients and optimizer states: then a step writes nothing at all to NVMe.
@pytest.mark.parametrize("trainable_home,pinned", [("nvme", 4 << 20), ("pinned", 5 << 20)])
def test_lora_on_a_streamed_frozen_base_matches_torch_and_never_writes_the_base(
        nvme_dir, trainable_home, pinned):
    reference = lora_llama(seed=4)
    ours = copy.deepcopy(reference)
    base = [p for p in reference.parameters() if not p.requires_grad]
    adapters = lora.trainable(reference)
    base_bytes, adapter_bytes = nbytes(base), nbytes(adapters)
    assert base_bytes > 20 * adapter_bytes  # a LoRA shape: the base dominates

    # The pinned budget holds under half of the base: it streams from NVMe every pass.
    assert pinned < base_bytes / 2
    # On a GPU the device budget is a cache too: the same size, so that it streams there as well.
    handle = st.offload(ours, nvme_path=nvme_dir, device=DEVICE, nvme_capacity_bytes=256 << 20,
                        pinned_budget_bytes=pinned, device_budget_bytes=pinned,
                        trainable_home=trainable_home)
    reference.to(DEVICE)
    assert handle.trainable_home == trainable_home
    ref_opt = torch.optim.AdamW(lora.trainable(reference), lr=3e-3)
    opt = st.AdamW(lora.trainable(ours), lr=3e-3)

    data = batches(corpus_bytes(), 8, batch=2, seq=32, seed=5)
    losses = ([], [])
    stats = []
    for x, y in data:
        for i, loss in enumerate(paired_step(((reference, ref_opt), (ours, opt)), x, y)):
            losses[i].append(loss)
        handle.runtime.sync()
        stats.append(handle.runtime.stats())
    for step, (a, b) in enumerate(zip(*losses)):
        assert abs(a - b) <= REL * abs(b), f"step {step}: strata {a} vs torch {b}"
    assert losses[1][-1] < losses[1][0]  # the adapters learn

    # Per step after the first (which loads nothing: the base was written at offload), NVMe
    # writes stay within the adapters' own state: parameter, gradient, master, m, v (fp32).
    adapter_state = 5 * adapter_bytes
    for before, after in zip(stats[1:], stats[2:]):
        written = after["nvme_bytes_written"] - before["nvme_bytes_written"]
        read = (after["nvme_bytes_read_by_kind"]["parameter"] -
                before["nvme_bytes_read_by_kind"]["parameter"])
        assert written <= (1.1 * adapter_state if trainable_home == "nvme" else 0), \
            (written, adapter_state)
        # forward and backward each read what the budget could not keep
        assert read >= base_bytes, (read, base_bytes)
    by_kind = stats[-1]["nvme_bytes_written_by_kind"]
    # Parameters written: the base once (at offload), the adapters at most once per step.
    assert by_kind["parameter"] <= base_bytes + adapter_bytes * (1 + len(data)) + 4096 * len(base)


def test_adapters_at_home_in_pinned_memory_never_reach_nvme_from_a_small_device(nvme_dir):
    """Computing on the device tier (on the CPU, the host-emulated device: the GPU code path),
    with a device budget that cannot keep the adapters' gradients between uses: what leaves the
    device goes home to pinned memory, never to NVMe (docs/reliability.md, finding 39: each step
    wrote the adapters and half their gradients to NVMe and read them back)."""
    reference = lora_llama(seed=4)
    ours = copy.deepcopy(reference)
    reference.to(DEVICE)
    handle = st.offload(ours, nvme_path=nvme_dir, device=DEVICE, compute_tier="device",
                        nvme_capacity_bytes=256 << 20, pinned_budget_bytes=5 << 20,
                        device_budget_bytes=5 << 20, trainable_home="pinned")
    written = train_paired(reference, ours, handle, batches(corpus_bytes(), 4, batch=2, seq=32,
                                                             seed=5))
    assert written[1:] == [0] * (len(written) - 1), written


def test_adapters_rest_in_pinned_memory_when_they_fit_a_quarter_of_the_budget(nvme_dir):
    def home(model, pinned, **kw):
        handle = st.offload(model, nvme_path=nvme_dir, device="cpu",
                            nvme_capacity_bytes=256 << 20, pinned_budget_bytes=pinned, **kw)
        try:
            return handle.trainable_home, handle.trainable_why, \
                {p._strata.tensor.home for p in lora.trainable(model)}
        finally:
            handle.close()

    # 0.58 MB of adapters: with gradients and 12 bytes per element of states, 2.9 MB.
    tiers = strata.runtime.TIERS
    assert home(lora_llama(), 16 << 20)[0::2] == ("pinned", {tiers["pinned"]})
    chosen, why, homes = home(lora_llama(), 8 << 20)
    assert (chosen, homes) == ("nvme", {tiers["nvme"]}) and "more than a quarter" in why
    chosen, why, _ = home(lora_llama(), 16 << 20, trainable_home="nvme")
    assert (chosen, why) == ("nvme", "asked")
    # Nothing frozen (full fine-tuning): param_home, whatever the sizes.
    torch.manual_seed(0)
    full = Llama(PRESETS["tinyllama-1.1b"].scaled(64, 1, vocab_size=256, max_positions=64))
    assert home(full, 64 << 20, param_home="nvme")[0] == "nvme"
    with pytest.raises(strata.StrataError, match="trainable_home='gpu'"):
        home(lora_llama(), 16 << 20, trainable_home="gpu")


def test_adapters_resting_on_the_device_tier_train_as_torch_and_write_nothing(nvme_dir):
    """compute_tier="device" on the CPU runs the host-emulated device, the GPU code path: the
    automatic trainable_home puts the adapters and their gradients there, their optimizer states
    in pinned memory, and the streamed base stays read-only."""
    reference = lora_llama(seed=6, hidden=64, layers=2)
    ours = copy.deepcopy(reference)
    reference.to(DEVICE)
    handle = st.offload(ours, nvme_path=nvme_dir, device=DEVICE, compute_tier="device",
                        nvme_capacity_bytes=256 << 20, pinned_budget_bytes=32 << 20,
                        device_budget_bytes=32 << 20)
    assert handle.trainable_home == "device", handle.trainable_why
    tiers = strata.runtime.TIERS
    assert {p._strata.tensor.home for p in lora.trainable(ours)} == {tiers["device"]}
    assert {p._strata.grad.home for p in lora.trainable(ours)} == {tiers["device"]}
    written = train_paired(reference, ours, handle, batches(corpus_bytes(), 4, batch=2, seq=16,
                                                             seed=7))
    assert written[1:] == [0] * (len(written) - 1), written


def test_the_frozen_base_refuses_writes_and_unfreezing_makes_it_trainable(nvme_dir):
    model = lora_llama(seed=1, hidden=64, layers=1)
    handle = st.offload(model, nvme_path=nvme_dir, device="cpu", nvme_capacity_bytes=64 << 20,
                        pinned_budget_bytes=32 << 20)
    weight = model.layers[0].self_attn.q_proj.base.weight
    rec = weight._strata
    assert rec.tensor.read_only and rec.grad is None
    acq = rec.tensor.acquire("pinned")
    with pytest.raises(strata.StrataError, match="read-only"):
        acq.release(dirty=True)
    acq.release()
    with pytest.raises(strata.StrataError, match="does not require grad"):
        st.AdamW([weight])

    # Unfrozen (as torch allows at any time), it gets a writable tensor with the same values.
    before = handle.parameter(weight)
    weight.requires_grad_(True)
    opt = st.AdamW(lora.trainable(model), lr=1e-2)
    assert not weight._strata.tensor.read_only
    assert torch.equal(handle.parameter(weight), before)
    x, y = batches(corpus_bytes(), 1, batch=2, seq=16, seed=2)[0]
    loss_fn(model(x), y).backward()
    opt.step()
    assert not torch.equal(handle.parameter(weight), before)


def test_apply_refuses_targets_that_match_nothing():
    torch.manual_seed(0)
    c = PRESETS["tinyllama-1.1b"].scaled(64, 1, vocab_size=256, max_positions=64)
    with pytest.raises(strata.StrataError, match="nothing to adapt"):
        lora.apply(Llama(c), targets=("qproj",))


def test_a_lora_layer_starts_equal_to_its_base():
    torch.manual_seed(0)
    linear = torch.nn.Linear(32, 16)
    x = torch.randn(4, 32)
    expected = linear(x)
    wrapped = lora.LoRALinear(linear, rank=4)
    assert torch.equal(wrapped(x), expected)
    assert not linear.weight.requires_grad and wrapped.lora_A.requires_grad
