"""strata.torch: offload hooks and AdamW against plain PyTorch, on the CPU (Strata's host-emulated
device) or on CUDA when torch has it."""
import copy

import pytest
import torch

import strata
import strata.torch as st
from conftest import SMALL, paired_step
from tiny_llama import PRESETS, Llama, batches, corpus_bytes, loss_fn

DEVICE = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
STEPS = 20
REL = 1e-5


def small_llama(seed=0, layers=2):
    torch.manual_seed(seed)
    c = PRESETS["tinyllama-1.1b"].scaled(64, layers, vocab_size=256, max_positions=64)
    return Llama(c)


@pytest.fixture(scope="module")
def data():
    return [(x.to(DEVICE), y.to(DEVICE))
            for x, y in batches(corpus_bytes(), STEPS, batch=4, seq=32, seed=1)]


def train_step(model, opt, x, y, clip=None):
    """One step; clip: torch's clip_grad_norm_ before it (a torch optimizer's reference)."""
    loss = loss_fn(model(x), y)
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    opt.zero_grad()
    return loss.item()


def torch_losses(model, data, steps, sched=None, **adamw):
    model = model.to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), **adamw)
    scheduler = sched(opt) if sched else None
    out = []
    for x, y in data[:steps]:
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if scheduler:
            scheduler.step()
        out.append(loss.item())
    return out, opt


def strata_losses(model, data, steps, nvme_dir, sched=None, **adamw):
    offloaded = st.offload(model, nvme_path=nvme_dir, device=DEVICE, **SMALL)
    opt = st.AdamW(model.parameters(), **adamw)
    scheduler = sched(opt) if sched else None
    out = []
    for x, y in data[:steps]:
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if scheduler:
            scheduler.step()
        out.append(loss.item())
    return out, opt, offloaded


def assert_close(ours, theirs):
    assert len(ours) == len(theirs)
    for step, (a, b) in enumerate(zip(ours, theirs)):
        assert abs(a - b) <= REL * abs(b), f"step {step}: strata {a!r} vs torch {b!r}"


def test_twenty_steps_match_torch_adamw(data, nvme_dir):
    reference = small_llama()
    model = copy.deepcopy(reference)
    theirs, _ = torch_losses(reference, data, STEPS, lr=3e-3, weight_decay=0.1)
    ours, _, offloaded = strata_losses(model, data, STEPS, nvme_dir, lr=3e-3, weight_decay=0.1)
    assert_close(ours, theirs)
    assert theirs[-1] < theirs[0] - 0.5  # it learns: the comparison is not between constants
    # Between steps no parameter holds memory on the torch side, and no gradient either.
    # (A parameter's .data is then its shape over a single element.)
    for p in model.parameters():
        storage = p.untyped_storage() if hasattr(p, "untyped_storage") else p.storage()
        assert storage.nbytes() == p.element_size() and p.grad is None
    offloaded.close()
    for a, b in zip(model.parameters(), reference.parameters()):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_lr_scheduler_and_param_groups_reach_strata(data, nvme_dir):
    # Decided before offload, by name (test_torch_habits.py groups by p.dim() after it).
    matrices = {n for n, p in small_llama(seed=3).named_parameters() if p.dim() > 1}

    def groups(model):
        decay = [p for n, p in model.named_parameters() if n in matrices]
        no_decay = [p for n, p in model.named_parameters() if n not in matrices]
        return [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]

    def sched(opt):
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))

    reference = small_llama(seed=3)
    model = copy.deepcopy(reference)
    ref_opt = torch.optim.AdamW(groups(reference.to(DEVICE)), lr=3e-3)
    ref_sched = sched(ref_opt)
    st.offload(model, nvme_path=nvme_dir, device=DEVICE, **SMALL)
    opt = st.AdamW(groups(model), lr=3e-3)
    opt_sched = sched(opt)
    for x, y in data[:6]:
        losses = []
        for m, o, s in ((reference, ref_opt, ref_sched), (model, opt, opt_sched)):
            loss = loss_fn(m(x), y)
            loss.backward()
            o.step()
            o.zero_grad()
            s.step()
            losses.append(loss.item())
        assert_close([losses[1]], [losses[0]])
    # Pushed at step(): the sixth step ran with the lr after five scheduler steps.
    assert opt.runtime.optimizer_get_group(1)["lr"] == pytest.approx(3e-3 / 6)
    assert opt.runtime.optimizer_get_group(1)["weight_decay"] == 0.0


def test_gradient_accumulation_over_micro_batches(data, nvme_dir):
    reference = small_llama(seed=4)
    model = copy.deepcopy(reference)
    ref_opt = torch.optim.AdamW(reference.to(DEVICE).parameters(), lr=1e-3)
    offloaded = st.offload(model, nvme_path=nvme_dir, device=DEVICE, **SMALL)
    opt = st.AdamW(model.parameters(), lr=1e-3)
    for step in range(2):
        for m in (reference, model):
            for x, y in data[2 * step:2 * step + 2]:
                (loss_fn(m(x), y) / 2).backward()
        grad = offloaded.gradient(model.lm_head.weight)
        torch.testing.assert_close(grad.to(DEVICE), reference.lm_head.weight.grad,
                                   rtol=1e-5, atol=1e-7)
        ref_opt.step()
        ref_opt.zero_grad()
        opt.step()
        opt.zero_grad()
    x, y = data[4]
    assert_close([loss_fn(model(x), y).item()], [loss_fn(reference(x), y).item()])


def test_optimizer_state_dict_round_trip(data, nvme_dir, tmp_path):
    reference = small_llama(seed=5)
    model = copy.deepcopy(reference)
    _, ref_opt = torch_losses(reference, data, 3, lr=3e-3)
    _, opt, offloaded = strata_losses(model, data, 3, nvme_dir, lr=3e-3)
    sd = opt.state_dict()
    # The same format and values as torch.optim.AdamW's.
    ref_sd = ref_opt.state_dict()
    assert sd["param_groups"][0]["params"] == ref_sd["param_groups"][0]["params"]
    assert sd["param_groups"][0]["lr"] == ref_sd["param_groups"][0]["lr"]
    for i, entry in ref_sd["state"].items():
        assert float(sd["state"][i]["step"]) == float(entry["step"]) == 3
        for key in ("exp_avg", "exp_avg_sq"):
            # On a GPU torch's AdamW is its CUDA kernel (fused multiply-adds) and Strata's the
            # CPU's: weights a rounding apart after a step give gradients a little apart, which
            # an element of exp_avg near zero shows as about 1e-9 absolute (measured on an
            # H200: 1.23e-9 at an element of 2.3e-7).
            torch.testing.assert_close(sd["state"][i][key].to(DEVICE), entry[key],
                                       rtol=1e-4, atol=1e-9 if DEVICE.type == "cpu" else 1e-8)
    weights = offloaded.state_dict()
    # A fresh model and optimizer loaded from both state dicts continue like the original.
    fresh = small_llama(seed=99)
    fresh_off = st.offload(fresh, nvme_path=nvme_dir, device=DEVICE, **SMALL)
    fresh_off.load_state_dict(weights)
    fresh_opt = st.AdamW(fresh.parameters(), lr=1.0)
    fresh_opt.load_state_dict(sd)
    assert fresh_opt.param_groups[0]["lr"] == 3e-3
    for x, y in data[3:6]:
        assert train_step(model, opt, x, y) == train_step(fresh, fresh_opt, x, y)
    # Strata's own checkpoint file round-trips too.
    path = tmp_path / "optimizer.ckpt"
    opt.save(str(path))
    fresh_opt.load(str(path))
    assert fresh_opt.runtime.optimizer_get_step() == opt.runtime.optimizer_get_step() == 6


def test_torch_adamw_state_loads_into_strata(data, nvme_dir):
    reference = small_llama(seed=6)
    _, ref_opt = torch_losses(reference, data, 3, lr=3e-3)
    model = copy.deepcopy(reference)
    st.offload(model, nvme_path=nvme_dir, device=DEVICE, **SMALL)
    opt = st.AdamW(model.parameters(), lr=3e-3)
    opt.load_state_dict(ref_opt.state_dict())
    for x, y in data[3:6]:
        losses = paired_step(((reference, ref_opt), (model, opt)), x, y)
        assert_close([losses[1]], [losses[0]])


def test_standalone_adamw_matches_torch(data, nvme_dir):
    reference = small_llama(seed=7).to(DEVICE)
    model = copy.deepcopy(reference)
    theirs, _ = torch_losses(reference, data, 5, lr=3e-3)
    opt = st.AdamW(model.parameters(), lr=3e-3, nvme_path=nvme_dir, **SMALL)
    ours = []
    for x, y in data[:5]:
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ours.append(loss.item())
    assert_close(ours, theirs)
    opt.close()


def test_errors_surface_as_strata_error(data, nvme_dir):
    model = small_llama(seed=8)
    st.offload(model, nvme_path=nvme_dir, device=DEVICE, **SMALL)
    opt = st.AdamW(model.parameters())
    with pytest.raises(strata.StrataError) as e:
        opt.step()  # no backward yet: no gradients
    assert e.value.name == "STRATA_E_STATE" and "no gradient" in e.value.message
    with pytest.raises(strata.StrataError) as e:
        st.offload(model, nvme_path=nvme_dir, device=DEVICE, **SMALL)
    assert "already offloaded" in e.value.message
    with pytest.raises(strata.StrataError) as e:
        st.offload(small_llama(), nvme_path=nvme_dir + "/missing", device=DEVICE)
    assert e.value.code == -1 and "missing" in e.value.message
    tiny = small_llama(seed=9)
    st.offload(tiny, nvme_path=nvme_dir, device=DEVICE, nvme_capacity_bytes=64 << 20,
               device_budget_bytes=16 << 10,  # below the embedding's 64 KiB
               compute_tier="device")  # on a CPU too: the (emulated) device tier
    with pytest.raises(strata.StrataError) as e:
        tiny(data[0][0])
    assert e.value.name == "STRATA_E_DEVICE_BUDGET"


def test_adamw_takes_the_optimizer_of_the_config_the_model_was_offloaded_with(data, nvme_dir):
    """DeepSpeed builds its optimizer from the config it is given: a config given to offload
    alone sets AdamW's settings too (before, AdamW trained with torch's defaults, silently), a
    setting given both ways differently is refused, and AdamW's own config may not set the
    runtime otherwise than the model's (docs/reliability.md, finding 49)."""
    ds = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95]}},
          "gradient_clipping": 0.05,
          "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}
    model = small_llama(seed=11)
    st.offload(model, nvme_path=nvme_dir, deepspeed_config=ds, device=DEVICE, **SMALL)
    with pytest.raises(strata.StrataError) as e:
        st.AdamW(model.parameters(), lr=5e-2)
    assert e.value.name == "STRATA_E_INVALID" and "lr=0.05" in e.value.message
    with pytest.raises(strata.StrataError) as e:
        st.AdamW(model.parameters(), deepspeed_config={**ds, "aio": {"queue_depth": 3}})
    assert "queue_depth" in e.value.message
    # The same config again (beside keywords offload took): accepted, as DeepSpeed users give it.
    twin = small_llama(seed=11)
    st.offload(twin, nvme_path=nvme_dir, deepspeed_config=ds, device=DEVICE, **SMALL)
    assert st.AdamW(twin.parameters(), deepspeed_config=ds).param_groups[0]["lr"] == 1e-2
    opt = st.AdamW(model.parameters())
    group = opt.param_groups[0]
    assert group["lr"] == 1e-2 and group["betas"] == (0.9, 0.95)
    assert group["weight_decay"] == 0.0  # DeepSpeed's default, the section has none
    # The same steps as torch.optim.AdamW with the config's settings and clip_grad_norm_.
    reference = small_llama(seed=11).to(DEVICE)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, betas=(0.9, 0.95),
                                weight_decay=0.0)
    for x, y in data[:2]:
        ours, theirs = train_step(model, opt, x, y), train_step(reference, ref_opt, x, y, 0.05)
        assert abs(ours - theirs) <= 1e-5 * abs(theirs)
    assert abs(loss_fn(model(data[2][0]), data[2][1]).item() -
               loss_fn(reference(data[2][0]), data[2][1]).item()) <= 1e-4


def test_deepspeed_config_drives_offload(data, nvme_dir):
    model = small_llama(seed=10)
    ds = {"zero_optimization": {"stage": 3,
                                "offload_param": {"device": "cpu", "pin_memory": True},
                                "offload_optimizer": {"device": "nvme", "nvme_path": nvme_dir}},
          "aio": {"block_size": 262144, "queue_depth": 8}}
    offloaded = st.offload(model, deepspeed_config=ds, device=DEVICE, **SMALL)
    assert offloaded.param_home == "pinned"
    assert offloaded.runtime.config.block_size == 262144
    x, y = data[0]
    loss_fn(model(x), y).backward()
    st.AdamW(model.parameters()).step()
    with pytest.raises(strata.StrataError):
        st.offload(small_llama(), deepspeed_config={"zero_optimization": {"stagee": 3}},
                   nvme_path=nvme_dir)
